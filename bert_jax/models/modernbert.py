"""ModernBERT (Warner et al. 2024): its config and its encoder with the MLM head (Flax linen).

What differs from BERT: no position table (rotary embeddings, theta per layer kind), pre-LN layers
(layer 0 reads the normalised embeddings directly) and a final norm, GeGLU feed-forward, no biases
(LayerNorms without bias; the tied MLM decoder keeps its bias), and global attention every
`global_every` layers with a window of +-local_window/2 tokens elsewhere (Hugging Face's
`local_attention` is the whole width: 128 -> 64 either side).

The call and its outputs are BertModel's (`bert.ModelOutput`), so objectives, analysis and the
fine-tuning heads take either. Token types are accepted and ignored. With `use_pooler`, the pooled
output is Hugging Face's ModernBertPredictionHead (dense, activation, norm) over the [CLS] vector or
the mean of the real tokens (`pooling`): what its sequence classifier reads.

Scanned layers share one parameter shape, so the layer kind is data: each layer gets its index and
picks its window and theta from it (jnp.where under dot/cudnn, lax.cond between the two splash kernels).
Every layer has an `attention_norm`, layer 0's unused (Hugging Face's identity there).

Shapes: B batch, T length, N heads, D head dim, H hidden, F intermediate, V vocab, L layers.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax import config_schema
from bert_jax.errors import UserError
from bert_jax.models import activations, attention, batch_rows, rope, unpad
from bert_jax.models.activations import ACTIVATIONS, REMAT_POLICIES
from bert_jax.models.bert import (ModelOutput, constrain_hidden, gather_positions, heads_out, layer_head_mask,
                                  lookup, on_rows, tied_logits)
from bert_jax.models.config import FamilyConfig, check_choices
from bert_jax.models.dropout import Dropout

Array = jax.Array

_CHOICES = {"hidden_act": activations.NAMES, "head_act": activations.NAMES, "pooling": ("cls", "mean"),
            "attention": attention.BACKENDS}


@dataclasses.dataclass(frozen=True)
class ModernBertConfig(FamilyConfig):
  """ModernBERT's hyper-parameters. Defaults are ModernBERT-base (answerdotai/ModernBERT-base).

  local_window: the whole width of a local layer's window (Hugging Face's local_attention): a token
    sees those within local_window // 2 positions either side.
  global_every: layers 0, n, 2n, ... attend globally (global_attn_every_n_layers).
  global_rope_theta / local_rope_theta: the rotary base of each kind of layer.
  use_pooler / pooling: the [CLS] or mean-pooled prediction head that sequence classification reads.
  attention: dot | splash | cudnn (bert_jax/models/attention.py).
  remat, scan_layers, scan_unroll, dtype, param_dtype: as for BERT (bert_jax/models/config.py).
  """
  FAMILY_NAME = "ModernBERT"  # not a field (no annotation): the name its config errors use
  vocab_size: int = 50368
  hidden_size: int = 768
  num_layers: int = 22
  num_heads: int = 12
  intermediate_size: int = 1152
  max_position_embeddings: int = 8192
  local_window: int = 128
  global_every: int = 3
  global_rope_theta: float = 160_000.0
  local_rope_theta: float = 10_000.0
  norm_eps: float = 1e-5
  hidden_act: str = "gelu"
  head_act: str = "gelu"
  embedding_dropout: float = 0.0
  attention_dropout: float = 0.0
  mlp_dropout: float = 0.0
  initializer_range: float = 0.02
  initializer_cutoff_factor: float = 2.0
  pad_token_id: int = 50283
  mlm_head: bool = True
  use_pooler: bool = False
  pooling: str = "cls"
  dtype: str = "float32"
  param_dtype: str = "float32"
  remat: str = "none"
  scan_layers: bool = True
  scan_unroll: int = 1
  attention: str = "dot"
  family: str = "modernbert"

  # What code shared with BERT's family asks of a config: its pretraining objective (the sentence and RTD
  # heads) and fine-tuning's layer-wise rates (shared layers).
  sentence_head = "none"
  rtd_head = False
  share_layers = "none"

  def __post_init__(self):
    config_schema.check_block("model", self)  # the plain fields' ranges
    check_choices(self, _CHOICES)
    if self.hidden_size % self.num_heads or self.head_dim % 2:
      raise UserError(f"model.hidden_size={self.hidden_size} must split into model.num_heads={self.num_heads} "
                      "heads of an even width (rotary embeddings rotate pairs)")
    if self.family != "modernbert":
      raise UserError(f"model.family={self.family!r}: this is ModernBERT's config")
    attention.check_dropout(self.attention, self.attention_dropout)


  def is_global(self, layer):
    """Whether layer `layer` (an int, or a traced index) attends globally."""
    return layer % self.global_every == 0

  @property
  def window(self) -> int:
    return self.local_window // 2

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  @property
  def embed_dim(self) -> int:
    return self.hidden_size


def backbone_params(model: Mapping[str, Any]) -> int:
  """Embeddings, layers, final norm and pooler from a model section's sizes (no biases; the norms have
  scales only): what `bert-jax info` counts as the backbone."""
  h, f = model["hidden_size"], model["intermediate_size"]
  layer = 4 * h * h + 3 * h * f + 2 * h  # q, k, v, out; GeGLU's two inputs and its output; two norms
  pooler = h * h + h if model["use_pooler"] else 0
  return model["vocab_size"] * h + h + model["num_layers"] * layer + h + pooler


def forward_flops(cfg: ModernBertConfig, batch: int, seq: int, predictions: int) -> float:
  """Matmul FLOPs of one forward pass (2 per multiply-add), the MLM head at `predictions` positions per row.

  A local layer's scores count only the keys inside its window (what splash computes, up to its blocks;
  dot computes all T and masks them)."""
  h, f, tokens = cfg.hidden_size, cfg.intermediate_size, batch * seq
  forward = tokens * cfg.num_layers * (2 * 4 * h * h + 2 * 3 * h * f) + attention_forward_flops(cfg, batch, seq)
  if cfg.use_pooler:
    forward += batch * 2 * h * h
  if cfg.mlm_head:
    forward += batch * predictions * (2 * h * h + 2 * h * cfg.vocab_size)
  return float(forward)


def attention_forward_flops(cfg: ModernBertConfig, batch: int, seq: int) -> float:
  """The scores and the weighted sum of one forward pass, every layer (a local layer's keys: its window)."""
  keys = [seq if cfg.is_global(i) else min(seq, 2 * cfg.window + 1) for i in range(cfg.num_layers)]
  return float(batch * seq * sum(2 * 2 * k * cfg.hidden_size for k in keys))


def _init(cfg: ModernBertConfig, axes: tuple, std: Optional[float] = None):
  """Hugging Face's initialisation: a normal truncated at +-cutoff standard deviations."""
  cut = cfg.initializer_cutoff_factor
  init = nn.initializers.truncated_normal(cfg.initializer_range if std is None else std, lower=-cut, upper=cut)
  return nn.with_logical_partitioning(init, axes)


def _out_std(cfg: ModernBertConfig) -> float:
  """The smaller start of the layers' output projections (scaled by depth, as GPT-2 does)."""
  return cfg.initializer_range / (2.0 * cfg.num_layers) ** 0.5


def norm(cfg: ModernBertConfig, name: str) -> nn.LayerNorm:
  return nn.LayerNorm(epsilon=cfg.norm_eps, use_bias=False, dtype=cfg.compute_dtype, param_dtype=cfg.weight_dtype,
                      name=name, scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), ("norm",)))


