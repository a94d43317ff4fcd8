"""Unpadding: a padded batch's real tokens packed into fewer rows before the encoder, restored after it.

ModernBERT's paper drops the padding tokens before the first layer and computes on the real tokens only. Under
jit the shapes are static, so the packing is done on the host, in NumPy (`pack`): the real tokens of the
padded rows [B, T] are laid end to end into R <= B rows of the same width T (first fit, longest row first),
each row's tokens one segment (`document_ids` 1, 2, ... in a packed row, 0 on its padding) with the positions
the padded row gave them (`position_ids`: from 0 again in each segment; RoBERTa's after its pad id). Attention
stays within a segment (attention.Segments: dot's dense mask, splash's SegmentIds; ModernBERT's local window
too, as its offsets inside a segment are the padded row's), so every real token's output is the padded
computation's. R is rounded up to a multiple of `unit` (an eighth of the batch by default), so a batch size
compiles at most eight shapes. After the last layer the encoder gathers its outputs back to [B, T]
(`restore`, by `unpad_index`: each padded token's place in the packed rows, the zero row past them for the
padding), so pooling and the heads read the padded layout as before.

Fine-tuning's training steps run packed too (finetune/batching.py:train_packer): dropout inside the encoder
draws each token's mask at its padded place (models/batch_rows.py:packed), so the step's loss and gradients are
the padded step's; a step over micro-batches packs each device's micro-batch on its own (`pack_groups`).

A batch that went through `pack` holds input_ids, token_type_ids, position_ids, document_ids int32[R, T] (the
packed rows), attention_mask int32[B, T] (the padded batch's) and unpad_index int32[B, T]. An encoder takes
part when its __call__ accepts `unpad_index` (BertModel's families, ModernBERT), as its family record's
`unpad_refusal` says (models/families.py).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

PACKED = ("input_ids", "token_type_ids", "position_ids", "document_ids")  # [R, T] in a packed batch
INDEX = "unpad_index"


def padded_positions(config, attention_mask: np.ndarray) -> np.ndarray:
  """int32[B, T]: the positions the encoder gives a padded batch's tokens by default (models/bert.py:
  default_position_ids; ModernBERT's are 0..T-1)."""
  if getattr(config, "position_style", "") == "roberta":
    real = (attention_mask != 0).astype(np.int32)
    return np.cumsum(real, axis=1) * real + config.pad_token_id
  return np.broadcast_to(np.arange(attention_mask.shape[1], dtype=np.int32), attention_mask.shape)


