"""T5 (Raffel et al. 2020) and T5 v1.1: the encoder-decoder, its config and its Flax module (linen).

What differs from BERT: two stacks (an encoder; a decoder with causal self-attention and cross-attention
to the encoder's output), pre-norm layers with scale-only RMS norms and a final norm per stack, no biases,
no position table (a learned bias per relative-position bucket and head, one table per stack, shared by its
layers: bidirectional buckets in the encoder, causal ones in the decoder), no 1/sqrt(d) on the attention
scores (T5 folds it into q's initialisation), and a ReLU (original T5) or gated-GELU (v1.1) feed-forward.
The LM head is the token table (tied; original T5 scales the decoder output by d_model**-0.5 first, as
Hugging Face does) or its own [H, V] kernel (v1.1).

The call: `T5Model(config).apply({"params": p}, input_ids, attention_mask=..., decoder_input_ids=...,
deterministic=True) -> Seq2SeqOutput` (logits [B, S, V], encoder_last_hidden_state [B, T, H],
last_hidden_state: the decoder's [B, S, H]). Packed rows give segment ids (1, 2, ... per document, 0 for
padding) instead of masks: a token sees only its own document's (the decoder: and its earlier) tokens.
`encode` and `decode` are the two halves, for generation (models/t5_decode.py).

Shapes: B batch, T encoder length, S decoder length, N heads, D head dim (d_kv), H d_model, F d_ff, V vocab.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Mapping, Optional

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax import config_schema
from bert_jax.errors import UserError
from bert_jax.models.bert import constrain_hidden, heads_out, lookup, on_rows
from bert_jax.models.activations import REMAT_POLICIES
from bert_jax.models.config import FamilyConfig, check_choices
from bert_jax.models.dropout import Dropout

Array = jax.Array

_CHOICES = {"feed_forward": ("relu", "gated-gelu", "gated-relu")}
# Hugging Face's "gated-gelu" is gelu_new (the tanh approximation), as mesh-tensorflow's T5 v1.1.
_ACTIVATIONS = {"relu": jax.nn.relu, "gated-relu": jax.nn.relu,
                "gated-gelu": functools.partial(jax.nn.gelu, approximate=True)}


@dataclasses.dataclass(frozen=True)
class T5Config(FamilyConfig):
  """T5's hyper-parameters. Defaults are T5 v1.1 small (google/t5-v1_1-small).

  hidden_size: d_model; head_dim: d_kv (T5's heads need not split d_model); intermediate_size: d_ff.
  num_decoder_layers: 0 means as many as num_layers.
  feed_forward: relu (original T5) | gated-gelu (v1.1) | gated-relu.
  tie_word_embeddings: the LM head is the token table (else its own kernel, lm_head/kernel).
  scale_decoder_outputs: multiply the decoder's output by hidden_size**-0.5 before the LM head (original T5).
  relative_buckets / relative_max_distance: the relative-position buckets (HF's relative_attention_num_buckets,
    relative_attention_max_distance).
  max_position_embeddings: the longest input accepted (T5 itself has no position table).
  decoder_start_token_id / eos_token_id / pad_token_id: T5's 0 (pad starts the decoder), 1, 0.
  """
  FAMILY_NAME = "T5"
  vocab_size: int = 32128
  hidden_size: int = 512
  num_layers: int = 8
  num_decoder_layers: int = 0
  num_heads: int = 6
  head_dim: int = 64
  intermediate_size: int = 1024
  feed_forward: str = "gated-gelu"
  tie_word_embeddings: bool = False
  scale_decoder_outputs: bool = False
  relative_buckets: int = 32
  relative_max_distance: int = 128
  max_position_embeddings: int = 512
  norm_eps: float = 1e-6
  dropout: float = 0.0
  initializer_factor: float = 1.0
  pad_token_id: int = 0
  eos_token_id: int = 1
  decoder_start_token_id: int = 0
  dtype: str = "float32"
  param_dtype: str = "float32"
  remat: str = "none"
  scan_layers: bool = True
  scan_unroll: int = 1
  family: str = "t5"

  # What code shared with BERT's family asks of a config.
  sentence_head = "none"
  rtd_head = False
  share_layers = "none"
  attention = "dot"

  def __post_init__(self):
    config_schema.check_block("model", self)  # the plain fields' ranges
    check_choices(self, _CHOICES)
    if self.num_decoder_layers < 0:
      raise UserError(f"model.num_decoder_layers must be >= 0 (0: as many as num_layers), got {self.num_decoder_layers}")
    if self.family != "t5":
      raise UserError(f"model.family={self.family!r}: this is T5's config")

  @property
  def decoder_layers(self) -> int:
    return self.num_decoder_layers or self.num_layers

  @property
  def initializer_range(self) -> float:  # what fine-tuning heads built on the family read
    return self.initializer_factor * self.hidden_size ** -0.5

  @property
  def embed_dim(self) -> int:
    return self.hidden_size

  @property
  def gated(self) -> bool:
    return self.feed_forward.startswith("gated-")


def backbone_params(model: Mapping[str, Any]) -> int:
  """Every parameter of a model section's sizes (`bert-jax presets`): token table, both stacks with their
  relative-position tables and norms, and the untied LM head."""
  h, f, v = model["hidden_size"], model["intermediate_size"], model["vocab_size"]
  inner = model["num_heads"] * model["head_dim"]
  attention = 4 * h * inner
  ff = (3 if str(model["feed_forward"]).startswith("gated-") else 2) * h * f
  encoder = model["num_layers"] * (attention + ff + 2 * h) + h
  decoder = (model["num_decoder_layers"] or model["num_layers"]) * (2 * attention + ff + 3 * h) + h
  relative = 2 * model["relative_buckets"] * model["num_heads"]
  head = 0 if model["tie_word_embeddings"] else h * v
  return v * h + encoder + decoder + relative + head


def relative_position_bucket(relative_position: Array, bidirectional: bool, num_buckets: int,
                             max_distance: int) -> Array:
  """T5's bucket of each relative position (memory - query): exact up to num_buckets/2 (per direction when
  bidirectional), log-spaced beyond, all >= max_distance in the last. int32 of the same shape."""
  buckets = jnp.zeros_like(relative_position)
  if bidirectional:
    num_buckets //= 2
    buckets += (relative_position > 0).astype(jnp.int32) * num_buckets
    relative_position = jnp.abs(relative_position)
  else:
    relative_position = -jnp.minimum(relative_position, 0)
  max_exact = num_buckets // 2
  is_small = relative_position < max_exact
  large = max_exact + (jnp.log(jnp.maximum(relative_position, 1).astype(jnp.float32) / max_exact)
                       / math.log(max_distance / max_exact) * (num_buckets - max_exact)).astype(jnp.int32)
  large = jnp.minimum(large, num_buckets - 1)
  return buckets + jnp.where(is_small, relative_position, large)


def _normal(std: float, axes: tuple):
  return nn.with_logical_partitioning(nn.initializers.normal(std), axes)


def _weight(module: nn.Module, cfg: T5Config, name: str, shape: tuple, axes: tuple, std: float) -> Array:
  return module.param(name, _normal(cfg.initializer_factor * std, axes), shape, cfg.weight_dtype
                      ).astype(cfg.compute_dtype)


class RMSNorm(nn.Module):
  """T5's layer norm: x / sqrt(mean(x^2) + eps) * scale (no mean subtracted, no bias), in float32."""
  config: T5Config

  @nn.compact
  def __call__(self, x: Array) -> Array:
    cfg = self.config
    scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones_init(), ("norm",)),
                       (cfg.hidden_size,), cfg.weight_dtype)
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + cfg.norm_eps)
    return (y * scale.astype(jnp.float32)).astype(cfg.compute_dtype)


