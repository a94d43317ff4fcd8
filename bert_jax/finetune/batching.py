"""Fine-tuning and prediction batches, padded to max_seq_length or cut to length buckets.

With `data.length_buckets` (e.g. (32, 64, 128, 256, 384, 512); max_seq_length is always the last
bucket) a row goes to the smallest bucket that holds its tokens, a batch holds rows of one bucket
only, and its features are cut to that bucket's length: each bucket is one compiled shape, and a
short row no longer pays for max_seq_length (MLPerf's TPU BERT did the same). A row's outputs do not
depend on the padding after it (attention masks it out, positions count from the start), so they
are the padded run's; outputs with a length axis come back padded with zeros to max_seq_length.

Training order (deterministic, resumable at any step): epoch e permutes the rows with (seed, e) as the
padded run does; with buckets each bucket's rows, in that order, are cut into batches (a bucket's
last partial batch waits for the next epoch's permutation) and the batches are shuffled with
(seed, e, 1). An epoch still counts rows // batch_size steps for the schedule: the bucketed batches
run as one stream, epoch after epoch.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator, Sequence

import jax
import ml_collections
import numpy as np

from bert_jax.errors import UserError
from bert_jax.finetune.features import MODEL_INPUTS
from bert_jax.models import families, unpad
from bert_jax.training import accumulate, partitioning

Features = dict[str, np.ndarray]


def buckets(length_buckets: Sequence[int], max_seq_length: int) -> tuple[int, ...]:
  """The bucket lengths, ascending, ending with max_seq_length; () means padding every row to it."""
  values = tuple(length_buckets) if isinstance(length_buckets, (tuple, list)) else None
  if values is None or not all(isinstance(b, (int, np.integer)) and not isinstance(b, bool) for b in values):
    raise UserError(f"data.length_buckets={length_buckets!r} must be a tuple of whole token counts, e.g. "
                    "(32, 64, 128); () pads every row to data.max_seq_length")
  values = tuple(int(b) for b in values)
  if not values:
    return ()
  if list(values) != sorted(set(values)) or values[0] < 1 or values[-1] > max_seq_length:
    raise UserError(f"data.length_buckets={values} must be increasing lengths between 1 and "
                    f"data.max_seq_length={max_seq_length}, e.g. (32, 64, 128)")
  return values if values[-1] == max_seq_length else values + (max_seq_length,)


def row_lengths(features: Features) -> np.ndarray:
  """int[N]: each row's tokens up to its last unmasked position (rows in groups, [N, K, T]: the group's longest)."""
  mask = np.asarray(features["attention_mask"]) != 0
  mask = mask.reshape(len(mask), -1, mask.shape[-1]).any(1)
  return np.where(mask.any(1), mask.shape[1] - np.argmax(mask[:, ::-1], axis=1), 0)


def bucket_of(features: Features, lengths: tuple[int, ...]) -> np.ndarray:
  """int[N]: the index of the smallest bucket holding each row."""
  return np.searchsorted(np.asarray(lengths), row_lengths(features), side="left")


def cut(features: Features, rows: np.ndarray, length: int) -> Features:
  """The rows' features, their length axis (input_ids' last: axis 1 of size max_seq_length, or 2 for rows in
  groups [N, K, T]) cut to `length`."""
  axis = features["input_ids"].ndim - 1
  full = features["input_ids"].shape[axis]
  return {k: (v[rows][(slice(None),) * axis + (slice(length),)] if v.ndim > axis and v.shape[axis] == full
              else v[rows]) for k, v in features.items()}


def _epoch_batches(bucket: np.ndarray, order: np.ndarray, batch_size: int, seed: int, epoch: int
                   ) -> list[np.ndarray]:
  """One epoch's batches of row indices: each bucket's rows in `order`, cut into full batches, shuffled."""
  batches = []
  for b in range(bucket.max() + 1):
    rows = order[bucket[order] == b]
    batches += [rows[i:i + batch_size] for i in range(0, len(rows) - batch_size + 1, batch_size)]
  return [batches[i] for i in np.random.default_rng([seed, epoch, 1]).permutation(len(batches))]


def train_batches(features: Features, batch_size: int, seed: int, start_step: int, end_step: int,
                  lengths: tuple[int, ...] = ()) -> Iterator[Features]:
  """The batches of steps [start_step, end_step), so a resumed run sees exactly the batches an
  uninterrupted one would; `lengths`: the buckets (`buckets`), () to pad every row."""
  n = len(features["input_ids"])
  steps_per_epoch = max(n // batch_size, 1)
  if not lengths:  # epoch e: permutation (seed, e), cut in order, remainder dropped
    epoch, order = -1, None
    for step in range(start_step, end_step):
      if step // steps_per_epoch != epoch:
        epoch = step // steps_per_epoch
        order = np.random.default_rng([seed, epoch]).permutation(n)
      yield {k: v[order[(step % steps_per_epoch) * batch_size:][:batch_size]] for k, v in features.items()}
    return
  bucket = bucket_of(features, lengths)
  per_epoch = int(sum(np.bincount(bucket, minlength=len(lengths)) // batch_size))
  if not per_epoch:
    raise UserError(f"data.length_buckets={lengths}: no bucket holds train.batch_size={batch_size} training "
                    "rows; use fewer buckets or a smaller batch")
  epoch, batches = -1, []
  for step in range(start_step, end_step):
    if step // per_epoch != epoch:
      epoch = step // per_epoch
      batches = _epoch_batches(bucket, np.random.default_rng([seed, epoch]).permutation(n), batch_size, seed, epoch)
    rows = batches[step % per_epoch]
    yield cut(features, rows, lengths[bucket[rows[0]]])


def _length_axes(apply: Callable, params: Any, rows: int, lengths: Sequence[int]) -> dict[str, int | None]:
  """Which axis of each output follows the input length (None: none), from abstract evaluation at the
  first and last of two or more lengths."""
  def shapes(length):
    batch = {k: jax.ShapeDtypeStruct((rows, length), np.int32) for k in MODEL_INPUTS}
    return jax.eval_shape(apply, params, batch)
  a, b = shapes(lengths[-1]), shapes(lengths[0])
  return {k: next((i for i, (x, y) in enumerate(zip(a[k].shape, b[k].shape)) if x != y), None) for k in a}


def check_unpad(config: ml_collections.ConfigDict) -> None:
  """UserError when data.unpad is on and the family config.model names cannot run packed rows (its record's
  `unpad_refusal`). A run whose architecture is init_from's keeps the default's "where the family can"."""
  if not config.data.get("unpad", True):
    return
  try:
    model = families.model_config(config.model.to_dict())
  except UserError:  # a model section init_from's family check or the model's build names first
    return
  reason = families.of(model).unpad_refusal(model)
  if reason:
    raise UserError(f"data.unpad: the {model.family} family cannot run a batch's real tokens packed into fewer rows "
                    f"({reason}); set --config.data.unpad=false")


def unpad_config(data, model_config) -> Any:
  """The encoder config `run_model` packs batches for when data.unpad is on (the default; a workdir written
  before the field existed reads as on) and the family restores packed rows (models/unpad.py), else None."""
  if model_config is None or not data.get("unpad", True):
    return None
  return None if families.of(model_config).unpad_refusal(model_config) else model_config


def train_packer(encoder_config, train, mesh) -> Callable[[Features], Features] | None:
  """How a training batch goes to the step with its real tokens packed (models/unpad.py), or None (padded):
  `encoder_config` is `unpad_config`'s. One pass over the global batch packs it as evaluation does; a step
  over micro-batches or a bfloat16 reduction (training/accumulate.py) packs each device's micro-batch on
  its own (`unpad.pack_groups`), so each restores from its own rows. Either way a token's dropout is the
  padded step's (models/batch_rows.py: packed), so the step's loss and gradients are the padded step's."""
  if encoder_config is None:
    return None
  if accumulate.one_pass(train.grad_accum_steps, train.grad_reduce_dtype):
    pack = lambda batch: {**batch, **_packed(batch, len(batch["input_ids"]), encoder_config, mesh)}  # noqa: E731
  else:
    groups = max(1, accumulate.parts(mesh) // jax.process_count())
    pack = lambda batch: unpad.pack_groups(batch, encoder_config, groups, train.grad_accum_steps)  # noqa: E731
  return lambda batch: pack(batch) if batch["input_ids"].ndim == 2 else batch  # not a ranking head's groups


def _packed(batch: Features, real: int, encoder_config, mesh) -> Features:
  """The batch's real tokens packed into fewer rows (models/unpad.py), the filler rows past `real` empty.
  Several hosts pack to the whole batch's row count, which they all share."""
  batch = {**batch, "attention_mask": batch["attention_mask"].copy()}
  batch["attention_mask"][real:] = 0
  size, hosts = len(batch["input_ids"]), jax.process_count()
  devices = max(1, partitioning.data_parallel_size(mesh) // hosts)
  return unpad.pack(batch, encoder_config, unit=unpad.default_unit(size, devices) if hosts == 1 else size,
                    process_index=jax.process_index(), process_count=hosts)


def run_model(apply: Callable, params: Any, mesh, features: Features, batch_size: int,
              lengths: tuple[int, ...] = (), unpad_config=None) -> dict[str, np.ndarray]:
  """`apply(params, batch)` (jitted, batch-sharded outputs) over every row of `features`, one row of
  outputs per row in order; with buckets, in batches of one bucket padded to batch_size rows (one
  compiled shape per bucket), length axes padded back to max_seq_length with zeros. unpad_config: the
  encoder's config, to run each batch's real tokens packed into fewer rows (models/unpad.py; `apply`
  takes a packed batch and gives the padded batch's outputs), or None."""
  inputs = {k: features[k] for k in MODEL_INPUTS}
  full = inputs["input_ids"].shape[1]
  lengths = lengths or (full,)
  bucket, n = bucket_of(inputs, lengths), len(inputs["input_ids"])
  axes = _length_axes(apply, params, batch_size, lengths) if len(lengths) > 1 else {}
  outputs: dict[str, np.ndarray] = {}
  for b, length in enumerate(lengths):
    members = np.flatnonzero(bucket == b)
    for start in range(0, len(members), batch_size):
      rows = members[start:start + batch_size]
      batch = cut(inputs, np.concatenate([rows, np.full(batch_size - len(rows), rows[0])]), length)
      if unpad_config is not None and batch["input_ids"].ndim == 2:  # not a ranking head's groups [G, K, T]
        batch = _packed(batch, len(rows), unpad_config, mesh)
      got = jax.device_get(apply(params, partitioning.global_batch(batch, mesh)))
      for k, v in got.items():
        v = v[:len(rows)]
        if axes.get(k) is not None:
          pad = [(0, 0)] * v.ndim
          pad[axes[k]] = (0, full - v.shape[axes[k]])
          v = np.pad(v, pad)
        if k not in outputs:
          outputs[k] = np.zeros((n,) + v.shape[1:], v.dtype)
        outputs[k][rows] = v
  return outputs
