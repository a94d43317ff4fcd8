"""Where attention is computed, for every family: the masks and the backends (`model.attention`).

  dot     jax.nn.dot_product_attention (XLA) with a dense boolean mask: the reference. T x T scores per head
          are materialised, so its memory grows with the square of the length.
  splash  the Pallas TPU kernel of jax.experimental.pallas.ops.tpu.splash_attention: FullMask for global
          layers, LocalMask for windowed ones, SegmentIds for packed documents; blockwise, so its memory
          grows linearly with the length, and blocks outside the window are skipped. It runs inside
          shard_map over the mesh in context (rows over the mesh axes of `batch`, heads over those of
          `heads`, queries over those of `length`: sequence sharding, with keys and values gathered). Off
          TPU it runs in Pallas interpret mode (slow: for tests at small sizes).
  cudnn   jax.nn.dot_product_attention(implementation="cudnn") with the same dense mask (GPUs only;
          cuDNN has no two-sided window or segment ids of its own, so the mask carries both).
  auto    splash where it runs and pays: compiled for TPU, a length of at least 512 that is a multiple of 128
          (shorter, dot's T x T arrays are small and its step is the calibrated one), no causal mask and no
          dropout on the attention probabilities (the model takes its explicit path for that); dot elsewhere. BERT-large's preset uses it with attention dropout 0 (MosaicBERT's and
          ModernBERT's choice), so its 512-token phase keeps no T x T array in HBM (docs/guides/speed.md).

Which keys a query sees: `Segments.ids` int32[B, T] numbers each row's documents 1, 2, ... (1 on every
real token without packing) and holds 0 on padding. A real query attends the real keys of its own
document, within `window` positions either side when windowed (|i - j| <= window). Padding queries
see every real key under dot/cudnn (Hugging Face's key-only padding mask) and the other padding tokens
under splash (padding is a segment of its own there, so no mask row is empty); only real tokens'
outputs are defined.

Shapes: B batch, T length, N heads, D head dim.
"""
from __future__ import annotations

import concurrent.futures
import functools
import math
from typing import Optional, Union

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from bert_jax.errors import UserError

Array = jax.Array
Window = Union[int, Array, None]  # a traced window serves scanned layers of mixed kinds

BACKENDS = ("dot", "splash", "cudnn", "auto")
AUTO_SPLASH_FROM = 512  # `auto`'s shortest splash length
KERNELS = ("splash", "cudnn")  # the backends with no dropout on the attention probabilities
_SPLASH_BLOCKS = (512, 256, 128)  # the largest that divides the length (the kernel tiles by 128 lanes)


@flax.struct.dataclass
class Segments:
  """Which document each token belongs to: ids int32[B, T] (module docstring); `packed`: rows may hold
  several documents (False: one per row, which dot masks more cheaply)."""
  ids: Array
  packed: bool = flax.struct.field(pytree_node=False, default=False)
  causal: bool = flax.struct.field(pytree_node=False, default=False)  # a query sees no key after it (LTR)

  @classmethod
  def of(cls, attention_mask: Array, document_ids: Optional[Array], causal: bool = False) -> "Segments":
    """From the model inputs: the packed documents' ids (0 on padding), or 1 on real tokens."""
    if document_ids is not None:
      return cls(document_ids.astype(jnp.int32), packed=True, causal=causal)
    return cls((attention_mask != 0).astype(jnp.int32), packed=False, causal=causal)

  def dense_mask(self, window: Window = None) -> Array:
    """bool[B, 1, T|1, T]: the keys each query sees (module docstring). Unpacked, unwindowed and not
    causal, the key-padding mask [B, 1, 1, T] (XLA broadcasts it; no T x T array)."""
    keys = self.ids[:, None, :] > 0
    if not self.packed and window is None and not self.causal:
      return keys[:, None]
    queries = self.ids[:, :, None]
    allowed = keys & ((queries == self.ids[:, None, :]) | (queries == 0))
    positions = jnp.arange(self.ids.shape[1])
    if window is not None:
      allowed &= jnp.abs(positions[:, None] - positions[None, :]) <= window
    if self.causal:
      allowed &= positions[None, :] <= positions[:, None]
    return allowed[:, None]


