"""A left-to-right language model on BERT's encoder: BERT's "LTR & No NSP" ablation (Devlin et al. 2019,
section 5.1 and Table 5), a model "trained using a standard Left-to-Right (LTR) LM, rather than an MLM",
with no next-sentence prediction, whose left-only constraint also holds when fine-tuning (model.causal).

Every real token after the first predicts the next one: position t's output, which sees tokens 0..t only
(model.causal), predicts token t + 1 through the tied MLM decoder. The batch is the text pipeline's, whose
masked tokens are put back first (masked_lm_ids at masked_lm_positions): the model reads the text as it is.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from bert_jax.errors import UserError
from bert_jax.models.config import ModelConfig
from bert_jax.training.objectives.base import Batch, token_nll_and_correct
from bert_jax.training.objectives.bert import BertPretraining
from bert_jax.training.objectives.registry import register


def original_ids(batch: Batch) -> jax.Array:
  """input_ids with the masking undone: int32[B, T]."""
  ids, positions = jnp.asarray(batch["input_ids"]), jnp.asarray(batch["masked_lm_positions"])
  real = batch["masked_lm_weights"] > 0
  at = jnp.take_along_axis(ids, positions, axis=1)
  rows = jnp.arange(ids.shape[0])[:, None]
  return ids.at[rows, positions].set(jnp.where(real, batch["masked_lm_ids"], at))


def next_token_targets(batch: Batch) -> tuple[jax.Array, jax.Array]:
  """(targets int32[B, T-1], weights f32[B, T-1]): token t + 1 for position t, where t + 1 is real."""
  return original_ids(batch)[:, 1:], batch["input_mask"][:, 1:].astype(jnp.float32)


class LeftToRight(BertPretraining):
  """Next-token prediction at every real position of a causal encoder (no sentence head)."""

  def counts(self, batch: Batch) -> dict[str, jax.Array]:
    return {"lm": jnp.sum(next_token_targets(batch)[1]),
            "rows": jnp.asarray(batch["input_ids"].shape[0], jnp.float32)}

  def sums(self, params: Any, batch: Batch, rng: jax.Array | None, deterministic: bool) -> dict[str, jax.Array]:
    rngs = None if deterministic else {"dropout": rng}
    out = self.model.apply({"params": params}, original_ids(batch), batch["input_mask"], batch["segment_ids"],
                           batch.get("position_ids"), batch.get("document_ids"), None,
                           deterministic=deterministic, rngs=rngs)
    targets, weights = next_token_targets(batch)
    nll, correct = token_nll_and_correct(out.mlm_logits[:, :-1], targets)
    return {"lm_loss": jnp.sum(nll * weights), "lm_correct": jnp.sum(correct * weights)}

  def loss(self, sums: dict[str, jax.Array], counts: dict[str, jax.Array]) -> jax.Array:
    return sums["lm_loss"] / jnp.maximum(counts["lm"], 1.0)

  def metrics(self, sums: dict[str, jax.Array], counts: dict[str, jax.Array]) -> dict[str, jax.Array]:
    n = jnp.maximum(counts["lm"], 1.0)
    return {"lm_loss": sums["lm_loss"] / n, "lm_accuracy": sums["lm_correct"] / n}


@register("ltr")
def from_config(config: ml_collections.ConfigDict, model_config: ModelConfig) -> LeftToRight:
  if not model_config.causal or model_config.sentence_head != "none":
    raise UserError(f"objective='ltr' is a left-to-right LM with no sentence task: set model.causal=True and "
                    f"model.sentence_head='none' (they are {model_config.causal} and "
                    f"{model_config.sentence_head!r}; configs/ltr.py has them)")
  return LeftToRight(model_config)