class RelativeBias(nn.Module):
  """A stack's table [buckets, N] -> the bias [1, N, Tq, Tk] of query i attending to key j (j - i's bucket)."""
  config: T5Config
  bidirectional: bool

  @nn.compact
  def __call__(self, q_len: int, k_len: int) -> Array:
    cfg = self.config
    table = self.param("embedding", _normal(cfg.initializer_factor * cfg.hidden_size ** -0.5, (None, "heads")),
                       (cfg.relative_buckets, cfg.num_heads), cfg.weight_dtype)
    relative = jnp.arange(k_len, dtype=jnp.int32)[None, :] - jnp.arange(q_len, dtype=jnp.int32)[:, None]
    buckets = relative_position_bucket(relative, self.bidirectional, cfg.relative_buckets, cfg.relative_max_distance)
    return jnp.take(table.astype(jnp.float32), buckets, axis=0).transpose(2, 0, 1)[None]


class Attention(nn.Module):
  """Multi-head attention without biases or score scaling: query/key/value [H, N, D], out [N, D, H].

  mask: bool [B, 1, Tq, Tk] (True: may attend); bias: float32 [1, N, Tq, Tk] or None.
  """
  config: T5Config

  @nn.compact
  def __call__(self, x: Array, memory: Array, mask: Array, bias: Optional[Array], deterministic: bool) -> Array:
    cfg = self.config
    n, d, h = cfg.num_heads, cfg.head_dim, cfg.hidden_size
    axes = ("embed", "heads", "kv")
    q = on_rows(lambda r: jnp.einsum("...h,hnd->...nd", r, _weight(self, cfg, "query", (h, n, d), axes, (h * d) ** -0.5)), x)
    k = on_rows(lambda r: jnp.einsum("...h,hnd->...nd", r, _weight(self, cfg, "key", (h, n, d), axes, h ** -0.5)), memory)
    v = on_rows(lambda r: jnp.einsum("...h,hnd->...nd", r, _weight(self, cfg, "value", (h, n, d), axes, h ** -0.5)),
                memory)
    scores = jnp.einsum("btnd,bsnd->bnts", q, k).astype(jnp.float32)
    if bias is not None:
      scores = scores + bias
    scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
    weights = jax.nn.softmax(scores, axis=-1).astype(cfg.compute_dtype)
    weights = Dropout(cfg.dropout)(weights, deterministic=deterministic)
    y = jnp.einsum("bnts,bsnd->btnd", weights, v)
    return heads_out(y, _weight(self, cfg, "out", (n, d, h), ("heads", "kv", "embed"), (n * d) ** -0.5))


