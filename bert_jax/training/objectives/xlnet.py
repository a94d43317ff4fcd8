"""XLNet's permutation language modelling with partial prediction (Yang et al. 2019, section 2.3).

Per row, on the device, from the step's key (so the same (seed, step) draws the same orders and a
resumed run continues exactly; evaluation draws from a fixed key):
  1. targets: about 1/K of the real tokens (`goal`, at most T // K), chosen as the released data code does
     (`_sample_mask`): left to right, units of an n-gram (n in 1..max_span, P(n) ~ 1/n) inside
     span_context x n tokens of context at a random offset, cut at the goal, then random single tokens up
     to it. The first and last real tokens ([CLS], [SEP]) are never targets (the xlnet_stream rows say
     which tokens may be, `predictable`); SentencePiece word boundaries are not looked at (spans may start
     inside a word).
  2. a factorisation order: the non-targets first (they see each other, never a target), then the targets
     in a random order; a target sees the non-targets and the targets before it (`perm_mask`), the
     query stream at a target never its own token. Predicting the targets = the last 1/K of the order.
  3. the loss: the tied LM head over the query stream at the targets (`target_mapping`), mean NLL.
The input is the uncorrupted text: the batch's masked tokens are put back (the data pipeline's BERT
masking is not used).

The released code's recurrence (`xlnet.mem_len`, `xlnet.reuse_len`, `xlnet.bi_data`; with
data.example_builder="xlnet_stream", data_pipelines/xlnet_stream.py): with reuse_len the row is two
permutation blocks, its first reuse_len tokens (which never see the rest) and the rest (which see all of
them), with half the targets each; with mem_len each row attends to the memory of the previous step's
same row (the train state carries it: RecurrentPermutationLM, a CarryingObjective); with bi_data the model
reads the batch's second half (the reversed streams) with negated distances.
"""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from bert_jax.errors import UserError
from bert_jax.models import batch_rows, families
from bert_jax.models.xlnet import XLNetConfig
from bert_jax.training.objectives.base import CARRY, Batch, token_nll_and_correct
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


def allowed_targets(input_mask: jax.Array, predictable: jax.Array | None = None) -> jax.Array:
  """bool [B, T]: the tokens that may be targets: the batch's `predictable` feature (the xlnet_stream rows mark
  their [SEP]s and [CLS]) at real tokens, or, without it, the real tokens besides the first and last ([CLS],
  [SEP] of a right-padded row)."""
  real = input_mask > 0
  if predictable is not None:
    return real & (predictable > 0)
  t = jnp.arange(input_mask.shape[-1])
  count = jnp.sum(real.astype(jnp.int32), axis=-1, keepdims=True)
  return (t >= 1) & (t < count - 1)


