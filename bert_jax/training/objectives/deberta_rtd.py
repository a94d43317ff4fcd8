"""DeBERTa-v3's pretraining (He et al. 2023): ELECTRA-style replaced-token detection with gradient-disentangled
embedding sharing (GDES), objective `deberta_rtd`.

A generator (a DebertaModel with the MLM head: the discriminator's width, `generator_layer_fraction` of its depth,
one half in the paper) fills the masked positions with samples; the discriminator (a DebertaModel with the RTD head)
tells replaced tokens from original ones at every real token. Loss = generator MLM + `disc_weight` (lambda = 50 in
the paper) x RTD, as ELECTRA's (objectives/electra.py, whose sums and metrics this reuses).

GDES: the two share the token embeddings E (the generator's table), but the RTD loss does not pull E: the
discriminator reads E_D = stop_gradient(E) + E_delta, its own E_delta initialised to zeros, so E learns from the MLM
loss alone and E_delta from the RTD loss alone (the paper's section 3.3; ELECTRA's plain sharing lets both losses
pull E, the "tug-of-war"). After pretraining the discriminator's table is E + E_delta (models/deberta.py:
`from_pretraining`, which conversion reads a pretraining run through). Only the word embeddings are shared (v3 has
no absolute positions); each network keeps its relative embeddings and embedding LayerNorm.

params = {"generator": <DebertaModel tree: E, layers, MLM head>,
          "discriminator": <DebertaModel tree: E_delta in place of the word table, layers, RTD head>}
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from bert_jax.errors import UserError
from bert_jax.models.bert import ModelOutput
from bert_jax.models.deberta import WORD_TABLE, DebertaConfig, DebertaModel, discriminator_tree, leaf, with_leaf
from bert_jax.training.objectives.base import HEAD_NAMES
from bert_jax.training.objectives.electra import ElectraPretraining
from bert_jax.training.objectives.registry import register

def generator_config(model: DebertaConfig, layer_fraction: float) -> DebertaConfig:
  """The paper's generator: the discriminator's width, `layer_fraction` of its layers, the MLM head."""
  return model.replace(num_layers=max(1, int(round(model.num_layers * layer_fraction))), mlm_head=True,
                       rtd_head=False)


def _split_rngs(rng: jax.Array | None) -> dict[str, Any] | None:
  return None if rng is None else {"dropout": rng}


@dataclasses.dataclass(frozen=True)
class DebertaRTD:
  """The generator/discriminator pair over one parameter tree, with GDES (functional: params are passed in)."""
  generator: DebertaModel
  discriminator: DebertaModel

  @classmethod
  def from_config(cls, model: DebertaConfig, layer_fraction: float) -> "DebertaRTD":
    return cls(generator=DebertaModel(generator_config(model, layer_fraction)),
               discriminator=DebertaModel(model.replace(mlm_head=False, rtd_head=True)))

  def init(self, rng: jax.Array, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """Both trees (boxed with their logical axes); the discriminator's word table is E_delta, zeros."""
    gen_rng, disc_rng = jax.random.split(rng)
    gen = self.generator.init({"params": gen_rng}, **inputs)["params"]
    disc = self.discriminator.init({"params": disc_rng}, **inputs)["params"]
    delta = leaf(disc, WORD_TABLE)
    zeros = (delta.replace_boxed(jnp.zeros_like(delta.unbox())) if isinstance(delta, nn.Partitioned)
             else jnp.zeros_like(delta))
    return {"generator": gen, "discriminator": with_leaf(disc, WORD_TABLE, zeros)}

  def run_generator(self, params: Mapping[str, Any], inputs: Mapping[str, Any], rng: jax.Array | None,
                    deterministic: bool) -> ModelOutput:
    return self.generator.apply({"params": params["generator"]}, **inputs, deterministic=deterministic,
                                rngs=_split_rngs(rng))

  def run_discriminator(self, params: Mapping[str, Any], inputs: Mapping[str, Any], rng: jax.Array | None,
                        deterministic: bool) -> ModelOutput:
    return self.discriminator.apply({"params": discriminator_tree(params)}, **inputs,
                                    deterministic=deterministic, rngs=_split_rngs(rng))


class DebertaRTDPretraining(ElectraPretraining):
  """Generator MLM + `disc_weight` x RTD over every real token, GDES between the two (module docstring).
  num_params (backbone) counts the discriminator, as the paper does."""

  def __init__(self, model_config: DebertaConfig, generator_layer_fraction: float, disc_weight: float):
    # pylint: disable=super-init-not-called  (ELECTRA's builds BertModels; the sums and metrics are shared)
    self.config = model_config
    self.model = DebertaRTD.from_config(model_config, generator_layer_fraction)
    self.disc_weight = disc_weight

  def backbone(self, params: Any) -> Any:
    """The discriminator without its head (its E_delta stands for the E + E_delta table: the same shape)."""
    return {k: v for k, v in params["discriminator"].items() if k not in HEAD_NAMES}


@register("deberta_rtd")
def from_config(config: ml_collections.ConfigDict, model_config) -> DebertaRTDPretraining:
  """DeBERTa-v3's RTD from a run config, after checking its `rtd` section and that the model is DeBERTa's."""
  if model_config.family != "deberta":
    raise UserError(f"objective='deberta_rtd' trains DeBERTa (model.family='deberta'), not "
                    f"model.family={model_config.family!r}; start from configs/deberta.py")
  if "rtd" not in config:
    raise UserError("objective='deberta_rtd' needs the config section `rtd` (generator_layer_fraction, disc_weight); "
                    "start from configs/deberta.py")
  return DebertaRTDPretraining(model_config, config.rtd.generator_layer_fraction, config.rtd.disc_weight)
