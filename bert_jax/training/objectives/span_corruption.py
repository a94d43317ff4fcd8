"""T5's span-corruption objective (objective="span_corruption"): the decoder predicts each sentinel and the span
it replaced (data_pipelines/span_corruption.py lays the rows out), cross-entropy at every real target token.

Packed rows: the encoder and decoder see only their own example (segment ids), the decoder causally.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from bert_jax.data_pipelines import span_corruption
from bert_jax.errors import UserError
from bert_jax.models import families
from bert_jax.training.objectives.base import Batch, token_nll_and_correct
from bert_jax.training.objectives.registry import register


class SpanCorruption:
  """Cross-entropy of the decoder's targets given the corrupted inputs."""

  def __init__(self, model_config):
    self.config = model_config
    self.model = families.build(model_config)

  def init(self, rng: jax.Array, batch: Batch) -> Any:
    del batch  # the shared example batch is the masked-LM contract's; the parameters do not depend on shapes
    ids = jnp.zeros((1, 8), jnp.int32)
    return self.model.init({"params": rng}, ids, decoder_input_ids=ids)["params"]

  def backbone(self, params: Any) -> Any:
    return params

  def apply(self, params: Any, batch: Batch, rng: jax.Array | None, deterministic: bool):
    rngs = None if deterministic else {"dropout": rng}
    return self.model.apply({"params": params}, batch["encoder_input_tokens"],
                            decoder_input_ids=batch["decoder_input_tokens"],
                            encoder_segment_ids=batch["encoder_segment_ids"],
                            decoder_segment_ids=batch["decoder_segment_ids"], deterministic=deterministic, rngs=rngs)

  def counts(self, batch: Batch) -> dict[str, jax.Array]:
    return {"targets": jnp.sum(batch["decoder_loss_weights"].astype(jnp.float32)),
            "rows": jnp.asarray(batch["encoder_input_tokens"].shape[0], jnp.float32)}

  def sums(self, params: Any, batch: Batch, rng: jax.Array | None, deterministic: bool) -> dict[str, jax.Array]:
    logits = self.apply(params, batch, rng, deterministic).logits
    weights = batch["decoder_loss_weights"].astype(jnp.float32)
    nll, correct = token_nll_and_correct(logits, batch["decoder_target_tokens"])
    return {"span_loss": jnp.sum(nll * weights), "span_correct": jnp.sum(correct * weights)}

  def loss(self, sums: dict[str, jax.Array], counts: dict[str, jax.Array]) -> jax.Array:
    return sums["span_loss"] / jnp.maximum(counts["targets"], 1.0)

  def metrics(self, sums: dict[str, jax.Array], counts: dict[str, jax.Array]) -> dict[str, jax.Array]:
    n = jnp.maximum(counts["targets"], 1.0)
    return {"span_loss": sums["span_loss"] / n, "span_accuracy": sums["span_correct"] / n}


@register("span_corruption")
def from_config(config: ml_collections.ConfigDict, model_config) -> SpanCorruption:
  if model_config.family != "t5":
    raise UserError(f"objective='span_corruption' trains an encoder-decoder: model.family='t5' (it is "
                    f"{model_config.family!r}; configs/t5.py has it)")
  if config.data.example_builder != span_corruption.BUILDER:
    raise UserError(f"objective='span_corruption' reads T5's corrupted spans: set data.example_builder="
                    f"'{span_corruption.BUILDER}' (it is {config.data.example_builder!r})")
  return SpanCorruption(model_config)
