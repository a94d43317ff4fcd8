"""Model definitions: BERT's family (bert.py with config.py, electra.py, spanbert.py) and ModernBERT
(modernbert.py); attention.py and rope.py serve both.

`model_config(values)` and `build(config)` go from a saved or configured "model" dict to the config object
and its Flax module: the dict's "family" picks ModernBERT, anything else is BertModel's family.
"""
from __future__ import annotations

from typing import Any, Mapping

from bert_jax.models.bert import BertModel, ModelOutput
from bert_jax.models.config import ModelConfig
from bert_jax.models.modernbert import ModernBertConfig, ModernBertModel

_BY_FAMILY = {"modernbert": (ModernBertConfig, ModernBertModel)}

__all__ = ["BertModel", "ModelConfig", "ModelOutput", "ModernBertConfig", "ModernBertModel", "build",
           "model_config"]


def model_config(values: Mapping[str, Any]):
  """The config object of a "model" dict (a run config's model section, or config.json's)."""
  config_class = _BY_FAMILY.get(values.get("family", ""), (ModelConfig,))[0]
  return config_class.from_dict(values)


def build(config):
  """The Flax module of `config` (BertModel for ModelConfig)."""
  return _BY_FAMILY.get(getattr(config, "family", ""), (None, BertModel))[1](config)