def say_fallback(backend: str, output_attentions: bool, head_mask: Optional[Array]) -> None:
  """The one line that says BERTology's outputs run the explicit (dot) path whatever the backend."""
  if backend in KERNELS and (output_attentions or head_mask is not None):
    print(f"model.attention={backend!r}: attention probabilities and head masks are computed with 'dot'",
          flush=True)


def probabilities(q: Array, k: Array, mask: Array) -> Array:
  """float32[B, N, T, T]: softmax(q k^T / sqrt(D)) over the keys `mask` allows (the explicit path that
  BERTology's attentions, head masks and attention dropout need)."""
  logits = jnp.einsum("btnd,bsnd->bnts", q, k) / jnp.sqrt(q.shape[-1]).astype(q.dtype)
  logits = jnp.where(mask, logits.astype(jnp.float32), jnp.finfo(jnp.float32).min)
  return jax.nn.softmax(logits, axis=-1)


def attend(q: Array, k: Array, v: Array, segments: Segments, *, backend: str, window: Optional[int] = None,
           is_global: Optional[Array] = None) -> Array:
  """Multi-head attention: q, k, v [B, T, N, D] -> [B, T, N, D] (q unscaled).

  window: keys within `window` positions either side (None: all). is_global: a traced bool that, when
  true, lifts the window (scanned layers alternating global and local attention).
  """
  backend = resolve(backend, q.shape[1], segments.causal)
  if backend == "splash":
    if segments.causal:
      raise UserError("model.causal=True masks with 'dot' or 'cudnn': set model.attention='dot'")
    return _splash(q, k, v, segments.ids, window, is_global)
  if is_global is not None:
    window = jnp.where(is_global, q.shape[1], window)
  return jax.nn.dot_product_attention(q, k, v, mask=segments.dense_mask(window),
                                      implementation="cudnn" if backend == "cudnn" else "xla")


def attend_heads_first(q: Array, k: Array, v: Array, segments: Segments, window: Window = None) -> Array:
  """dot's attention in the heads-first layout: q, k, v [B, N, T, D] -> [B, N, T, D] (q unscaled), for
  inference (BertModel's deterministic forward).

  The same attention as `attend(..., backend="dot")` up to float rounding, cheaper on CPU (BENCHMARKS.md,
  "Sentence embeddings", runs 10-): the heads lead, so both matmuls are batched over (B, N) with no
  transposes; q is scaled (T x D products) rather than the logits (T x T); and the softmax's division
  comes after the weighted sum, T x D divisions instead of T x T: exp(l - max) @ v / sum exp(l - max).
  """
  scale = jnp.asarray(q.shape[-1] ** -0.5, q.dtype)
  logits = jnp.einsum("bntd,bnsd->bnts", q * scale, k, preferred_element_type=jnp.float32)
  logits = jnp.where(segments.dense_mask(window), logits, jnp.finfo(jnp.float32).min)
  weights = jnp.exp(logits - jnp.max(logits, axis=-1, keepdims=True))
  total = jnp.sum(weights, axis=-1, keepdims=True)
  out = jnp.einsum("bnts,bnsd->bntd", weights.astype(v.dtype), v, preferred_element_type=jnp.float32)
  return (out / total).astype(v.dtype)


def resolve(backend: str, length: int, causal: bool = False, platform: str | None = None) -> str:
  """The backend that runs: `backend`, or for 'auto' splash where the step is compiled for TPU (`platform`,
  default the target platform), `length` is a multiple of 128 from AUTO_SPLASH_FROM on and the mask is not
  causal, dot otherwise.
  (With attention dropout the models take the explicit dot path before asking.)"""
  if backend != "auto":
    return backend
  platform = platform or target_platform()
  runs = platform == "tpu" and length >= AUTO_SPLASH_FROM and length % 128 == 0 and not causal
  return "splash" if runs else "dot"


def configured(model, length: int, platform: str) -> str:
  """What `model.attention` (a model config or its config section) runs as at `length` tokens on
  `platform`: 'auto' resolved, and dot wherever the attention probabilities take dropout."""
  backend = getattr(model, "attention", "dot")
  if backend == "auto" and getattr(model, "attention_dropout", 0) > 0:
    return "dot"
  return resolve(backend, length, getattr(model, "causal", False), platform)