class FeedForward(nn.Module):
  """wo(act(x wi)) or, gated, wo(act(x wi_0) * (x wi_1)): kernels [H, F] in, [F, H] out."""
  config: T5Config

  @nn.compact
  def __call__(self, x: Array, deterministic: bool) -> Array:
    cfg = self.config
    h, f = cfg.hidden_size, cfg.intermediate_size
    act = _ACTIVATIONS[cfg.feed_forward]

    def dense_in(name):
      kernel = _weight(self, cfg, name, (h, f), ("embed", "mlp"), h ** -0.5)
      return on_rows(lambda r: jnp.einsum("...h,hf->...f", r, kernel), x)

    y = act(dense_in("wi_0")) * dense_in("wi_1") if cfg.gated else act(dense_in("wi"))
    y = Dropout(cfg.dropout)(y, deterministic=deterministic)
    wo = _weight(self, cfg, "wo", (f, h), ("mlp", "embed"), f ** -0.5)
    return on_rows(lambda r: jnp.einsum("...f,fh->...h", r, wo), y)


class EncoderLayer(nn.Module):
  """x += Attn(norm(x)); x += FF(norm(x)). Returns (x, None), the pair nn.scan expects."""
  config: T5Config

  @nn.compact
  def __call__(self, x: Array, mask: Array, bias: Array, deterministic: bool):
    cfg = self.config
    drop = Dropout(cfg.dropout)
    normed = RMSNorm(cfg, name="attention_norm")(x)
    x = x + drop(Attention(cfg, name="attention")(normed, normed, mask, bias, deterministic), deterministic=deterministic)
    y = FeedForward(cfg, name="mlp")(RMSNorm(cfg, name="mlp_norm")(x), deterministic)
    return constrain_hidden(x + drop(y, deterministic=deterministic)), None


class DecoderLayer(nn.Module):
  """x += SelfAttn(norm(x)) (causal); x += CrossAttn(norm(x), encoder); x += FF(norm(x))."""
  config: T5Config

  @nn.compact
  def __call__(self, x: Array, encoded: Array, self_mask: Array, cross_mask: Array, bias: Array,
               deterministic: bool):
    cfg = self.config
    drop = Dropout(cfg.dropout)
    normed = RMSNorm(cfg, name="self_attention_norm")(x)
    y = Attention(cfg, name="self_attention")(normed, normed, self_mask, bias, deterministic)
    x = x + drop(y, deterministic=deterministic)
    normed = RMSNorm(cfg, name="cross_attention_norm")(x)
    y = Attention(cfg, name="cross_attention")(normed, encoded, cross_mask, None, deterministic)
    x = x + drop(y, deterministic=deterministic)
    y = FeedForward(cfg, name="mlp")(RMSNorm(cfg, name="mlp_norm")(x), deterministic)
    return constrain_hidden(x + drop(y, deterministic=deterministic)), None