def _weight(module: nn.Module, cfg: ModernBertConfig, name: str, shape: tuple, axes: tuple,
            std: Optional[float] = None) -> Array:
  return module.param(name, _init(cfg, axes, std), shape, cfg.weight_dtype).astype(cfg.compute_dtype)


class Attention(nn.Module):
  """Rotary self-attention without biases: one fused q/k/v kernel [H, 3, N, D], output kernel [N, D, H].

  Returns (output [B, T, H], probabilities float32 [B, N, T, T] or None). The explicit path (attention
  dropout, a head mask, kept probabilities) runs under dot whatever `attention` says.
  """
  config: ModernBertConfig

  @nn.compact
  def __call__(self, x: Array, segments: attention.Segments, positions: Array, layer, head_mask: Optional[Array],
               keep_attentions: bool, deterministic: bool) -> tuple[Array, Optional[Array]]:
    cfg = self.config
    n, d, h = cfg.num_heads, cfg.head_dim, cfg.hidden_size
    qkv_kernel = _weight(self, cfg, "qkv", (h, 3, n, d), ("embed", None, "heads", "kv"))
    qkv = on_rows(lambda rows: jnp.tensordot(rows, qkv_kernel, axes=1), x.astype(cfg.compute_dtype))
    static = isinstance(layer, int)
    is_global = cfg.is_global(layer)
    theta = (cfg.global_rope_theta if is_global else cfg.local_rope_theta) if static else None
    inv_freq = (jnp.asarray(rope.inverse_frequencies(d, theta)) if static else
                jnp.where(is_global, rope.inverse_frequencies(d, cfg.global_rope_theta),
                          rope.inverse_frequencies(d, cfg.local_rope_theta)))
    q, k = (rope.rotate(qkv[:, :, i], positions, inv_freq) for i in (0, 1))
    v = qkv[:, :, 2]
    window = (None if is_global else cfg.window) if static else cfg.window
    flag = None if static else is_global
    dropout = cfg.attention_dropout > 0 and not deterministic
    probs = None
    if dropout or head_mask is not None or keep_attentions:
      if flag is not None:
        window = jnp.where(flag, x.shape[1], window)
      probs = attention.probabilities(q, k, segments.dense_mask(window))
      weights = probs.astype(q.dtype)
      if dropout:
        weights = Dropout(cfg.attention_dropout)(weights, deterministic=False)
      if head_mask is not None:
        weights = weights * head_mask.astype(weights.dtype)[None, :, None, None]
      y = jnp.einsum("bnts,bsnd->btnd", weights, v)
    else:
      # The backend has no parameters: init runs dot, which takes any length and traces no kernel.
      backend = "dot" if self.is_initializing() else cfg.attention
      y = attention.attend(q, k, v, segments, backend=backend, window=window, is_global=flag)
    out = heads_out(y, _weight(self, cfg, "out", (n, d, h), ("heads", "kv", "embed"), _out_std(cfg)))
    return Dropout(cfg.attention_dropout)(out, deterministic=deterministic), (probs if keep_attentions else None)


