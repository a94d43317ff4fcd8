"""SpanBERT's pretraining objective: masked LM plus the span boundary objective, no sentence task."""
from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from bert_jax.errors import UserError
from bert_jax.models.config import ModelConfig
from bert_jax.models.spanbert import SpanBoundaryHead
from bert_jax.training.objectives.base import Batch, mlm_sums, token_nll_and_correct
from bert_jax.training.objectives.bert import BertPretraining
from bert_jax.training.objectives.registry import register


class SpanBertPretraining(BertPretraining):
  """MLM + the span boundary objective at the same predictions (SpanBERT); loss = their sum.

  Needs data.masking="span" (the batch carries masked_lm_span_left/right/offset) and no sentence head
  (SpanBERT drops NSP; from_config checks both). Predictions deeper
  than the head's position table into their span count for MLM only, as in the released code.
  """

  def __init__(self, model_config: ModelConfig):
    super().__init__(model_config)
    self.head = SpanBoundaryHead(model_config)

  def init(self, rng: jax.Array, batch: Batch) -> Any:
    bert_rng, head_rng = jax.random.split(rng)
    params = super().init(bert_rng, batch)
    table = nn.meta.unbox(params["embeddings"]["word_embeddings"]["embedding"])
    preds = jnp.zeros_like(batch["masked_lm_positions"])
    hidden = jnp.zeros(preds.shape[:1] + (batch["input_ids"].shape[1], self.config.hidden_size))
    head = self.head.init(head_rng, hidden, preds, preds, preds, table)["params"]
    return {**params, "sbo_head": head}

  def backbone(self, params: Any) -> Any:
    return super().backbone({k: v for k, v in params.items() if k != "sbo_head"})

  def _sbo_weights(self, batch: Batch) -> jax.Array:
    inside = batch["masked_lm_span_offset"] < self.head.max_span_positions
    return batch["masked_lm_weights"].astype(jnp.float32) * inside

  def counts(self, batch: Batch) -> dict[str, jax.Array]:
    return {**super().counts(batch), "sbo": jnp.sum(self._sbo_weights(batch))}

  def sums(self, params: Any, batch: Batch, rng: jax.Array | None, deterministic: bool
           ) -> dict[str, jax.Array]:
    out = self.apply({k: v for k, v in params.items() if k != "sbo_head"}, batch, rng, deterministic)
    offset = jnp.minimum(batch["masked_lm_span_offset"], self.head.max_span_positions - 1)
    logits = self.head.apply({"params": params["sbo_head"]}, out.last_hidden_state,
                             batch["masked_lm_span_left"], batch["masked_lm_span_right"], offset,
                             params["embeddings"]["word_embeddings"]["embedding"])
    nll, correct = token_nll_and_correct(logits, batch["masked_lm_ids"])
    weights = self._sbo_weights(batch)
    return {**mlm_sums(out.mlm_logits, batch),
            "sbo_loss": jnp.sum(nll * weights), "sbo_correct": jnp.sum(correct * weights)}

  def loss(self, sums: dict[str, jax.Array], counts: dict[str, jax.Array]) -> jax.Array:
    return super().loss(sums, counts) + sums["sbo_loss"] / jnp.maximum(counts["sbo"], 1.0)

  def metrics(self, sums: dict[str, jax.Array], counts: dict[str, jax.Array]) -> dict[str, jax.Array]:
    n = jnp.maximum(counts["sbo"], 1.0)
    return {**super().metrics(sums, counts), "sbo_loss": sums["sbo_loss"] / n,
            "sbo_accuracy": sums["sbo_correct"] / n}


@register("spanbert", bert_mlm=True)
def from_config(config: ml_collections.ConfigDict, model_config: ModelConfig) -> SpanBertPretraining:
  """SpanBERT from a run config, after checking its masking and heads."""
  if config.data.masking != "span":
    raise UserError(f"objective='spanbert' needs data.masking='span', got {config.data.masking!r}")
  if model_config.sentence_head != "none" or not model_config.mlm_head:
    raise UserError("objective='spanbert' needs model.mlm_head=True and model.sentence_head='none', got "
                    f"{model_config.mlm_head} and {model_config.sentence_head!r}")
  return SpanBertPretraining(model_config)
