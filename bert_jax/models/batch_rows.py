"""Random draws tied to a batch's rows, wherever those rows are computed.

The train step runs its micro-batch loop inside `jax.shard_map` over the data-parallel mesh axes
(training/accumulate.py), so each device traces the model on its own rows only. Random streams
indexed by position in the traced array would then repeat on every device and change with the mesh.
Within `shard(axes)` the model knows it holds the `axis_index(axes)`-th equal slice of the batch:
`row_offset` turns a local row number into the global one (dropout's counters,
models/dropout.py), and `row_keys` gives each row its own key (SMART's noise, ELECTRA's samples). So
the same seed draws the same numbers for a row on one device, a 2x2x2 mesh or two processes.
Outside `shard` (evaluation, prediction, one unsharded array) the offset is 0.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import jax
import jax.numpy as jnp

_AXES: list[tuple[str, ...]] = []  # the innermost `shard` context's mesh axes; empty outside one


@contextlib.contextmanager
def shard(axes: tuple[str, ...]) -> Iterator[None]:
  """While tracing inside a shard_map over `axes`, arrays lead with this device's slice of the batch."""
  _AXES.append(tuple(axes))
  try:
    yield
  finally:
    _AXES.pop()


def row_offset(local_rows: int) -> jax.Array | int:
  """The global index of this device's first row, for an array of `local_rows` rows (leading axes)."""
  if not _AXES or not _AXES[-1]:
    return 0
  return jax.lax.axis_index(_AXES[-1]).astype(jnp.uint32) * jnp.uint32(local_rows)


def row_keys(key: jax.Array, rows: int) -> jax.Array:
  """One key per row of a [rows, ...] array: `fold_in(key, global row index)`."""
  index = jnp.arange(rows, dtype=jnp.uint32) + row_offset(rows)
  return jax.vmap(lambda i: jax.random.fold_in(key, i))(index)