class GeGLU(nn.Module):
  """x -> wo(act(x wi_in) * (x wi_gate)): one input kernel [H, 2, F] (input, gate), output kernel [F, H]."""
  config: ModernBertConfig

  @nn.compact
  def __call__(self, x: Array, deterministic: bool) -> Array:
    cfg = self.config
    h, f = cfg.hidden_size, cfg.intermediate_size
    wi = _weight(self, cfg, "wi", (h, 2, f), ("embed", None, "mlp"))
    wo = _weight(self, cfg, "wo", (f, h), ("mlp", "embed"), _out_std(cfg))
    both = on_rows(lambda rows: jnp.tensordot(rows, wi, axes=1), x.astype(cfg.compute_dtype))
    y = ACTIVATIONS[cfg.hidden_act](both[:, :, 0]) * both[:, :, 1]
    y = Dropout(cfg.mlp_dropout)(y, deterministic=deterministic)
    return on_rows(lambda rows: jnp.einsum("...f,fh->...h", rows, wo), y)


class Layer(nn.Module):
  """A pre-LN layer: x += Attn(LN(x)) (layer 0: Attn(x)); x += GeGLU(LN(x)).

  `layer` is the index: a Python int when unrolled, a traced int when scanned. Returns the (carry,
  (output or None, probabilities or None)) pair that nn.scan expects.
  """
  config: ModernBertConfig
  keep_output: bool = False
  keep_attentions: bool = False

  @nn.compact
  def __call__(self, x: Array, segments: attention.Segments, positions: Array, layer, head_mask: Optional[Array],
               deterministic: bool):
    cfg = self.config
    normed = norm(cfg, "attention_norm")(x)
    normed = (x if layer == 0 else normed) if isinstance(layer, int) else jnp.where(layer == 0, x, normed)
    y, probs = Attention(cfg, name="attention")(normed, segments, positions, layer, head_mask,
                                                              self.keep_attentions, deterministic)
    x = x + y
    x = x + GeGLU(cfg, name="mlp")(norm(cfg, "mlp_norm")(x), deterministic)
    x = constrain_hidden(x)
    return x, (x if self.keep_output else None, probs)