def check_dropout(backend: str, attention_dropout: float) -> None:
  """UserError when a kernel backend (KERNELS) is set with dropout on the attention probabilities."""
  if backend in KERNELS and attention_dropout > 0:
    raise UserError(f"model.attention={backend!r} has no dropout on the attention probabilities: set "
                    "model.attention_dropout=0 or model.attention='dot'")


def check(model, length: int | None = None, platform: str | None = None) -> None:
  """UserError, before anything is built or written, when `model.attention` (a model config or its config
  section) cannot run on `platform` (default: JAX's here) or at `length` tokens: cudnn off a GPU, splash at a
  length that is not a multiple of 128 or with causal attention, either with dropout on the attention
  probabilities. A family without the field attends with dot."""
  backend = getattr(model, "attention", "dot")
  if backend not in BACKENDS:
    raise UserError(f"model.attention={backend!r} is not one of {BACKENDS}")
  check_dropout(backend, getattr(model, "attention_dropout", 0))
  platform = platform or jax.default_backend()
  if backend == "cudnn" and platform != "gpu":
    here = "'dot' and 'splash'" if platform == "tpu" else "'dot' ('splash' too, in Pallas' slow interpret mode)"
    raise UserError(f"model.attention='cudnn' needs a GPU with cuDNN and the step runs on {platform}: set "
                    f"model.attention to a backend that runs there: {here}")
  if backend == "splash":
    if getattr(model, "causal", False):
      raise UserError("model.causal=True masks with 'dot' or 'cudnn': set model.attention='dot'")
    if length is not None:
      _splash_block(length)


def _splash_block(length: int) -> int:
  for block in _SPLASH_BLOCKS:
    if length % block == 0:
      return block
  raise UserError(f"model.attention='splash' tiles the sequence in blocks of 128 tokens: the length {length} "
                  "is not a multiple of 128; set data.max_seq_length to one, or model.attention='dot'")


