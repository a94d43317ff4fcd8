"""Random draws tied to a batch's rows, wherever those rows are computed.

The train step runs its micro-batch loop inside `jax.shard_map` over the data-parallel mesh axes
(training/accumulate.py), so each device traces the model on its own rows only. Random streams
indexed by position in the traced array would then repeat on every device and change with the mesh.
Within `shard(axes)` the model knows it holds the `axis_index(axes)`-th equal slice of the batch:
`row_offset` turns a local row number into the global one (dropout's counters,
models/dropout.py), and `row_keys` gives each row its own key (SMART's noise, ELECTRA's samples). So
the same seed draws the same numbers for a row on one device, a 2x2x2 mesh or two processes.
Outside `shard` (evaluation, prediction, one unsharded array) the offset is 0. Within `chunk(i, n)` the
traced array is the i-th of n equal consecutive slices of those rows (GradCache's chunks, sbert/gradcache.py),
so a chunk draws the slice of the whole batch's numbers, as the uncached step does.
Within `packed(unpad_index, packed_rows)` the traced arrays are packed rows [R, T] of a padded batch [B, T]
(models/unpad.py), and `packed_tokens` gives each packed token its place b * T + t in the padded batch, so
dropout draws for it what the padded computation draws for row b, position t (models/dropout.py).
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import jax
import jax.numpy as jnp

_AXES: list[tuple[str, ...]] = []  # the innermost `shard` context's mesh axes; empty outside one
_CHUNKS: list[tuple[jax.Array | int, int]] = []  # the innermost `chunk` context's (index, count)
_PACKED: list[tuple[jax.Array, int] | None] = []  # the innermost `packed` context's (packed_tokens, B)


@contextlib.contextmanager
def shard(axes: tuple[str, ...]) -> Iterator[None]:
  """While tracing inside a shard_map over `axes`, arrays lead with this device's slice of the batch."""
  _AXES.append(tuple(axes))
  try:
    yield
  finally:
    _AXES.pop()


@contextlib.contextmanager
def chunk(index: jax.Array | int, count: int) -> Iterator[None]:
  """While tracing, arrays lead with the `index`-th of `count` equal consecutive slices of the rows that
  `shard` (or the whole batch) would otherwise see."""
  _CHUNKS.append((index, count))
  try:
    yield
  finally:
    _CHUNKS.pop()


@contextlib.contextmanager
def packed(unpad_index: jax.Array | None, packed_rows: int) -> Iterator[None]:
  """While tracing an encoder on packed rows [packed_rows, T] of the padded batch that `unpad_index`
  int32[B, T] maps into them (models/unpad.py), random draws follow each token's padded place. None:
  the arrays are the padded batch's (the context is then a no-op)."""
  if unpad_index is None:
    _PACKED.append(None)
  else:
    size, width = unpad_index.shape
    slots = packed_rows * width
    # the inverse of unpad_index: each packed slot's b * T + t, B * T on the slots no padded token fills
    places = jnp.full((slots + 1,), size * width, jnp.int32).at[unpad_index.reshape(-1)].set(
        jnp.arange(size * width, dtype=jnp.int32), mode="drop")
    _PACKED.append((places[:slots].reshape(packed_rows, width), size))
  try:
    yield
  finally:
    _PACKED.pop()


def packed_tokens() -> tuple[jax.Array, int] | None:
  """(int32[R, T]: each packed token's place b * T + t in the padded batch, B) inside `packed`; else None."""
  return _PACKED[-1] if _PACKED else None


def axes() -> tuple[str, ...]:
  """The mesh axes the batch is split over where this is traced (inside `shard`); () elsewhere."""
  return _AXES[-1] if _AXES else ()


def row_offset(local_rows: int) -> jax.Array | int:
  """The global index of this device's first row, for an array of `local_rows` rows (leading axes)."""
  index, count = _CHUNKS[-1] if _CHUNKS else (0, 1)
  if not axes():
    return 0 if not _CHUNKS else jnp.asarray(index, jnp.uint32) * jnp.uint32(local_rows)
  device = jax.lax.axis_index(axes()).astype(jnp.uint32)
  return (device * jnp.uint32(count) + jnp.asarray(index, jnp.uint32)) * jnp.uint32(local_rows)


def row_keys(key: jax.Array, rows: int) -> jax.Array:
  """One key per row of a [rows, ...] array: `fold_in(key, global row index)`."""
  index = jnp.arange(rows, dtype=jnp.uint32) + row_offset(rows)
  return jax.vmap(lambda i: jax.random.fold_in(key, i))(index)
