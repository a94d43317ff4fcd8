"""Int8 weights and int8 matmuls: per-channel weight quantization, its inverse, and the int8 model.

Stored form. Every matmul weight and embedding table becomes {"qvalue": int8, "scale": float32}:
symmetric, per output channel, absmax calibration (qwix.quantize): scale = max|w| / 127.5 over the
contracted axes, qvalue = clip(round(w / scale), -128, 127), so |w - qvalue * scale| <= scale / 2.
The scale keeps the weight's rank (1 on the contracted axes), so dequantizing is one broadcast
product and needs no qwix. Contracted axes, by the parameter's name (a scanned encoder adds a leading
`layers` axis, which is then per-channel too):
  query/key/value kernel [H, N, D]      H          (each head's each output unit its own scale)
  out kernel             [N, D, H]      N, D
  other Dense kernels    [In, Out]      In         (FFN, pooler, classifier, embedding projection)
  embedding tables       [V, E]         E          (one scale per row: per token, position, type)
Biases, LayerNorm and the layer-mix weights stay float32 (a few KiB).

Int8 compute (`int8_model`): qwix's quantized-training provider around a linen model quantizes both
operands of every dot_general and einsum in its forward pass, dynamically (per-channel absmax of
each call's operands), and runs the product as an int8 x int8 -> int32 dot_general; the backward
pass is the straight-through estimator (the gradient of the float product, qwix's
use_original_residuals). The same wrapper serves Q8BERT's quantization-aware fine-tuning
(train.qat) and int8 inference of a quantized checkpoint (quantization.activations="int8"). With
float weights already on the int8 grid, requantizing them gives the stored values back up to the
extreme value's rounding (qwix's scale rounds on 127.5).
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from etils import epath

from bert_jax.errors import require

QUANTIZED_LEAF = ("qvalue", "scale")


def require_qwix(purpose: str):
  return require("qwix", "quantize", purpose)


def contracted_axes(path: tuple[str, ...], ndim: int) -> tuple[int, ...] | None:
  """The axes a matmul weight contracts (the rest get their own scale), or None to keep it float."""
  if path[-1] == "embedding" and ndim >= 2:
    return (ndim - 1,)
  if path[-1] != "kernel" or ndim < 2:
    return None
  if path[-2] in ("query", "key", "value"):
    return (ndim - 3,)
  if path[-2] == "out" and ndim >= 3:
    return (ndim - 3, ndim - 2)
  return (ndim - 2,)


def is_quantized_leaf(node: Any) -> bool:
  return isinstance(node, dict) and set(node) == set(QUANTIZED_LEAF)


def quantize_params_at(node: Any, path: tuple[str, ...]) -> Any:
  """One leaf at `path`: {"qvalue": int8, "scale": f32} for a matmul weight, else the leaf itself."""
  axes = contracted_axes(path, np.ndim(node))
  if axes is None:
    return node
  qwix = require_qwix("int8 quantization")
  channels = tuple(a for a in range(np.ndim(node)) if a not in axes)
  q = qwix.quantize(jnp.asarray(node, jnp.float32), jnp.int8, channelwise_axes=channels)
  return {"qvalue": np.asarray(q.qvalue), "scale": np.asarray(q.scale, np.float32)}


def quantize_params(params: Any) -> Any:
  """The params tree (numpy or jax leaves) with every matmul weight as {"qvalue": int8, "scale": f32}."""
  require_qwix("int8 quantization")

  def visit(node, path):
    if isinstance(node, dict):
      return {k: visit(v, path + (k,)) for k, v in node.items()}
    return quantize_params_at(node, path)

  return visit(params, ())


def dequantize_params(params: Any) -> Any:
  """The inverse of quantize_params (float32 weights on the int8 grid); other leaves as they are."""
  if is_quantized_leaf(params):
    return np.asarray(params["qvalue"], np.float32) * np.asarray(params["scale"], np.float32)
  if isinstance(params, dict):
    return {k: dequantize_params(v) for k, v in params.items()}
  return params


def int8_model(model):
  """`model` (a linen Module) with int8 dot_generals and einsums: dynamic per-channel quantization of
  both operands forward, straight-through gradients backward (see the module docstring)."""
  qwix = require_qwix("int8 compute (train.qat, quantized inference)")
  rule = qwix.QtRule(module_path=".*", weight_qtype=jnp.int8, act_qtype=jnp.int8)
  return qwix.quantize_model(model, qwix.QtProvider([rule]))


def tree_bytes(params: Any) -> int:
  """Bytes of the arrays in a params tree (what the checkpoint stores, before orbax's metadata)."""
  return int(sum(np.asarray(x).nbytes for x in jax.tree.leaves(params)))


def directory_bytes(directory: epath.PathLike) -> int:
  """Bytes of every file under `directory` (a checkpoint on disk, metadata included)."""
  directory = epath.Path(directory)
  return int(sum(directory_bytes(p) if p.is_dir() else p.stat().length for p in directory.iterdir()))
