"""The objectives by name (a run config's `objective`): each objective's module registers a factory.

A new objective is one module in this package: its class, and a factory decorated with
`@register("name")` that checks the config keys it needs; the package's __init__ imports it. Only an
objective registered with `structural_inputs=True` (StructBERT's) may read shuffled trigrams or the 'sso'
builder's 3-way labels: `make_objective` refuses them for every other one.
"""
from __future__ import annotations

from typing import Callable

import ml_collections

from bert_jax.errors import UserError
from bert_jax.models import families
from bert_jax.models.config import ModelConfig
from bert_jax.training.objectives.base import PretrainingObjective, refuse_structbert_inputs

Factory = Callable[[ml_collections.ConfigDict, ModelConfig], PretrainingObjective]
_FACTORIES: dict[str, Factory] = {}
_STRUCTURAL: set[str] = set()
_BERT_MLM: list[str] = []


def register(name: str, structural_inputs: bool = False, bert_mlm: bool = False) -> Callable[[Factory], Factory]:
  """Decorator: `factory(config, model_config)` builds the objective `name`. bert_mlm: its model keeps BERT's
  MLM head, so its checkpoint can teach general distillation (compress/teacher.py)."""
  def add(factory: Factory) -> Factory:
    if name in _FACTORIES:
      raise ValueError(f"objective {name!r} is registered twice")
    _FACTORIES[name] = factory
    if structural_inputs:
      _STRUCTURAL.add(name)
    if bert_mlm:
      _BERT_MLM.append(name)
    return factory
  return add


def with_bert_mlm() -> tuple[str, ...]:
  """The objectives registered with bert_mlm=True."""
  return tuple(_BERT_MLM)


def make_objective(config: ml_collections.ConfigDict) -> PretrainingObjective:
  """The objective named by `config.objective`."""
  model_config = families.model_config(config.model.to_dict())
  if config.objective not in _FACTORIES:
    raise UserError(f"objective={config.objective!r} is not one of {tuple(_FACTORIES)}")
  if config.objective not in _STRUCTURAL:
    refuse_structbert_inputs(config)
  return _FACTORIES[config.objective](config, model_config)
