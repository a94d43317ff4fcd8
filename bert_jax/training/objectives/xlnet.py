"""XLNet's permutation language modelling with partial prediction (Yang et al. 2019, section 2.3).

Per row, on the device, from the step's key (so the same (seed, step) draws the same orders and a
resumed run continues exactly; evaluation draws from a fixed key):
  1. targets: about 1/K of the real tokens (`goal`, at most T // K), chosen as the released data code does
     (`_sample_mask`): left to right, units of an n-gram (n in 1..max_span, P(n) ~ 1/n) inside
     span_context x n tokens of context at a random offset, cut at the goal, then random single tokens up
     to it. The first and last real tokens ([CLS], [SEP]) are never targets; SentencePiece word
     boundaries are not looked at (spans may start inside a word).
  2. a factorisation order: the non-targets first (they see each other, never a target), then the targets
     in a random order; a target sees the non-targets and the targets before it (`perm_mask`), the
     query stream at a target never its own token. Predicting the targets = the last 1/K of the order.
  3. the loss: the tied LM head over the query stream at the targets (`target_mapping`), mean NLL.
The input is the uncorrupted text: the batch's masked tokens are put back (the data pipeline's BERT
masking is not used). One permutation block per row (the released code's reuse_len halves and bi_data
are not modelled), and no memory across steps.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from bert_jax.errors import UserError
from bert_jax.models import families
from bert_jax.models.xlnet import XLNetConfig
from bert_jax.training.objectives.base import Batch, token_nll_and_correct
from bert_jax.training.objectives.registry import register


class Plan(NamedTuple):
  """One batch's factorisation: perm_mask [B, T, T] (1: i may not see j), target_mapping [B, P, T],
  targets int32[B, P] (positions, ascending; padding rows 0), weights [B, P] (1: a real target)."""
  perm_mask: jax.Array
  target_mapping: jax.Array
  targets: jax.Array
  weights: jax.Array


def num_predictions(length: int, k: int) -> int:
  """P, the static number of prediction slots of a row of `length`: length // K (at least 1)."""
  return max(1, length // k)


def goals(input_mask: jax.Array, k: int) -> jax.Array:
  """Targets per row [B]: real // K (at least 1), at most P and the real tokens besides the first and last."""
  real = jnp.sum(input_mask.astype(jnp.int32), axis=-1)
  return jnp.minimum(jnp.minimum(jnp.maximum(real // k, 1), num_predictions(input_mask.shape[-1], k)),
                     jnp.maximum(real - 2, 0))


def _span_targets(key: jax.Array, real: jax.Array, goal: jax.Array, length: int, max_span: int,
                  context: int) -> jax.Array:
  """bool [T]: span-chosen targets of one row (real tokens at the start), exactly `goal` of them."""
  units = length // (1 + context) + 1
  k_len, k_offset, k_fill = jax.random.split(key, 3)
  p = 1.0 / np.arange(1, max_span + 1)
  n = jax.random.choice(k_len, jnp.arange(1, max_span + 1), (units,), p=jnp.asarray(p / p.sum()))
  ctx = n * context
  l_ctx = jnp.floor(jax.random.uniform(k_offset, (units,)) * ctx).astype(jnp.int32)
  begin = 1 + jnp.cumsum(n + ctx) - (n + ctx) + l_ctx  # position 0 is [CLS]
  taken_before = jnp.cumsum(n) - n
  n = jnp.clip(goal - taken_before, 0, n)  # cut at the goal
  fits = begin + n <= real - 1  # the last real token is [SEP]
  t = jnp.arange(length)
  covered = jnp.any(fits[:, None] & (t[None] >= begin[:, None]) & (t[None] < (begin + n)[:, None]), axis=0)
  candidate = (t >= 1) & (t < real - 1) & ~covered
  score = jnp.where(candidate, jax.random.uniform(k_fill, (length,)), -1.0)
  rank = jnp.argsort(jnp.argsort(-score))
  return covered | (candidate & (rank < goal - jnp.sum(covered)))


def _row_plan(key: jax.Array, input_mask: jax.Array, goal: jax.Array, p: int, max_span: int, context: int):
  length = input_mask.shape[0]
  k_targets, k_order = jax.random.split(key)
  real = jnp.sum(input_mask.astype(jnp.int32))
  target = _span_targets(k_targets, real, goal, length, max_span, context)
  order = jnp.argsort(jnp.argsort(jax.random.uniform(k_order, (length,))))
  rank = jnp.where(target, order, -1)  # non-targets come first in the order
  perm_mask = target[None, :] & (rank[None, :] >= rank[:, None])
  t = jnp.arange(length)
  targets = jnp.argsort(jnp.where(target, t, length + t))[:p].astype(jnp.int32)
  weights = (jnp.arange(p) < goal).astype(jnp.float32)
  targets = jnp.where(weights > 0, targets, 0)
  mapping = jax.nn.one_hot(targets, length, dtype=jnp.float32) * weights[:, None]
  return Plan(perm_mask.astype(jnp.float32), mapping, targets, weights)


def sample_plan(key: jax.Array, input_mask: jax.Array, k: int = 6, max_span: int = 5, context: int = 6) -> Plan:
  """A factorisation of every row of a right-padded batch (input_mask [B, T]) from `key`."""
  batch, length = input_mask.shape
  keys = jax.random.split(key, batch)
  plan = jax.vmap(_row_plan, in_axes=(0, 0, 0, None, None, None))(
      keys, input_mask, goals(input_mask, k), num_predictions(length, k), max_span, context)
  return plan


def original_tokens(batch: Batch) -> jax.Array:
  """input_ids with the masked tokens put back (masked_lm_ids at masked_lm_positions, where weighted)."""
  ids, positions = jnp.asarray(batch["input_ids"]), jnp.asarray(batch["masked_lm_positions"], jnp.int32)
  current = jnp.take_along_axis(ids, positions, axis=1)
  values = jnp.where(batch["masked_lm_weights"] > 0, batch["masked_lm_ids"].astype(ids.dtype), current)
  rows = jnp.arange(ids.shape[0])[:, None]
  return ids.at[rows, positions].set(values)


class PermutationLM:
  """XLNet pretraining: the LM loss of the query stream at each row's last 1/K of a random order."""

  def __init__(self, model_config: XLNetConfig, k: int = 6, max_span: int = 5, context: int = 6):
    self.config = model_config
    self.model = families.build(model_config)
    self.k, self.max_span, self.context = k, max_span, context

  def _inputs(self, batch: Batch, key: jax.Array) -> tuple[dict[str, Any], Plan]:
    plan = sample_plan(key, batch["input_mask"], self.k, self.max_span, self.context)
    inputs = dict(input_ids=original_tokens(batch), attention_mask=batch["input_mask"],
                  token_type_ids=batch["segment_ids"], perm_mask=plan.perm_mask, target_mapping=plan.target_mapping)
    return inputs, plan

  def init(self, rng: jax.Array, batch: Batch) -> Any:
    params_rng, dropout_rng = jax.random.split(rng)
    inputs, _ = self._inputs(batch, jax.random.key(0))
    return self.model.init({"params": params_rng, "dropout": dropout_rng}, **inputs, deterministic=True)["params"]

  def backbone(self, params: Any) -> Any:
    return {k: v for k, v in params.items() if k != "mlm_head"}

  def counts(self, batch: Batch) -> dict[str, jax.Array]:
    return {"plm": jnp.sum(goals(batch["input_mask"], self.k)).astype(jnp.float32)}

  def sums(self, params: Any, batch: Batch, rng: jax.Array | None, deterministic: bool) -> dict[str, jax.Array]:
    """rng: the step's key (None in evaluation: a fixed one), split into the order's and dropout's."""
    order_rng, dropout_rng = jax.random.split(jax.random.key(0) if rng is None else rng)
    inputs, plan = self._inputs(batch, order_rng)
    out = self.model.apply({"params": params}, **inputs, deterministic=deterministic,
                           rngs=None if deterministic else {"dropout": dropout_rng})
    labels = jnp.take_along_axis(inputs["input_ids"], plan.targets, axis=1)
    nll, correct = token_nll_and_correct(out.mlm_logits, labels)
    return {"plm_loss": jnp.sum(nll * plan.weights), "plm_correct": jnp.sum(correct * plan.weights)}

  def loss(self, sums: dict[str, jax.Array], counts: dict[str, jax.Array]) -> jax.Array:
    return sums["plm_loss"] / jnp.maximum(counts["plm"], 1.0)

  def metrics(self, sums: dict[str, jax.Array], counts: dict[str, jax.Array]) -> dict[str, jax.Array]:
    n = jnp.maximum(counts["plm"], 1.0)
    return {"plm_loss": sums["plm_loss"] / n, "plm_accuracy": sums["plm_correct"] / n}


@register("xlnet")
def from_config(config: ml_collections.ConfigDict, model_config: XLNetConfig) -> PermutationLM:
  """XLNet's objective from a run config (its `xlnet` block: prediction_k, max_span, span_context)."""
  if getattr(model_config, "family", "") != "xlnet" or not model_config.mlm_head:
    raise UserError("objective='xlnet' needs model.family='xlnet' and model.mlm_head=True "
                    "(configs/xlnet.py)")
  block = config.get("xlnet") or {}
  k, max_span, context = (block.get(key, default) for key, default in
                          (("prediction_k", 6), ("max_span", 5), ("span_context", 6)))
  if k < 1 or max_span < 1 or context < 0:
    raise UserError(f"xlnet.prediction_k={k} and xlnet.max_span={max_span} must be >= 1, "
                    f"xlnet.span_context={context} >= 0")
  return PermutationLM(model_config, k, max_span, context)