class Encoder(nn.Module):
  """num_layers Layers, scanned (params stacked on a leading `layers` axis) or unrolled (layer_{i}), and the
  final norm (inside the encoder, so it travels with it wherever an encoder is loaded).

  Returns (the final norm's output, each layer's output [L, B, T, H] or None, probabilities [L, B, N, T, T]
  or None).
  """
  config: ModernBertConfig
  keep_outputs: bool = False
  keep_attentions: bool = False

  @nn.compact
  def __call__(self, x: Array, segments: attention.Segments, positions: Array, head_mask: Optional[Array],
               deterministic: bool):
    cfg = self.config
    layer_cls = Layer
    if cfg.remat != "none":
      layer_cls = nn.remat(layer_cls, policy=REMAT_POLICIES[cfg.remat], prevent_cse=not cfg.scan_layers,
                           static_argnums=(4, 6) if not cfg.scan_layers else (6,))
    keep = (self.keep_outputs, self.keep_attentions)
    if cfg.scan_layers:
      scanned = nn.scan(layer_cls, variable_axes={"params": 0}, split_rngs={"params": True, "dropout": True},
                        in_axes=(nn.broadcast, nn.broadcast, 0, 0, nn.broadcast), length=cfg.num_layers,
                        unroll=min(cfg.scan_unroll, cfg.num_layers), metadata_params={nn.PARTITION_NAME: "layers"})
      x, (outputs, probs) = scanned(cfg, *keep, name="layers")(
          x, segments, positions, jnp.arange(cfg.num_layers), head_mask, deterministic)
      return norm(cfg, "final_norm")(x), outputs, probs
    outputs = []
    for i in range(cfg.num_layers):
      x, out = layer_cls(cfg, *keep, name=f"layer_{i}")(
          x, segments, positions, i, None if head_mask is None else head_mask[i], deterministic)
      outputs.append(out)
    stacked = [jnp.stack(column) if kept else None for kept, column in zip(keep, zip(*outputs))]
    return norm(cfg, "final_norm")(x), *stacked


def _prediction_head(module: nn.Module, cfg: ModernBertConfig, x: Array) -> Array:
  """Dense (no bias) -> activation -> LayerNorm, as `module`'s kernel and norm: [..., H] -> [..., H]."""
  h = jnp.einsum("...h,hk->...k", x.astype(cfg.compute_dtype),
                 _weight(module, cfg, "kernel", (cfg.hidden_size, cfg.hidden_size), ("embed", "mlp"), _out_std(cfg)))
  return norm(cfg, "norm")(ACTIVATIONS[cfg.head_act](h))


class PredictionHead(nn.Module):
  """Hugging Face's ModernBertPredictionHead (dense, activation, norm): [..., H] -> [..., H]."""
  config: ModernBertConfig

  @nn.compact
  def __call__(self, x: Array) -> Array:
    return _prediction_head(self, self.config, x)


class TokenTransform(nn.Module):
  """The prediction head at every position, before ModernBERT's token and span classifiers (Hugging Face's
  ModernBertForTokenClassification and ForQuestionAnswering): the family's `token_transform`."""
  config: ModernBertConfig

  @nn.compact
  def __call__(self, out: ModelOutput, attention_mask: Array, deterministic: bool) -> Array:
    del attention_mask, deterministic
    return _prediction_head(self, self.config, out.last_hidden_state)


class Embeddings(nn.Module):
  """Token embeddings [V, H] -> LayerNorm -> dropout (no positions: the layers rotate q and k)."""
  config: ModernBertConfig

  def setup(self):
    cfg = self.config
    self.word_embeddings = nn.Embed(cfg.vocab_size, cfg.hidden_size, dtype=cfg.compute_dtype,
                                    param_dtype=cfg.weight_dtype, embedding_init=_init(cfg, ("vocab", "embed")))
    self.norm = norm(cfg, "norm")
    self.dropout = Dropout(cfg.embedding_dropout)

  def __call__(self, input_ids: Array, deterministic: bool) -> Array:
    x = self.norm(lookup(self.word_embeddings, input_ids, ("vocab", None)))
    return self.dropout(x, deterministic=deterministic)

  def attend(self, x: Array) -> Array:
    """Logits against the token table (the tied MLM decoder): [..., H] -> [..., V]."""
    return self.word_embeddings.attend(x)