def block_goals(input_mask: jax.Array, allowed: jax.Array, k: int, reuse_len: int = 0) -> jax.Array:
  """Targets per row and block, int32 [B, 2]: of the row's real // K (at least 1, at most P), half in the first
  reuse_len tokens (the released data code's num_predict // 2 there; none without reuse_len), the rest after
  them; each at most its block's allowed tokens."""
  real = jnp.sum(input_mask.astype(jnp.int32), axis=-1)
  total = jnp.minimum(jnp.maximum(real // k, 1), num_predictions(input_mask.shape[-1], k))
  reuse = jnp.arange(input_mask.shape[-1]) < reuse_len
  first = jnp.minimum(total // 2, jnp.sum(allowed & reuse, axis=-1))
  rest = jnp.minimum(total - first, jnp.sum(allowed & ~reuse, axis=-1))
  return jnp.stack([first, rest], axis=-1).astype(jnp.int32)


def goals(input_mask: jax.Array, k: int, predictable: jax.Array | None = None, reuse_len: int = 0) -> jax.Array:
  """Targets per row [B]: real // K (at least 1), at most P and the allowed tokens (`allowed_targets`)."""
  return jnp.sum(block_goals(input_mask, allowed_targets(input_mask, predictable), k, reuse_len), axis=-1)


def _span_targets(key: jax.Array, allowed: jax.Array, goal: jax.Array, length: int, max_span: int,
                  context: int) -> jax.Array:
  """bool [T]: span-chosen targets among one block's `allowed` tokens, exactly `goal` of them (at most the
  allowed ones): spans laid from the block's first allowed token, cut at the block's last."""
  t = jnp.arange(length)
  lo = jnp.argmax(allowed)
  hi = length - jnp.argmax(allowed[::-1])
  units = length // (1 + context) + 1
  k_len, k_offset, k_fill = jax.random.split(key, 3)
  p = 1.0 / np.arange(1, max_span + 1)
  n = jax.random.choice(k_len, jnp.arange(1, max_span + 1), (units,), p=jnp.asarray(p / p.sum()))
  ctx = n * context
  l_ctx = jnp.floor(jax.random.uniform(k_offset, (units,)) * ctx).astype(jnp.int32)
  begin = lo + jnp.cumsum(n + ctx) - (n + ctx) + l_ctx
  taken_before = jnp.cumsum(n) - n
  n = jnp.clip(goal - taken_before, 0, n)  # cut at the goal
  fits = begin + n <= hi
  covered = allowed & jnp.any(fits[:, None] & (t[None] >= begin[:, None]) & (t[None] < (begin + n)[:, None]), axis=0)
  candidate = allowed & ~covered
  score = jnp.where(candidate, jax.random.uniform(k_fill, (length,)), -1.0)
  rank = jnp.argsort(jnp.argsort(-score))
  return covered | (candidate & (rank < goal - jnp.sum(covered)))


def _row_plan(key: jax.Array, allowed: jax.Array, goal: jax.Array, p: int, max_span: int, context: int,
              reuse_len: int):
  """One row's Plan. With reuse_len (the released code's two permutation blocks): the first reuse_len tokens
  never see the rest (their states become the next step's memory, which must not have seen what the next
  step predicts); the rest see all of them."""
  length = allowed.shape[0]
  k_targets, k_order = jax.random.split(key)
  t = jnp.arange(length)
  reuse = t < reuse_len
  if reuse_len:
    k_first, k_rest = jax.random.split(k_targets)
    target = (_span_targets(k_first, allowed & reuse, goal[0], length, max_span, context)
              | _span_targets(k_rest, allowed & ~reuse, goal[1], length, max_span, context))
  else:
    target = _span_targets(k_targets, allowed, goal[1], length, max_span, context)
  order = jnp.argsort(jnp.argsort(jax.random.uniform(k_order, (length,))))
  # the order: the reuse block's non-targets, its targets, the rest's non-targets, its targets
  rank = jnp.where(target, 1 + order, 0) + jnp.where(reuse, 0, 2 * length)
  perm_mask = (target[None, :] & (rank[None, :] >= rank[:, None])) | (reuse[:, None] & ~reuse[None, :])
  total = goal[0] + goal[1]
  targets = jnp.argsort(jnp.where(target, t, length + t))[:p].astype(jnp.int32)
  weights = (jnp.arange(p) < total).astype(jnp.float32)
  targets = jnp.where(weights > 0, targets, 0)
  mapping = jax.nn.one_hot(targets, length, dtype=jnp.float32) * weights[:, None]
  return Plan(perm_mask.astype(jnp.float32), mapping, targets, weights)


def sample_plan(key: jax.Array, input_mask: jax.Array, k: int = 6, max_span: int = 5, context: int = 6,
                predictable: jax.Array | None = None, reuse_len: int = 0) -> Plan:
  """A factorisation of every row of a batch (input_mask [B, T]; right-padded, or the xlnet_stream rows with
  their `predictable` feature) from `key`."""
  batch, length = input_mask.shape
  keys = batch_rows.row_keys(key, batch)  # by global row: the same draws on any mesh (training/accumulate.py)
  allowed = allowed_targets(input_mask, predictable)
  return jax.vmap(_row_plan, in_axes=(0, 0, 0, None, None, None, None))(
      keys, allowed, block_goals(input_mask, allowed, k, reuse_len), num_predictions(length, k), max_span, context,
      reuse_len)


def original_tokens(batch: Batch) -> jax.Array:
  """input_ids with the masked tokens put back (masked_lm_ids at masked_lm_positions, where weighted); a batch
  without masked-LM features (the xlnet_stream rows) as it is."""
  ids = jnp.asarray(batch["input_ids"])
  if "masked_lm_positions" not in batch:
    return ids
  positions = jnp.asarray(batch["masked_lm_positions"], jnp.int32)
  current = jnp.take_along_axis(ids, positions, axis=1)
  values = jnp.where(batch["masked_lm_weights"] > 0, batch["masked_lm_ids"].astype(ids.dtype), current)
  rows = jnp.arange(ids.shape[0])[:, None]
  return ids.at[rows, positions].set(values)


class PermutationLM:
  """XLNet pretraining: the LM loss of the query stream at each row's last 1/K of a random order.

  With reuse_len, two permutation blocks per row (the first reuse_len tokens, and the rest); with bi_data the
  model reads the batch's second half backwards. The model is `model_config` with the xlnet block's mem_len,
  reuse_len and bi_data (pretraining's; the saved model section keeps its own)."""

  def __init__(self, model_config: XLNetConfig, k: int = 6, max_span: int = 5, context: int = 6,
               mem_len: int = 0, reuse_len: int = 0, bi_data: bool = False):
    self.config = dataclasses.replace(model_config, mem_len=mem_len, reuse_len=reuse_len, bi_data=bi_data)
    self.model = families.build(self.config)
    self.k, self.max_span, self.context = k, max_span, context

  def _inputs(self, batch: Batch, key: jax.Array) -> tuple[dict[str, Any], Plan]:
    plan = sample_plan(key, batch["input_mask"], self.k, self.max_span, self.context, batch.get("predictable"),
                       self.config.reuse_len)
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
    targets = goals(batch["input_mask"], self.k, batch.get("predictable"), self.config.reuse_len)
    return {"plm": jnp.sum(targets).astype(jnp.float32)}

  def sums(self, params: Any, batch: Batch, rng: jax.Array | None, deterministic: bool) -> dict[str, jax.Array]:
    """rng: the step's key (None in evaluation: a fixed one), split into the order's and dropout's. With
    batch[CARRY] (the train step's memory, [B, L, mem_len, H]) the rows attend to it, and sums[CARRY] is the
    next step's."""
    order_rng, dropout_rng = jax.random.split(jax.random.key(0) if rng is None else rng)
    inputs, plan = self._inputs(batch, order_rng)
    mems = batch.get(CARRY)
    out = self.model.apply({"params": params}, **inputs, deterministic=deterministic,
                           mems=None if mems is None else jnp.swapaxes(mems, 0, 1),
                           backward_rows=batch.get("backward_rows"),
                           rngs=None if deterministic else {"dropout": dropout_rng})
    labels = jnp.take_along_axis(inputs["input_ids"], plan.targets, axis=1)
    nll, correct = token_nll_and_correct(out.mlm_logits, labels)
    sums = {"plm_loss": jnp.sum(nll * plan.weights), "plm_correct": jnp.sum(correct * plan.weights)}
    if mems is not None:
      sums[CARRY] = jnp.swapaxes(out.mems, 0, 1).astype(mems.dtype)
    return sums

  def loss(self, sums: dict[str, jax.Array], counts: dict[str, jax.Array]) -> jax.Array:
    return sums["plm_loss"] / jnp.maximum(counts["plm"], 1.0)

  def metrics(self, sums: dict[str, jax.Array], counts: dict[str, jax.Array]) -> dict[str, jax.Array]:
    n = jnp.maximum(counts["plm"], 1.0)
    return {"plm_loss": sums["plm_loss"] / n, "plm_accuracy": sums["plm_correct"] / n}


class RecurrentPermutationLM(PermutationLM):
  """PermutationLM with Transformer-XL's recurrence across train steps (a CarryingObjective): each row attends
  to the memory of the previous step's same row (the xlnet_stream data makes it the preceding text of the same
  stream), starting from zeros as the released train_gpu.py; the memory is carried in the train state."""

  def carry_init(self, batch_size: int) -> Any:
    cfg = self.config
    zeros = jnp.zeros((batch_size, cfg.num_layers, cfg.mem_len, cfg.hidden_size), cfg.compute_dtype)
    return nn.LogicallyPartitioned(zeros, names=("batch", None, None, None))


@register("xlnet")
def from_config(config: ml_collections.ConfigDict, model_config: XLNetConfig) -> PermutationLM:
  """XLNet's objective from a run config (its `xlnet` block: prediction_k, max_span, span_context, mem_len,
  reuse_len, bi_data)."""
  if getattr(model_config, "family", "") != "xlnet" or not model_config.mlm_head:
    raise UserError("objective='xlnet' needs model.family='xlnet' and model.mlm_head=True "
                    "(configs/xlnet.py)")
  if model_config.window_len:
    raise UserError(f"model.window_len={model_config.window_len} is fine-tuning's windows (task.memory_segments); "
                    "pretraining carries the memory across steps: xlnet.mem_len")
  block = config.get("xlnet") or {}
  k, max_span, context, mem_len, reuse_len, bi_data = (block.get(key, default) for key, default in (
      ("prediction_k", 6), ("max_span", 5), ("span_context", 6), ("mem_len", 0), ("reuse_len", 0),
      ("bi_data", False)))
  if k < 1 or max_span < 1 or context < 0:
    raise UserError(f"xlnet.prediction_k={k} and xlnet.max_span={max_span} must be >= 1, "
                    f"xlnet.span_context={context} >= 0")
  if mem_len < 0 or reuse_len < 0 or (reuse_len and reuse_len >= config.data.max_seq_length):
    raise UserError(f"xlnet.mem_len={mem_len} must be >= 0 and xlnet.reuse_len={reuse_len} between 0 and "
                    f"data.max_seq_length - 1")
  if bi_data and any(config.train.get(key, 0) % 2 for key in ("batch_size", "eval_batch_size")):
    raise UserError(f"xlnet.bi_data reads half the batch backwards: train.batch_size={config.train.batch_size} "
                    f"and train.eval_batch_size={config.train.get('eval_batch_size', 0)} must be even")
  builder = (config.get("data") or {}).get("example_builder", "")
  if mem_len and builder != "xlnet_stream":
    raise UserError(f"xlnet.mem_len={mem_len} carries each row's memory to the next step, which only the "
                    f"data.example_builder='xlnet_stream' rows continue (not {builder!r}); use it, or xlnet.mem_len=0")
  cls = RecurrentPermutationLM if mem_len else PermutationLM
  return cls(model_config, k, max_span, context, mem_len, reuse_len, bool(bi_data))
