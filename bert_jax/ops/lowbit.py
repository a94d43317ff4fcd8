"""Group-wise weights of 2, 3, 4 or 8 bits, packed into bytes (Q-BERT's storage; compress/qbert.py).

Quantization. A weight's output units (the axes its matmul keeps, ops/int8.py:contracted_axes) are
cut into contiguous groups, each with one scale over its rows and every contracted axis: symmetric,
absmax calibration through qwix (qwix.quantize with tiled_axes), scale = max|w| / (2**(b-1) - 0.5),
q = clip(round(w / scale), -2**(b-1), 2**(b-1) - 1), so |w - q * scale| <= scale / 2. The output axes
are grouped outermost first (`group_count`): for the query/key/value kernels [H, N, D] that is the
heads, so groups never straddle two heads (groups = N: one scale per head; 2N: two per head).

Storage. qwix 0.1.8 quantizes to int2/int3/int4 (its qvalue is an int4-typed array) but has no packed
storage: its arrays, like ml_dtypes' int4 in NumPy, hold one value per byte, so a 2-bit weight would
take as many bytes as an int8 one. The packing is therefore written here, in NumPy: the values,
offset to unsigned (q + 2**(b-1)), are written as one little-endian bit stream, b bits each
(np.packbits). For 4 and 2 bits that is two or four values per byte (the first in the low bits); 3-bit
values run across byte boundaries, 8 values in 3 bytes, so 3 bits cost exactly 3 bits a value.

A packed leaf is {"packed": uint8[bytes], "scale": float32[G] or [L, G], "bits": int32[] or [L],
"shape": int32[ndim]}. A scanned encoder's stacked leaf ([L, ...], a leading layers axis) has one bit
width per layer: "bits" is then [L], "scale" [L, G], and "packed" holds the layers' byte streams one
after another, each starting on a byte. `dequantize_params` turns packed leaves and int8 ones
(ops/int8.py) back into float32 weights on their grids; compute then runs in float (no sub-8-bit
kernels here).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import jax.numpy as jnp
import numpy as np

from bert_jax.ops import int8

BITS = (2, 3, 4, 8)
PACKED_LEAF = ("packed", "scale", "bits", "shape")


def _qtype(bits: int):
  if bits not in BITS:
    raise ValueError(f"{bits} bits is not one of {BITS}")
  return {8: jnp.int8, 4: jnp.int4}.get(bits, f"int{bits}")


def pack(values: np.ndarray, bits: int) -> np.ndarray:
  """Signed b-bit integers -> uint8[ceil(n * bits / 8)], a little-endian stream of b bits a value."""
  unsigned = (np.asarray(values, np.int16).reshape(-1) + (1 << (bits - 1))).astype(np.uint8)
  stream = np.unpackbits(unsigned[:, None], axis=1, bitorder="little")[:, :bits]
  return np.packbits(stream.reshape(-1), bitorder="little")


def unpack(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
  """The inverse of `pack`: `count` signed integers (int8)."""
  stream = np.unpackbits(np.asarray(packed, np.uint8), bitorder="little")[:count * bits].reshape(count, bits)
  unsigned = (stream.astype(np.int16) << np.arange(bits, dtype=np.int16)).sum(axis=1)
  return (unsigned - (1 << (bits - 1))).astype(np.int8)


def packed_bytes(count: int, bits: int) -> int:
  return -(-count * bits // 8)


def _largest_divisor(n: int, at_most: int) -> int:
  return max(d for d in range(1, min(n, max(at_most, 1)) + 1) if n % d == 0)


def group_count(output_sizes: Sequence[int], groups: int) -> int:
  """Groups of a weight whose output axes have these sizes: at most `groups`, outer axes split first
  (an axis is cut further only once each group holds at most one of its outer axis's entries)."""
  count = 1
  for size in output_sizes:
    if count * size <= groups:
      count *= size
    else:
      return count * _largest_divisor(size, groups // count)
  return count


def _layout(shape: Sequence[int], contracted: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
  """(the transpose putting output axes first, their sizes) for a one-layer weight."""
  outputs = tuple(a for a in range(len(shape)) if a not in contracted)
  return outputs + tuple(contracted), tuple(shape[a] for a in outputs)


def quantize_weight(w: np.ndarray, contracted: Sequence[int], bits: int, groups: int
                    ) -> tuple[np.ndarray, np.ndarray]:
  """One layer's weight -> (its packed values, float32[G] scales); G = group_count(...)."""
  qwix = int8.require_qwix(f"{bits}-bit quantization")
  order, out_sizes = _layout(w.shape, contracted)
  matrix = np.transpose(np.asarray(w, np.float32), order).reshape(math.prod(out_sizes), -1)
  count = group_count(out_sizes, groups)
  q = qwix.quantize(jnp.asarray(matrix), _qtype(bits), tiled_axes={0: matrix.shape[0] // count})
  return pack(np.asarray(q.qvalue, np.int8), bits), np.asarray(q.scale, np.float32).reshape(count)


def dequantize_weight(packed: np.ndarray, scale: np.ndarray, bits: int, shape: Sequence[int],
                      contracted: Sequence[int]) -> np.ndarray:
  """The inverse of quantize_weight: float32[shape] on the weight's grid."""
  order, out_sizes = _layout(shape, contracted)
  q = unpack(packed, bits, math.prod(shape)).reshape(len(scale), -1)
  matrix = q.astype(np.float32) * np.asarray(scale, np.float32)[:, None]
  return np.transpose(matrix.reshape(out_sizes + tuple(shape[a] for a in contracted)), np.argsort(order))


def _packed_leaf(w: np.ndarray, contracted: Sequence[int], bits: int | Sequence[int], groups: int) -> dict:
  if np.ndim(bits) == 0:
    packed, scale = quantize_weight(w, contracted, int(bits), groups)
  else:  # a stacked leaf: each layer its own bit width, its own byte stream
    parts = [quantize_weight(layer, contracted, int(b), groups) for layer, b in zip(w, bits, strict=True)]
    packed, scale = np.concatenate([p for p, _ in parts]), np.stack([s for _, s in parts])
  return {"packed": packed, "scale": scale, "bits": np.asarray(bits, np.int32),
          "shape": np.asarray(np.shape(w), np.int32)}


def _dequantize_packed(leaf: dict, path: tuple[str, ...]) -> np.ndarray:
  bits, shape = np.asarray(leaf["bits"]), tuple(int(s) for s in leaf["shape"])
  if bits.ndim == 0:
    return dequantize_weight(leaf["packed"], leaf["scale"], int(bits), shape,
                             int8.contracted_axes(path, len(shape)))
  contracted = int8.contracted_axes(path, len(shape) - 1)
  layers, start, size = [], 0, math.prod(shape[1:])
  for b, scale in zip(bits, np.asarray(leaf["scale"])):
    end = start + packed_bytes(size, int(b))
    layers.append(dequantize_weight(np.asarray(leaf["packed"])[start:end], scale, int(b), shape[1:], contracted))
    start = end
  return np.stack(layers)


def is_packed_leaf(node: Any) -> bool:
  return isinstance(node, dict) and set(node) == set(PACKED_LEAF)


def quantize_params(params: Any, bits_of: Callable[[tuple[str, ...]], int | Sequence[int] | None],
                    groups: int) -> Any:
  """The params tree with every matmul weight quantized: packed where `bits_of(path)` gives its bit
  width (a list: a stacked leaf's, per layer), int8 per channel (ops/int8.py) where it gives None."""
  def visit(node, path):
    if isinstance(node, dict):
      return {k: visit(v, path + (k,)) for k, v in node.items()}
    bits = bits_of(path)
    if bits is None or int8.contracted_axes(path, np.ndim(node)) is None:
      return int8.quantize_params_at(node, path)
    stacked = np.ndim(bits) > 0
    return _packed_leaf(np.asarray(node), int8.contracted_axes(path, np.ndim(node) - stacked), bits, groups)

  return visit(params, ())


def dequantize_params(params: Any, path: tuple[str, ...] = ()) -> Any:
  """Packed and int8 leaves -> float32 weights on their grids; the other leaves as they are."""
  if is_packed_leaf(params):
    return _dequantize_packed(params, path)
  if isinstance(params, dict) and not int8.is_quantized_leaf(params):
    return {k: dequantize_params(v, path + (k,)) for k, v in params.items()}
  return int8.dequantize_params(params)
