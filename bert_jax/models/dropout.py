"""Dropout whose random bits cost a quarter of flax's.

`flax.linen.Dropout` draws one 32-bit uniform per element, and JAX's partitionable threefry spends a
whole Threefry-2x32 block (two 32-bit words) on each; on CPU the hash is also lowered as a rolled
loop, so the bits are materialised between rounds. Here each block's two words are split into four
16-bit draws, and the hash is written out as plain jnp ops, so XLA fuses iota, hash, compare and
select into one elementwise pass, which makes the `mini` CPU train step faster (BENCHMARKS.md,
"Dropout").

The drop probability is quantised to k / 65536 (0.1 -> 6554 / 65536 = 0.100006) and the kept
values are scaled by the exact inverse of the keep fraction, so the expectation is preserved.
Counters are global (row index over the leading axes, block index along the last), so the mask
does not depend on how the array is sharded; inside the train step's shard_map the rows are numbered
from the device's first global row (models/batch_rows.py), so a device's slice of the batch gets the
slice of the whole batch's mask. An encoder on packed rows (models/unpad.py) numbers each token by its
place in the padded batch (batch_rows.packed), so its masks are the padded computation's. The random
streams differ from flax's.
"""
from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.models import batch_rows

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


def threefry2x32(k1: jax.Array, k2: jax.Array, x1: jax.Array, x2: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Threefry-2x32 with 20 rounds (Salmon et al. 2011), elementwise over uint32 counters x1, x2.

  The same function as `jax.extend.random.threefry2x32_p` (tests/test_dropout.py checks the bits),
  written with elementwise lax ops so that XLA can fuse it with its consumers. lax, not jnp's operators:
  each jnp operator is a jitted function that tracing enters and inlines; with them, a tiny 2x2x2-mesh
  train step took 6.1-6.5 s to set up and lower, 3.9-5.5 s with lax (2026-11-30, a loaded machine).
  """
  add, xor = jax.lax.add, jax.lax.bitwise_xor
  ks = (k1, k2, xor(xor(k1, k2), np.uint32(0x1BD11BDA)))
  x1, x2 = add(x1, ks[0]), add(x2, ks[1])
  for i in range(5):
    for r in _ROTATIONS[i % 2]:
      x1 = add(x1, x2)
      rotated = jax.lax.bitwise_or(jax.lax.shift_left(x2, np.uint32(r)),
                                   jax.lax.shift_right_logical(x2, np.uint32(32 - r)))
      x2 = xor(rotated, x1)
    x1 = add(x1, ks[(i + 1) % 3])
    x2 = add(add(x2, ks[(i + 2) % 3]), np.uint32(i + 1))
  return x1, x2


def _key_words(key: jax.Array) -> tuple[jax.Array, jax.Array]:
  if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
    data = jax.random.key_data(key)
  else:
    data = jnp.asarray(key)
  if data.shape != (2,) or data.dtype != jnp.uint32:  # another PRNG implementation: derive a pair
    data = jax.random.bits(key, (2,), jnp.uint32)
  return data[0], data[1]


def _keep(key: jax.Array, row: jax.Array, shape: tuple[int, ...], rate: float) -> jax.Array:
  """bool[shape]: the keep decisions of the rows whose counters `row` (uint32, broadcastable to shape[:-1]
  + (1, 1)) gives, along a last axis of shape[-1] elements (block index the second counter)."""
  rows, n = shape[:-1], shape[-1]
  blocks = -(-n // 4)
  col = jax.lax.broadcasted_iota(jnp.uint32, (1,) * len(rows) + (1, blocks), len(rows) + 1)
  b1, b2 = threefry2x32(*_key_words(key), jnp.broadcast_to(row, rows + (1, blocks)),
                        jnp.broadcast_to(col, rows + (1, blocks)))
  threshold = np.uint32(round(rate * 65536))
  low = np.uint32(0xFFFF)
  keep = jnp.concatenate([(b1 & low) >= threshold, (b1 >> 16) >= threshold,
                          (b2 & low) >= threshold, (b2 >> 16) >= threshold], axis=-2)
  return keep.reshape(rows + (4 * blocks,))[..., :n]


def keep_mask(key: jax.Array, shape: tuple[int, ...], rate: float) -> jax.Array:
  """bool[shape], True with probability 1 - round(rate * 65536) / 65536, from `key`."""
  if not shape:
    return keep_mask(key, (1,), rate)[0]
  rows = shape[:-1]
  if math.prod(rows) >= 2 ** 32:
    raise ValueError(f"dropout over {shape}: more than 2**32 rows of counters")
  packed = batch_rows.packed_tokens()
  if packed is not None:
    return _packed_keep(key, shape, rate, *packed)
  row = jnp.zeros((), jnp.uint32) + batch_rows.row_offset(math.prod(rows))
  for axis, size in enumerate(rows):
    stride = math.prod(rows[axis + 1:])
    row = row + jax.lax.broadcasted_iota(jnp.uint32, rows + (1, 1), axis) * np.uint32(stride)
  return _keep(key, row, shape, rate)


def _packed_keep(key: jax.Array, shape: tuple[int, ...], rate: float, places: jax.Array, size: int
                 ) -> jax.Array:
  """keep_mask over packed rows (models/unpad.py): each token draws what its place b * T + t in the padded
  batch [B, T] (`places` int32[R, T]) draws there, for the layouts an encoder drops out: [R, T, X] and
  [R * T, X] (row counter b * T + t), attention probabilities [R, N, T, T] (row counter (b N + n) T + t,
  and the key axis read at each key's padded position t')."""
  packed_rows, width = places.shape
  at = places.astype(jnp.uint32)
  if len(shape) == 3 and shape[:2] == (packed_rows, width):
    row = batch_rows.row_offset(size * width) + at[:, :, None, None]
    return _keep(key, row, shape, rate)
  if len(shape) == 2 and shape[0] == packed_rows * width:
    row = batch_rows.row_offset(size * width) + at.reshape(-1, 1, 1)
    return _keep(key, row, shape, rate)
  if len(shape) == 4 and (shape[0], shape[2], shape[3]) == (packed_rows, width, width):
    heads = shape[1]
    b, t = at // np.uint32(width), at % np.uint32(width)
    head = jax.lax.broadcasted_iota(jnp.uint32, (1, heads, 1), 1)
    row = (b[:, None, :] * np.uint32(heads) + head) * np.uint32(width) + t[:, None, :]
    keep = _keep(key, batch_rows.row_offset(size * heads * width) + row[..., None, None], shape, rate)
    keys = jnp.broadcast_to(t.astype(jnp.int32)[:, None, None, :], shape)  # each key's padded position
    return jnp.take_along_axis(keep, keys, axis=-1)
  raise ValueError(f"dropout over {shape} inside packed rows [{packed_rows}, {width}]: not a token layout")


class Dropout(nn.Module):
  """Inverted dropout with the random bits of `keep_mask`; a drop-in for `nn.Dropout(rate)`."""
  rate: float
  rng_collection: str = "dropout"

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
    if not 0.0 <= self.rate <= 1.0:
      raise ValueError(f"dropout rate must be in [0, 1], got {self.rate}")
    dropped = round(self.rate * 65536)
    if deterministic or dropped == 0:
      return x
    if dropped == 65536:
      return jnp.zeros_like(x)
    keep = keep_mask(self.make_rng(self.rng_collection), x.shape, self.rate)
    scale = jnp.asarray(65536 / (65536 - dropped), x.dtype)
    return jnp.where(keep, x * scale, jnp.zeros_like(x))