class MaskedLMHead(nn.Module):
  """PredictionHead -> tied token embeddings + output bias: [..., H] -> float32 [..., V]."""
  config: ModernBertConfig

  @nn.compact
  def __call__(self, x: Array, embeddings: Embeddings) -> Array:
    cfg = self.config
    h = PredictionHead(cfg, name="transform")(x)
    bias = self.param("output_bias", nn.with_logical_partitioning(nn.initializers.zeros_init(), ("vocab",)),
                      (cfg.vocab_size,), cfg.weight_dtype)
    return tied_logits(embeddings.attend, h, bias)


class ModernBertModel(nn.Module):
  """The ModernBERT encoder with the heads its config asks for (MLM; the pooled prediction head)."""
  config: ModernBertConfig

  @nn.compact
  def __call__(self, input_ids: Array, attention_mask: Optional[Array] = None,
               token_type_ids: Optional[Array] = None, position_ids: Optional[Array] = None,
               document_ids: Optional[Array] = None, masked_positions: Optional[Array] = None, *,
               deterministic: bool = True, output_hidden_states: bool = False,
               output_attentions: bool = False, head_mask: Optional[Array] = None,
               unpad_index: Optional[Array] = None) -> ModelOutput:
    """input_ids, attention_mask, position_ids (restarting per packed document), document_ids: int32[B, T];
    token_type_ids: ignored; masked_positions: int32[B, P] (MLM logits only there; every position when
    None); head_mask: float[L, N] or [N]. unpad_index: int32[B', T] (models/unpad.py): the inputs are packed
    rows of a padded batch [B', T], and the outputs come back in that padded layout (pooling, heads)."""
    del token_type_ids  # ModernBERT has no token types
    cfg = self.config
    if input_ids.ndim != 2:
      raise ValueError(f"input_ids must be [batch, length], got shape {input_ids.shape}")
    if input_ids.shape[1] > cfg.max_position_embeddings:
      raise ValueError(f"sequence length {input_ids.shape[1]} exceeds max_position_embeddings "
                       f"{cfg.max_position_embeddings}")
    if attention_mask is None:
      attention_mask = jnp.ones_like(input_ids)
    if position_ids is None:
      position_ids = jnp.broadcast_to(jnp.arange(input_ids.shape[1], dtype=jnp.int32), input_ids.shape)
    attention.say_fallback(cfg.attention, output_attentions, head_mask)
    embeddings = Embeddings(cfg, name="embeddings")
    segments = attention.Segments.of(attention_mask, document_ids)
    encoder = Encoder(cfg, output_hidden_states, output_attentions, name="encoder")
    # packed rows draw their dropout at each token's padded place (models/batch_rows.py)
    with batch_rows.packed(None if deterministic else unpad_index, input_ids.shape[0]):
      x = constrain_hidden(embeddings(input_ids, deterministic))
      h, layer_outputs, attentions = encoder(x, segments, position_ids, layer_head_mask(cfg, head_mask),
                                             deterministic)
    hidden_states = None
    if output_hidden_states:  # as Hugging Face: the last entry is the final norm's output
      hidden_states = jnp.concatenate([x[None], layer_outputs[:-1], h[None]], axis=0)
    if unpad_index is not None:
      if output_attentions:
        raise ValueError("unpad_index: no attentions on packed rows")
      attention_mask = unpad.real_of(unpad_index, h.shape[0] * h.shape[1])
      h = unpad.restore(h, unpad_index)
      hidden_states = None if hidden_states is None else unpad.restore(hidden_states, unpad_index)
    out = {"last_hidden_state": h, "attentions": attentions}
    if output_hidden_states:
      out["hidden_states"] = hidden_states
    if cfg.use_pooler:
      out["pooled_output"] = PredictionHead(cfg, name="pooler")(self._pool(h, attention_mask))
    if cfg.mlm_head:
      at = h if masked_positions is None else gather_positions(h, masked_positions)
      out["mlm_logits"] = MaskedLMHead(cfg, name="mlm_head")(at, embeddings)
    return ModelOutput(**out)

  def _pool(self, h: Array, attention_mask: Array) -> Array:
    if self.config.pooling == "cls":
      return h[:, 0]
    real = attention_mask.astype(h.dtype)[..., None]
    return jnp.sum(h * real, axis=1) / jnp.maximum(jnp.sum(real, axis=1), 1.0)