def _run_layers(module: nn.Module, layer_cls, cfg: T5Config, count: int, x: Array, *args):
  """`count` layers of `layer_cls` over x: scanned (params stacked under `layers`) or unrolled (layer_{i});
  remat per cfg.remat. args: broadcast to every layer (the last one: deterministic, static)."""
  static = len(args) + 1
  if cfg.remat != "none":
    layer_cls = nn.remat(layer_cls, policy=REMAT_POLICIES[cfg.remat], prevent_cse=not cfg.scan_layers,
                         static_argnums=(static,))
  if cfg.scan_layers:
    scanned = nn.scan(layer_cls, variable_axes={"params": 0}, split_rngs={"params": True, "dropout": True},
                      in_axes=(nn.broadcast,) * len(args), length=count, unroll=min(cfg.scan_unroll, count),
                      metadata_params={nn.PARTITION_NAME: "layers"})
    x, _ = scanned(cfg, name="layers")(x, *args)
    return x
  for i in range(count):
    x, _ = layer_cls(cfg, name=f"layer_{i}")(x, *args)
  return x


def _mask(q_segments: Optional[Array], k_segments: Array, causal: bool = False) -> Array:
  """bool [B, 1, Tq, Tk]: keys that are real (segment > 0), in the query's segment when q_segments is given
  (packed rows), and not after the query when causal."""
  mask = (k_segments > 0)[:, None, None, :]
  if q_segments is not None:
    mask = mask & (q_segments[:, None, :, None] == k_segments[:, None, None, :])
  if causal:  # queries and keys are the same positions
    s = k_segments.shape[-1]
    mask = mask & (jnp.arange(s)[None, :] <= jnp.arange(s)[:, None])[None, None]
  return mask


class Encoder(nn.Module):
  config: T5Config

  @nn.compact
  def __call__(self, x: Array, segments: Array, packed: bool, deterministic: bool) -> Array:
    cfg = self.config
    bias = RelativeBias(cfg, True, name="relative_bias")(x.shape[1], x.shape[1])
    mask = _mask(segments if packed else None, segments)
    x = Dropout(cfg.dropout)(x, deterministic=deterministic)
    x = _run_layers(self, EncoderLayer, cfg, cfg.num_layers, x, mask, bias, deterministic)
    return Dropout(cfg.dropout)(RMSNorm(cfg, name="final_norm")(x), deterministic=deterministic)


class Decoder(nn.Module):
  config: T5Config

  @nn.compact
  def __call__(self, y: Array, encoded: Array, segments: Array, encoder_segments: Array, packed: bool,
               deterministic: bool) -> Array:
    cfg = self.config
    bias = RelativeBias(cfg, False, name="relative_bias")(y.shape[1], y.shape[1])
    self_mask = _mask(segments if packed else None, segments if packed else jnp.ones_like(segments), causal=True)
    cross_mask = _mask(segments if packed else None, encoder_segments)
    y = Dropout(cfg.dropout)(y, deterministic=deterministic)
    y = _run_layers(self, DecoderLayer, cfg, cfg.decoder_layers, y, encoded, self_mask, cross_mask, bias,
                    deterministic)
    return Dropout(cfg.dropout)(RMSNorm(cfg, name="final_norm")(y), deterministic=deterministic)


@flax.struct.dataclass
class Seq2SeqOutput:
  """logits: float32 [B, S, V]; encoder_last_hidden_state: [B, T, H]; last_hidden_state: the decoder's final
  norm output [B, S, H]."""
  logits: Array
  encoder_last_hidden_state: Array
  last_hidden_state: Optional[Array] = None