@functools.lru_cache(maxsize=64)
def splash_kernel(length: int, heads: int, window: Optional[int], q_shards: int, interpret: bool):
  """The splash kernel for `heads` heads of one row (q: [N, T / q_shards, D], k and v: [N, T, D]): global
  attention, or |i - j| <= window; built once per shape (the mask's block structure is computed in NumPy).

  A global mask is the same for every query block, so each shard of queries gets a kernel of its own
  size; a window moves with the queries, so that kernel is built for all T and split over `q_shards`
  (its mask info then goes through shard_map split by query block: `_kernel_spec`)."""
  # pylint: disable=import-outside-toplevel  (Pallas' TPU ops: imported when a model asks for splash)
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as kernel_lib
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as mask_lib
  windowed = window is not None and window < length
  if windowed:
    one, shards = mask_lib.LocalMask((length, length), (window, window), offset=0, shard_count=q_shards), q_shards
  else:
    one, shards = mask_lib.FullMask((length // q_shards, length)), 1
  block = _splash_block(length // q_shards)
  sizes = kernel_lib.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
                                block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block,
                                block_kv_dq=block)
  make = functools.partial(kernel_lib.make_splash_mha, mask_lib.MultiHeadMask([one] * heads), block_sizes=sizes,
                           head_shards=1, q_seq_shards=shards, interpret=interpret)
  # The factory turns the mask info into jax arrays, which inside a trace would be that trace's tracers
  # (and leak through this cache). JAX's tracing state is per thread: built in a thread of its own, they
  # are concrete, and kept as NumPy they are constants to every later trace.
  with concurrent.futures.ThreadPoolExecutor(1) as pool:
    return jax.tree.map(np.asarray, pool.submit(make).result())


def _kernel_spec(kernel, mesh, seq_axes: tuple[str, ...]):
  """shard_map's spec for a kernel's mask info: every head has the same mask, stored once, so only a
  windowed kernel's query blocks split (over the sequence axes); anything else is replicated."""
  if kernel.fwd_mask_info.q_sequence is None or not seq_axes:
    return P()
  # The kernel reads shard shapes off the sharding, which a mesh with manual axes cannot give.
  plain = mesh.update_axis_types({a: jax.sharding.AxisType.Auto for a in mesh.manual_axes})
  return kernel.manual_sharding_spec(jax.sharding.NamedSharding(plain, P(None, seq_axes)))


def _auto_axes(mesh) -> tuple[str, ...]:
  """The mesh axes still left to XLA: not those of a shard_map this runs inside (the gradient
  accumulation's over the data axes, training/accumulate.py), where each device already has its rows."""
  return () if mesh.empty else tuple(a for a in mesh.axis_names if a not in set(mesh.manual_axes))


def target_platform() -> str:
  """The platform being compiled for: the mesh in context's devices (abstract, so also a TPU topology
  compiled on a CPU host: `bert-jax compile`), else JAX's default backend."""
  mesh = jax.sharding.get_abstract_mesh()
  return jax.default_backend() if mesh.empty else mesh.abstract_device.platform


def _mesh_axes(logical: str, mesh) -> tuple[str, ...]:
  """The mesh axes left to XLA that the logical axis `logical` is split over (the flax logical rules in
  context)."""
  spec = nn.logical_to_mesh_axes((logical,))[0] if not mesh.empty else None
  axes = () if spec is None else (spec,) if isinstance(spec, str) else tuple(spec)
  return tuple(a for a in axes if a in _auto_axes(mesh))


def _splash(q: Array, k: Array, v: Array, segments: Array, window: Optional[int],
            is_global: Optional[Array]) -> Array:
  mesh = jax.sharding.get_abstract_mesh()
  batch, length, heads, head_dim = q.shape
  rows, head_axes, seq_axes = (_mesh_axes(name, mesh) for name in ("batch", "heads", "length"))
  size = lambda axes: math.prod(mesh.shape[a] for a in axes)  # noqa: E731
  if batch % size(rows) or heads % size(head_axes) or length % size(seq_axes):
    raise UserError(f"model.attention='splash': {batch} rows, {heads} heads and {length} positions must split "
                    f"evenly over the mesh axes {rows}, {head_axes} and {seq_axes}")
  interpret = target_platform() != "tpu"
  windows = (window,) if is_global is None else (window, None)  # the second: is_global's
  kernels = [splash_kernel(length, heads, w, size(seq_axes), interpret) for w in windows]
  flag = () if is_global is None else (jnp.asarray(is_global),)
  # [B, T, N, D] -> [B, N, T, D], the kernel's layout; q is scaled here (the kernel does not scale).
  q, k, v = (jnp.swapaxes(x, 1, 2) for x in (q * (head_dim ** -0.5), k, v))
  run = functools.partial(_run_kernels, len(kernels))
  if not _auto_axes(mesh):  # one device, or inside a shard_map manual over every axis
    return jnp.swapaxes(run(q, k, v, segments, segments, *kernels, *flag), 1, 2)
  queries = P(rows or None, head_axes or None, seq_axes or None, None)
  keys = P(rows or None, head_axes or None, None, None)  # every device sees its rows' whole length
  specs = (queries, keys, keys, P(rows or None, seq_axes or None), P(rows or None, None),
           *(_kernel_spec(kernel, mesh, seq_axes) for kernel in kernels), *(P() for _ in flag))
  out = jax.shard_map(run, mesh=mesh, axis_names=set(_auto_axes(mesh)), in_specs=specs, out_specs=queries,
                      check_vma=False)(q, k, v, segments, segments, *kernels, *flag)
  return jnp.swapaxes(out, 1, 2)


def _run_kernels(count: int, q: Array, k: Array, v: Array, q_segments: Array, kv_segments: Array, *rest) -> Array:
  """The first of `count` kernels over each row ([B, N, T, D]), or with a flag after them, the second
  where it is true (lax.cond: a scanned layer's kind)."""
  from jax.experimental.pallas.ops.tpu.splash_attention.splash_attention_kernel import SegmentIds  # pylint: disable=import-outside-toplevel
  kernels, flag = rest[:count], rest[count:]
  calls = [jax.vmap(lambda q, k, v, s, t, kernel=kernel: kernel(q, k, v, segment_ids=SegmentIds(s, t)))
           for kernel in kernels]
  if not flag:
    return calls[0](q, k, v, q_segments, kv_segments)
  return jax.lax.cond(flag[0], calls[1], calls[0], q, k, v, q_segments, kv_segments)
