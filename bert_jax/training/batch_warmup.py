"""Batch-size warmup (ModernBERT's recipe): the batch that counts grows linearly from a fraction
`batch_warmup_start` of train.batch_size to all of it over the first `batch_warmup_steps` steps.

The step is compiled once, for the full batch, so the warmup does not shrink the arrays: the rows past
the ones in use (the last ones of the global batch) get zero weight on their masked-LM predictions. The
loss and its gradient are then exactly those of the smaller batch (the objective divides by the
predictions that count), at the full batch's compute; the rows set aside are not seen again. Only the
masked-LM loss is thinned, so an objective with other per-row terms (NSP, SOP, RTD) is refused.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import ml_collections

from bert_jax.errors import UserError


def rows_in_use(step: jax.Array, batch_size: int, start: float, steps: int) -> jax.Array:
  """int32: the rows that count at `step`: a fraction `start` of batch_size at step 0 (at least one row),
  rising linearly to all of them at `steps`."""
  first = max(1.0, start * batch_size)
  grown = first + (batch_size - first) * jnp.minimum(step, steps) / steps
  return jnp.floor(grown).astype(jnp.int32)


def thin(batch: dict[str, jax.Array], rows: jax.Array) -> dict[str, jax.Array]:
  """`batch` with the masked-LM weights of rows >= `rows` set to zero."""
  kept = jnp.arange(batch["masked_lm_weights"].shape[0])[:, None] < rows
  return {**batch, "masked_lm_weights": jnp.where(kept, batch["masked_lm_weights"], 0.0)}


def check(config: ml_collections.ConfigDict, objective) -> None:
  """UserError for a warmup this config's objective cannot run (the schema checks the fields' ranges)."""
  cfg = objective.config
  if config.objective != "bert" or cfg.sentence_head != "none":
    raise UserError("train.batch_warmup_steps thins the masked-LM predictions only: it needs objective='bert' "
                    "without a sentence head (model.sentence_head='none')")


def wrap(step_fn: Callable, train: ml_collections.ConfigDict) -> Callable:
  """step_fn(state, batch, rng, ...) with the batch thinned to the rows in use at state.step."""
  def step(state, batch, rng, *extra, **kwargs):
    rows = rows_in_use(state.step, train.batch_size, train.batch_warmup_start, train.batch_warmup_steps)
    return step_fn(state, thin(batch, rows), rng, *extra, **kwargs)
  return step
