"""ELECTRA (Clark et al. 2020): an MLM generator and a replaced-token discriminator trained jointly.

Both networks are plain `BertModel`s, so each one's parameter tree is what a BERT-shaped checkpoint maps
onto: the discriminator is BertModel(rtd_head=True, no pooler, no MLM head, no sentence head), the
generator BertModel(mlm_head=True, no pooler, no sentence head) with a smaller hidden size. As in the
paper, the two share their token and position embeddings: those tables live only in the discriminator's
tree and are lent to the generator when it runs, so both losses train them. Token-type embeddings,
embedding LayerNorm and each network's E -> H projection stay separate.

params = {"discriminator": <BertModel tree>, "generator": <BertModel tree without the shared tables>}

Shapes: B batch, T length, P predictions, V vocab.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax
import jax.numpy as jnp

from bert_jax.models import batch_rows
from bert_jax.models.bert import BertModel, ModelOutput
from bert_jax.models.config import ModelConfig

SHARED_EMBEDDINGS = ("word_embeddings", "position_embeddings")


def discriminator_config(model: ModelConfig) -> ModelConfig:
  return model.replace(rtd_head=True, use_pooler=False, mlm_head=False, sentence_head="none")


def generator_config(model: ModelConfig, hidden_fraction: float, layer_fraction: float = 1.0
                     ) -> ModelConfig:
  """The paper's generator sizing (its get_generator_config): hidden x fraction, 64-wide heads, FFN 4H.

  The embedding width stays the discriminator's (the tables are shared); a projection E -> H follows.
  """
  hidden = int(round(model.hidden_size * hidden_fraction))
  return model.replace(hidden_size=hidden, num_heads=max(1, hidden // 64), intermediate_size=4 * hidden,
                       num_layers=max(1, int(round(model.num_layers * layer_fraction))),
                       embedding_size=model.embed_dim, rtd_head=False, use_pooler=False, mlm_head=True,
                       sentence_head="none")


def _split_rngs(rng: jax.Array | None) -> dict[str, Any] | None:
  return None if rng is None else {"dropout": rng}


@dataclasses.dataclass(frozen=True)
class Electra:
  """The generator/discriminator pair over one parameter tree (functional: params are passed in)."""
  generator: BertModel
  discriminator: BertModel

  @classmethod
  def from_config(cls, model: ModelConfig, hidden_fraction: float, layer_fraction: float = 1.0
                  ) -> "Electra":
    return cls(generator=BertModel(generator_config(model, hidden_fraction, layer_fraction)),
               discriminator=BertModel(discriminator_config(model)))

  def init(self, rng: jax.Array, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """Both trees (boxed with their logical axes); the generator's copy of the shared tables is dropped."""
    gen_rng, disc_rng = jax.random.split(rng)
    disc = self.discriminator.init({"params": disc_rng}, **inputs)["params"]
    gen = dict(self.generator.init({"params": gen_rng}, **inputs)["params"])
    gen["embeddings"] = {k: v for k, v in gen["embeddings"].items() if k not in SHARED_EMBEDDINGS}
    return {"discriminator": disc, "generator": gen}

  def generator_params(self, params: Mapping[str, Any]) -> dict[str, Any]:
    """The generator's full BertModel tree, with the discriminator's shared tables lent to it."""
    shared = {k: params["discriminator"]["embeddings"][k] for k in SHARED_EMBEDDINGS}
    gen = dict(params["generator"])
    gen["embeddings"] = {**gen["embeddings"], **shared}
    return gen

  def run_generator(self, params: Mapping[str, Any], inputs: Mapping[str, Any], rng: jax.Array | None,
                    deterministic: bool) -> ModelOutput:
    return self.generator.apply({"params": self.generator_params(params)}, **inputs,
                                deterministic=deterministic, rngs=_split_rngs(rng))

  def run_discriminator(self, params: Mapping[str, Any], inputs: Mapping[str, Any],
                        rng: jax.Array | None, deterministic: bool) -> ModelOutput:
    return self.discriminator.apply({"params": params["discriminator"]}, **inputs,
                                    deterministic=deterministic, rngs=_split_rngs(rng))


def sample_tokens(logits: jax.Array, rng: jax.Array) -> jax.Array:
  """One token per prediction from softmax(logits) (Gumbel-max); no gradient flows through the sample.

  logits: f32[B, P, V] -> int32[B, P].
  """
  # One key per row (batch_rows): the same sample for a row whichever device computes it.
  draw = lambda key, row: jax.random.categorical(key, row, axis=-1)  # noqa: E731
  return jax.vmap(draw)(batch_rows.row_keys(rng, logits.shape[0]), jax.lax.stop_gradient(logits)).astype(jnp.int32)


def replace_tokens(input_ids: jax.Array, positions: jax.Array, weights: jax.Array, originals: jax.Array,
                   samples: jax.Array) -> tuple[jax.Array, jax.Array]:
  """The discriminator's input and labels.

  input_ids: int32[B, T]; positions, originals (the true tokens), samples: int32[B, P]; weights: [B, P]
  (0 marks an unused slot, whose position must not be touched). Returns (ids, replaced): ids has the
  original token everywhere except at predicted positions, which hold the sample; replaced: f32[B, T]
  is 1 where the sample differs from the original (a sample equal to the original is not replaced).
  """
  at = jax.nn.one_hot(positions, input_ids.shape[1], dtype=jnp.int32) * (weights > 0)[..., None]
  predicted = jnp.sum(at, axis=1)  # [B, T], 0 or 1: positions are distinct among real predictions
  sampled = jnp.sum(at * samples[..., None], axis=1)
  original = jnp.sum(at * originals[..., None], axis=1)
  ids = jnp.where(predicted > 0, sampled, input_ids)
  replaced = (predicted > 0) & (sampled != original)
  return ids, replaced.astype(jnp.float32)