def row_count(needed: int, batch: int, unit: int) -> int:
  """The packed rows a batch of `batch` rows compiles for: `needed` rounded up to a multiple of `unit`, at
  most `batch` (rounded up to `unit` too)."""
  return min(-(-needed // unit) * unit, -(-batch // unit) * unit)


def default_unit(batch: int, devices: int = 1) -> int:
  """An eighth of the batch, a multiple of the devices the rows are sharded over."""
  return -(-max(1, batch // 8) // devices) * devices


def _bins(lengths: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray, int]:
  """(packed row, start in it) of each padded row's real tokens, first fit, longest first; the rows used."""
  row, start, free = np.zeros(len(lengths), np.int64), np.zeros(len(lengths), np.int64), []
  for b in np.argsort(-lengths, kind="stable"):
    at = next((r for r, room in enumerate(free) if room >= lengths[b]), None)
    if at is None:
      at = len(free)
      free.append(width)
    row[b], start[b] = at, width - free[at]
    free[at] -= lengths[b]
  return row, start, len(free)


def pack(batch: dict[str, np.ndarray], config, *, unit: int | None = None, process_index: int = 0,
         process_count: int = 1, rows: int | None = None) -> dict[str, np.ndarray]:
  """A padded batch (input_ids, attention_mask, token_type_ids int32[B, T], each row's real tokens where
  attention_mask is 1) as packed rows (module docstring). With several hosts each packs its own rows to the
  same R (`unit` a multiple of the rows any host needs is the caller's; by default B's `default_unit`), and
  unpad_index points into the global rows (this host's from process_index * R). rows: R itself (at least
  the rows the batch needs), instead of rounding up to `unit`."""
  ids, mask = np.asarray(batch["input_ids"]), np.asarray(batch["attention_mask"]) != 0
  types = np.asarray(batch.get("token_type_ids", np.zeros_like(ids)))
  size, width = ids.shape
  lengths = mask.sum(axis=1)
  row, start, used = _bins(lengths, width)
  rows = rows or row_count(used, size, unit or default_unit(size))
  offset = np.cumsum(mask, axis=1) - 1  # each real token's place among its row's real tokens
  b, t = np.nonzero(mask)
  r, w = row[b], start[b] + offset[b, t]
  out = {k: np.zeros((rows, width), np.int32) for k in PACKED}
  out["input_ids"][r, w], out["token_type_ids"][r, w] = ids[b, t], types[b, t]
  out["position_ids"][r, w] = padded_positions(config, mask)[b, t]
  slot = np.zeros(len(lengths), np.int64)  # the segment number of each padded row in its packed row
  for p in range(used):
    members = np.flatnonzero((row == p) & (lengths > 0))
    slot[members[np.argsort(start[members])]] = np.arange(1, len(members) + 1)
  out["document_ids"][r, w] = slot[b]
  index = np.full((size, width), rows * width * process_count, np.int32)
  index[b, t] = (process_index * rows + r) * width + w
  return {**out, "attention_mask": mask.astype(np.int32), INDEX: index}


def pack_groups(batch: dict[str, np.ndarray], config, groups: int, micro: int = 1) -> dict[str, np.ndarray]:
  """A padded batch packed for a train step that runs its rows in `groups` parts of `micro` micro-batches each
  (training/accumulate.py: the devices' equal consecutive slices, each cut into micro-batches a, a + A, ...):
  every (part, micro-batch) is packed on its own to the same r rows (each part's `default_unit`), laid out so
  that the same split gives it its own packed rows, and its unpad_index points into those (local) rows. The
  other features ([B, ...] labels) stay as they are. groups * micro == 1 is `pack` of the whole batch."""
  size = len(batch["input_ids"])
  per = size // (groups * micro)
  if per * groups * micro != size:
    raise ValueError(f"{size} rows do not split into {groups} x {micro} equal micro-batches")
  members = [g * micro * per + a + micro * np.arange(per) for g in range(groups) for a in range(micro)]
  lengths = (np.asarray(batch["attention_mask"]) != 0).sum(axis=1)
  needed = max(_bins(lengths[m], batch["input_ids"].shape[1])[2] for m in members)
  rows = row_count(max(needed, 1), per, default_unit(per))
  parts = [pack({k: batch[k][m] for k in ("input_ids", "attention_mask", "token_type_ids") if k in batch},
                config, rows=rows) for m in members]
  out = {k: v for k, v in batch.items()}
  for key in PACKED:  # packed row k of micro-batch a of part g at g * micro * r + k * micro + a
    stacked = np.stack([p[key] for p in parts]).reshape((groups, micro, rows, -1))
    out[key] = stacked.transpose(0, 2, 1, 3).reshape(groups * rows * micro, -1)
  index = np.zeros_like(np.asarray(batch["attention_mask"]), np.int32)
  for m, p in zip(members, parts):
    index[m] = p[INDEX]
  out[INDEX] = index
  return out


def restore(x: jax.Array, index: jax.Array) -> jax.Array:
  """x: [..., R, T, H] over the packed rows -> [..., B, T, H] in the padded layout (zeros on the padding)."""
  lead, hidden = x.shape[:-3], x.shape[-1]
  flat = x.reshape(lead + (-1, hidden))
  flat = jnp.concatenate([flat, jnp.zeros(lead + (1, hidden), x.dtype)], axis=-2)
  return jnp.take(flat, index, axis=-2)


def real_of(index: jax.Array, packed_tokens: int) -> jax.Array:
  """int32[B, T]: 1 on the padded batch's real tokens (those unpad_index places in the packed rows)."""
  return (index < packed_tokens).astype(jnp.int32)


def model_inputs(batch: dict) -> tuple[tuple, dict]:
  """(args, kwargs) of FinetuneModel for a batch, packed or not."""
  args = (batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
  if INDEX not in batch:
    return args, {}
  return args, {"position_ids": batch["position_ids"], "document_ids": batch["document_ids"], INDEX: batch[INDEX]}