class T5Model(nn.Module):
  """T5's encoder-decoder with its LM head (T5ForConditionalGeneration)."""
  config: T5Config

  def setup(self):
    cfg = self.config
    self.shared = nn.Embed(cfg.vocab_size, cfg.hidden_size, dtype=cfg.compute_dtype, param_dtype=cfg.weight_dtype,
                           embedding_init=_normal(cfg.initializer_factor, ("vocab", "embed")))
    self.encoder = Encoder(cfg)
    self.decoder = Decoder(cfg)
    if not cfg.tie_word_embeddings:
      # t5x's initialisation (fan-in variance scaling), not HF's std 1.0, which starts v1.1 far from uniform.
      self.lm_head = self.param("lm_head", _normal(cfg.initializer_factor * cfg.hidden_size ** -0.5,
                                                   ("embed", "vocab")), (cfg.hidden_size, cfg.vocab_size),
                                cfg.weight_dtype)

  def __call__(self, input_ids: Array, attention_mask: Optional[Array] = None,
               decoder_input_ids: Optional[Array] = None, decoder_attention_mask: Optional[Array] = None,
               encoder_segment_ids: Optional[Array] = None, decoder_segment_ids: Optional[Array] = None, *,
               deterministic: bool = True) -> Seq2SeqOutput:
    """input_ids, attention_mask: int32[B, T]; decoder_input_ids: int32[B, S] (input_ids when None, so that
    `init(rng, input_ids)` builds every parameter). decoder_attention_mask is accepted for Hugging Face's
    call and unused (the causal mask already hides later positions; padded positions' outputs are not read).
    encoder_segment_ids / decoder_segment_ids: int32[B, T] / [B, S], packed rows' documents (1, 2, ...; 0
    padding), in place of the masks."""
    del decoder_attention_mask
    encoded = self.encode(input_ids, attention_mask, encoder_segment_ids, deterministic=deterministic)
    if decoder_input_ids is None:
      decoder_input_ids = input_ids
    enc_segments = self._segments(input_ids, attention_mask, encoder_segment_ids)
    hidden = self._decode_hidden(decoder_input_ids, encoded, enc_segments, decoder_segment_ids, deterministic)
    return Seq2SeqOutput(logits=self._logits(hidden), encoder_last_hidden_state=encoded, last_hidden_state=hidden)

  @staticmethod
  def _segments(ids: Array, mask: Optional[Array], segments: Optional[Array]) -> Array:
    if segments is not None:
      return segments
    return jnp.ones_like(ids) if mask is None else mask.astype(jnp.int32)

  def encode(self, input_ids: Array, attention_mask: Optional[Array] = None,
             encoder_segment_ids: Optional[Array] = None, *, deterministic: bool = True) -> Array:
    """The encoder's output [B, T, H]."""
    if input_ids.ndim != 2:
      raise ValueError(f"input_ids must be [batch, length], got shape {input_ids.shape}")
    segments = self._segments(input_ids, attention_mask, encoder_segment_ids)
    x = constrain_hidden(lookup(self.shared, input_ids, ("vocab", None)))
    return self.encoder(x, segments, encoder_segment_ids is not None, deterministic)

  def decode(self, decoder_input_ids: Array, encoded: Array, attention_mask: Optional[Array] = None,
             *, deterministic: bool = True) -> Array:
    """float32 logits [B, S, V] of the decoder over `encoded` (unpacked rows; attention_mask: the encoder's)."""
    segments = self._segments(encoded[..., 0], attention_mask, None)
    return self._logits(self._decode_hidden(decoder_input_ids, encoded, segments, None, deterministic))

  def _decode_hidden(self, decoder_input_ids, encoded, enc_segments, decoder_segment_ids, deterministic):
    y = constrain_hidden(lookup(self.shared, decoder_input_ids, ("vocab", None)))
    segments = decoder_segment_ids if decoder_segment_ids is not None else jnp.ones_like(decoder_input_ids)
    return self.decoder(y, encoded, segments, enc_segments, decoder_segment_ids is not None, deterministic)

  def _logits(self, hidden: Array) -> Array:
    cfg = self.config
    if cfg.scale_decoder_outputs:
      hidden = hidden * (cfg.hidden_size ** -0.5)
    if cfg.tie_word_embeddings:
      return self.shared.attend(hidden).astype(jnp.float32)
    kernel = self.lm_head.astype(cfg.compute_dtype)
    return on_rows(lambda r: jnp.einsum("...h,hv->...v", r, kernel), hidden).astype(jnp.float32)
