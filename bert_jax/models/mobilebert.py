"""MobileBERT (Sun et al. 2020): its config and its encoder with the MLM and NSP heads (Flax linen).

What differs from BERT (the paper's figure 1 and Hugging Face's MobileBertModel):
  - each layer is an inverted bottleneck: the block carries `hidden_size` (512) between layers, a linear
    map takes it down to `intra_bottleneck_size` (128) for the layer's body and another back up after;
    with key_query_shared_bottleneck, query and key read a second (shared) bottleneck of the input and
    value reads the full-width input;
  - `num_feedforward_networks` (4) feed-forward networks in each layer, each with its residual and norm;
  - NoNorm (x * scale + bias, `normalization_type="no_norm"`) instead of LayerNorm, and ReLU;
  - 128-wide token embeddings; with `trigram_input` each position's embedding is the concatenation of
    its next, own and previous token's (zero past the ends: a width-3 convolution), projected to H;
  - the MLM head's decoder is the tied [V, E] embeddings plus `H - E` extra rows of its own
    (`mlm_head/extra_decoder`, [H - E, V]) after a dense + activation + LayerNorm transform.

The call and its outputs are BertModel's (`bert.ModelOutput`), so objectives, analysis and the fine-tuning
heads take either. Hugging Face computes some LayerNorms (normalization_type="layer_norm") with PyTorch's
default epsilon 1e-5 instead of layer_norm_eps (the embeddings' and each layer's output norm): kept here.

Shapes: B batch, T length, N heads, D head dim, H hidden, I intra-bottleneck (true hidden), F
intermediate, E embedding, V vocab, L layers, P predictions.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax import config_schema
from bert_jax.errors import UserError
from bert_jax.models import activations, attention
from bert_jax.models.activations import REMAT_POLICIES
from bert_jax.models.bert import (ModelOutput, activation, constrain_hidden, gather_positions, layer_head_mask,
                                  lookup, tied_logits, zeros_init, kernel_init)
from bert_jax.models.config import FamilyConfig, check_choices
from bert_jax.models.dropout import Dropout

Array = jax.Array

_CHOICES = {"hidden_act": activations.NAMES, "normalization_type": ("no_norm", "layer_norm"),
            "sentence_head": ("nsp", "none"), "attention": attention.BACKENDS}
TORCH_LAYER_NORM_EPS = 1e-5  # nn.LayerNorm's default, where Hugging Face passes no eps


@dataclasses.dataclass(frozen=True)
class MobileBertConfig(FamilyConfig):
  """MobileBERT's hyper-parameters. Defaults are MobileBERT (google/mobilebert-uncased).

  intra_bottleneck_size: the layer body's width (the paper's 128); use_bottleneck=False runs the body at
    hidden_size. key_query_shared_bottleneck: query and key read their own bottleneck of the layer input,
    value the full-width input; use_bottleneck_attention: query, key and value all read the body's input.
  num_feedforward_networks: feed-forward networks per layer (each residual + norm).
  normalization_type: no_norm (element-wise affine) or layer_norm.
  trigram_input: the embedding of each position is [next, own, previous] token (3E), projected to H.
  classifier_activation: the pooler is dense + tanh over [CLS] (False: the [CLS] vector itself).
  use_pooler, mlm_head, sentence_head (nsp | none): the heads on the model.
  remat, scan_layers, scan_unroll, dtype, param_dtype, attention: as for BERT (bert_jax/models/config.py).
  """
  FAMILY_NAME = "MobileBERT"  # not a field (no annotation): the name its config errors use
  vocab_size: int = 30522
  hidden_size: int = 512
  num_layers: int = 24
  num_heads: int = 4
  intermediate_size: int = 512
  embedding_size: int = 128
  intra_bottleneck_size: int = 128
  num_feedforward_networks: int = 4
  use_bottleneck: bool = True
  use_bottleneck_attention: bool = False
  key_query_shared_bottleneck: bool = True
  trigram_input: bool = True
  normalization_type: str = "no_norm"
  max_position_embeddings: int = 512
  type_vocab_size: int = 2
  hidden_dropout: float = 0.0
  attention_dropout: float = 0.1
  layer_norm_eps: float = 1e-12
  initializer_range: float = 0.02
  hidden_act: str = "relu"
  pad_token_id: int = 0
  classifier_activation: bool = True
  use_pooler: bool = True
  mlm_head: bool = True
  sentence_head: str = "nsp"
  dtype: str = "float32"
  param_dtype: str = "float32"
  remat: str = "none"
  scan_layers: bool = True
  scan_unroll: int = 1
  attention: str = "dot"
  family: str = "mobilebert"

  # What code shared with BERT's family asks of a config (its objective, fine-tuning's layer-wise rates,
  # conversion's relayout).
  rtd_head = False
  share_layers = "none"
  pruned_heads = ()

  def __post_init__(self):
    config_schema.check_block("model", self)  # the plain fields' ranges
    check_choices(self, _CHOICES)
    if self.embedding_size <= 0:
      raise UserError(f"model.embedding_size={self.embedding_size} must be >= 1 (this family has no 0 for "
                      "model.hidden_size)")
    if self.true_hidden_size % self.num_heads:
      raise UserError(f"model.num_heads={self.num_heads} must divide the attention's width {self.true_hidden_size} "
                      "(intra_bottleneck_size, or hidden_size without the bottleneck)")
    if self.embedding_size > self.hidden_size:
      raise UserError(f"model.embedding_size={self.embedding_size} must be at most model.hidden_size="
                      f"{self.hidden_size} (the MLM decoder adds hidden_size - embedding_size rows)")
    if self.sentence_head != "none" and not self.use_pooler:
      raise UserError("model.sentence_head='nsp' needs model.use_pooler=True")
    if self.family != "mobilebert":
      raise UserError(f"model.family={self.family!r}: this is MobileBERT's config")
    attention.check_dropout(self.attention, self.attention_dropout)


  @property
  def true_hidden_size(self) -> int:
    """The layer body's width (Hugging Face's true_hidden_size)."""
    return self.intra_bottleneck_size if self.use_bottleneck else self.hidden_size

  @property
  def embed_dim(self) -> int:
    return self.embedding_size

  @property
  def head_dim(self) -> int:
    return self.true_hidden_size // self.num_heads


def _dense(cfg: MobileBertConfig, features: int, axes: tuple[str, str], name: str, use_bias: bool = True) -> nn.Dense:
  return nn.Dense(features, use_bias=use_bias, dtype=cfg.compute_dtype, param_dtype=cfg.weight_dtype, name=name,
                  kernel_init=kernel_init(cfg, axes), bias_init=zeros_init(axes[-1:]))


class NoNorm(nn.Module):
  """MobileBERT's replacement for LayerNorm: x * scale + bias, element-wise (no statistics)."""
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: Array) -> Array:
    features = x.shape[-1]
    scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones_init(), ("norm",)), (features,),
                       self.param_dtype)
    bias = self.param("bias", zeros_init(("norm",)), (features,), self.param_dtype)
    return x.astype(self.dtype) * scale.astype(self.dtype) + bias.astype(self.dtype)


def _norm(cfg: MobileBertConfig, name: str, eps: Optional[float] = None, kind: Optional[str] = None) -> nn.Module:
  """The config's normalisation (NoNorm or LayerNorm with `eps`; None: the config's layer_norm_eps)."""
  if (kind or cfg.normalization_type) == "no_norm":
    return NoNorm(cfg.compute_dtype, cfg.weight_dtype, name=name)
  return nn.LayerNorm(epsilon=cfg.layer_norm_eps if eps is None else eps, dtype=cfg.compute_dtype,
                      param_dtype=cfg.weight_dtype, name=name,
                      scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), ("norm",)),
                      bias_init=zeros_init(("norm",)))


class Embeddings(nn.Module):
  """[B, T] ids -> [B, T, H]: E-wide tokens (trigram-concatenated to 3E), projected to H, + positions +
  token types, norm, dropout."""
  config: MobileBertConfig

  def setup(self):
    cfg = self.config
    embed = lambda num, features, axes: nn.Embed(  # noqa: E731
        num, features, dtype=cfg.compute_dtype, param_dtype=cfg.weight_dtype, embedding_init=kernel_init(cfg, axes))
    self.word_embeddings = embed(cfg.vocab_size, cfg.embedding_size, ("vocab", "embed"))
    self.position_embeddings = embed(cfg.max_position_embeddings, cfg.hidden_size, ("positions", "embed"))
    self.token_type_embeddings = embed(cfg.type_vocab_size, cfg.hidden_size, ("type_vocab", "embed"))
    if cfg.trigram_input or cfg.embedding_size != cfg.hidden_size:
      self.transformation = _dense(cfg, cfg.hidden_size, ("mlp", "embed"), "transformation")
    self.norm = _norm(cfg, "norm", TORCH_LAYER_NORM_EPS)
    self.dropout = Dropout(cfg.hidden_dropout)

  def __call__(self, input_ids: Array, token_type_ids: Array, position_ids: Array, deterministic: bool) -> Array:
    cfg = self.config
    x = lookup(self.word_embeddings, input_ids, ("vocab", None))
    if cfg.trigram_input:
      zero = jnp.zeros_like(x[:, :1])
      following = jnp.concatenate([x[:, 1:], zero], axis=1)
      preceding = jnp.concatenate([zero, x[:, :-1]], axis=1)
      x = jnp.concatenate([following, x, preceding], axis=-1)
    if cfg.trigram_input or cfg.embedding_size != cfg.hidden_size:
      x = self.transformation(x)
    x = (x + lookup(self.position_embeddings, position_ids, (None, None))
         + lookup(self.token_type_embeddings, token_type_ids, (None, None)))
    return self.dropout(self.norm(x), deterministic=deterministic)

  def attend(self, x: Array) -> Array:
    """[..., E] against the word-embedding table -> [..., V] (the tied part of the MLM decoder)."""
    return self.word_embeddings.attend(x)


class Bottleneck(nn.Module):
  """A linear map H -> I and a norm (the layer's way into its narrow body)."""
  config: MobileBertConfig

  @nn.compact
  def __call__(self, x: Array) -> Array:
    cfg = self.config
    return _norm(cfg, "norm")(_dense(cfg, cfg.intra_bottleneck_size, ("embed", "mlp"), "dense")(x))


class SelfAttention(nn.Module):
  """Multi-head attention of query/key [B, T, I] over value [B, T, I or H] -> [B, T, I] (before the output
  projection), and the probabilities float32 [B, N, T, T] when `keep_attentions`."""
  config: MobileBertConfig

  @nn.compact
  def __call__(self, q_in: Array, k_in: Array, v_in: Array, segments: attention.Segments, deterministic: bool,
               head_mask: Optional[Array], keep_attentions: bool) -> tuple[Array, Optional[Array]]:
    cfg = self.config
    n, d = cfg.num_heads, cfg.head_dim
    split = lambda x: x.reshape(x.shape[:-1] + (n, d))  # noqa: E731
    q, k, v = (split(_dense(cfg, cfg.true_hidden_size, ("embed", "heads"), name)(x))
               for name, x in (("query", q_in), ("key", k_in), ("value", v_in)))
    dropout = cfg.attention_dropout > 0 and not deterministic
    probs = None
    if dropout or head_mask is not None or keep_attentions:
      probs = attention.probabilities(q, k, segments.dense_mask())
      weights = probs.astype(q.dtype)
      if dropout:
        weights = Dropout(cfg.attention_dropout)(weights, deterministic=False)
      if head_mask is not None:
        weights = weights * head_mask.astype(weights.dtype)[None, :, None, None]
      y = jnp.einsum("bnts,bsnd->btnd", weights, v)
    else:
      y = attention.attend(q, k, v, segments, backend="dot" if self.is_initializing() else cfg.attention)
    return y.reshape(y.shape[:2] + (n * d,)), (probs if keep_attentions else None)


class FeedForward(nn.Module):
  """One of the stacked networks: norm(x + W_out act(W_in x)), [B, T, I] -> [B, T, I]."""
  config: MobileBertConfig

  @nn.compact
  def __call__(self, x: Array) -> Array:
    cfg = self.config
    h = activation(cfg)(_dense(cfg, cfg.intermediate_size, ("embed", "mlp"), "intermediate")(x))
    return _norm(cfg, "norm")(x + _dense(cfg, cfg.true_hidden_size, ("mlp", "embed"), "output")(h))


class MobileBertLayer(nn.Module):
  """Bottlenecks in, attention, the stacked feed-forward networks, the bottleneck out (H -> I -> H).

  Returns (x, (x or None, attention probabilities or None)), the (carry, output) pair nn.scan expects.
  """
  config: MobileBertConfig
  keep_output: bool = False
  keep_attentions: bool = False

  @nn.compact
  def __call__(self, x: Array, segments: attention.Segments, head_mask: Optional[Array], deterministic: bool):
    cfg = self.config
    drop = Dropout(cfg.hidden_dropout)
    if cfg.use_bottleneck:
      body_in = Bottleneck(cfg, name="input_bottleneck")(x)
      if cfg.use_bottleneck_attention:
        q_in = k_in = v_in = body_in
      elif cfg.key_query_shared_bottleneck:
        q_in = k_in = Bottleneck(cfg, name="attention_bottleneck")(x)
        v_in = x
      else:
        q_in = k_in = v_in = x
    else:
      body_in = q_in = k_in = v_in = x
    y, probs = SelfAttention(cfg, name="attention")(q_in, k_in, v_in, segments, deterministic, head_mask,
                                                    self.keep_attentions)
    y = _dense(cfg, cfg.true_hidden_size, ("heads", "embed"), "attention_output")(y)
    if not cfg.use_bottleneck:
      y = drop(y, deterministic=deterministic)
    h = _norm(cfg, "attention_norm")(y + body_in)
    for j in range(cfg.num_feedforward_networks - 1):
      h = FeedForward(cfg, name=f"ffn_{j}")(h)
    inner = activation(cfg)(_dense(cfg, cfg.intermediate_size, ("embed", "mlp"), "intermediate")(h))
    y = _dense(cfg, cfg.true_hidden_size, ("mlp", "embed"), "output")(inner)
    if cfg.use_bottleneck:
      h = _norm(cfg, "output_norm", TORCH_LAYER_NORM_EPS)(y + h)
      y = drop(_dense(cfg, cfg.hidden_size, ("mlp", "embed"), "output_bottleneck")(h), deterministic=deterministic)
      x = _norm(cfg, "output_bottleneck_norm")(y + x)
    else:
      x = _norm(cfg, "output_norm", TORCH_LAYER_NORM_EPS)(drop(y, deterministic=deterministic) + h)
    x = constrain_hidden(x)
    return x, (x if self.keep_output else None, probs)


class Encoder(nn.Module):
  """num_layers MobileBertLayers, scanned (params stacked under `layers`) or unrolled (`layer_i`).
  Returns (x, each layer's output [L, B, T, H] or None, probabilities [L, B, N, T, T] or None)."""
  config: MobileBertConfig
  keep_outputs: bool = False
  keep_attentions: bool = False

  @nn.compact
  def __call__(self, x: Array, segments: attention.Segments, head_mask: Optional[Array], deterministic: bool):
    cfg = self.config
    layer_cls = MobileBertLayer
    if cfg.remat != "none":
      layer_cls = nn.remat(layer_cls, policy=REMAT_POLICIES[cfg.remat], prevent_cse=not cfg.scan_layers,
                           static_argnums=(4,))
    keep = (self.keep_outputs, self.keep_attentions)
    if cfg.scan_layers:
      scanned = nn.scan(layer_cls, variable_axes={"params": 0}, split_rngs={"params": True, "dropout": True},
                        in_axes=(nn.broadcast, 0, nn.broadcast), length=cfg.num_layers,
                        unroll=min(cfg.scan_unroll, cfg.num_layers), metadata_params={nn.PARTITION_NAME: "layers"})
      x, (outputs, probs) = scanned(cfg, *keep, name="layers")(x, segments, head_mask, deterministic)
      return x, outputs, probs
    outputs = []
    for i in range(cfg.num_layers):
      x, out = layer_cls(cfg, *keep, name=f"layer_{i}")(x, segments, None if head_mask is None else head_mask[i],
                                                          deterministic)
      outputs.append(out)
    stacked = [jnp.stack(column) if keep_it else None for keep_it, column in zip(keep, zip(*outputs))]
    return x, *stacked


class MaskedLMHead(nn.Module):
  """Dense(H) -> activation -> LayerNorm -> [tied word embeddings (E) | extra decoder rows (H - E)] + bias."""
  config: MobileBertConfig

  @nn.compact
  def __call__(self, x: Array, embeddings: Embeddings) -> Array:
    cfg = self.config
    h = activation(cfg)(_dense(cfg, cfg.hidden_size, ("embed", "mlp"), "transform")(x))
    h = _norm(cfg, "layer_norm", kind="layer_norm")(h)
    e = cfg.embedding_size
    extra = None
    if cfg.hidden_size > e:
      extra = self.param("extra_decoder", kernel_init(cfg, ("mlp", "vocab")), (cfg.hidden_size - e, cfg.vocab_size),
                         cfg.weight_dtype)

    def decode(rows: Array) -> Array:
      logits = embeddings.attend(rows[:, :e]).astype(jnp.float32)
      if extra is None:
        return logits
      return logits + jnp.einsum("nk,kv->nv", rows[:, e:], extra.astype(rows.dtype)).astype(jnp.float32)
    bias = self.param("output_bias", zeros_init(("vocab",)), (cfg.vocab_size,), cfg.weight_dtype)
    return tied_logits(decode, h, bias)


class MobileBertModel(nn.Module):
  """MobileBERT with the heads its config asks for (pooler, MLM, NSP); BertModel's call and outputs."""
  config: MobileBertConfig

  @nn.compact
  def __call__(self, input_ids: Array, attention_mask: Optional[Array] = None,
               token_type_ids: Optional[Array] = None, position_ids: Optional[Array] = None,
               document_ids: Optional[Array] = None, masked_positions: Optional[Array] = None, *,
               deterministic: bool = True, output_hidden_states: bool = False,
               output_attentions: bool = False, head_mask: Optional[Array] = None) -> ModelOutput:
    """input_ids, attention_mask, token_type_ids, position_ids, document_ids: int32[B, T];
    masked_positions: int32[B, P] (MLM logits only there; every position when None);
    head_mask: float[L, N] or [N], multiplying each head's attention probabilities."""
    cfg = self.config
    if input_ids.ndim != 2:
      raise ValueError(f"input_ids must be [batch, length], got shape {input_ids.shape}")
    if input_ids.shape[1] > cfg.max_position_embeddings:
      raise ValueError(f"sequence length {input_ids.shape[1]} exceeds max_position_embeddings "
                       f"{cfg.max_position_embeddings}")
    if position_ids is None:
      position_ids = jnp.broadcast_to(jnp.arange(input_ids.shape[1], dtype=jnp.int32), input_ids.shape)
    if attention_mask is None:
      attention_mask = jnp.ones_like(input_ids)
    if token_type_ids is None:
      token_type_ids = jnp.zeros_like(input_ids)
    embeddings = Embeddings(cfg, name="embeddings")
    x = constrain_hidden(embeddings(input_ids, token_type_ids, position_ids, deterministic))
    attention.say_fallback(cfg.attention, output_attentions, head_mask)
    segments = attention.Segments.of(attention_mask, document_ids)
    encoder = Encoder(cfg, output_hidden_states, output_attentions, name="encoder")
    h, layer_outputs, attentions = encoder(x, segments, layer_head_mask(cfg, head_mask), deterministic)
    out = {"last_hidden_state": h, "attentions": attentions}
    if output_hidden_states:
      out["hidden_states"] = jnp.concatenate([x[None], layer_outputs], axis=0)
    if cfg.use_pooler:
      pooled = h[:, 0]
      if cfg.classifier_activation:
        pooled = jnp.tanh(_dense(cfg, cfg.hidden_size, ("embed", "mlp"), "pooler")(pooled))
      out["pooled_output"] = pooled
    if cfg.mlm_head:
      at = h if masked_positions is None else gather_positions(h, masked_positions)
      out["mlm_logits"] = MaskedLMHead(cfg, name="mlm_head")(at, embeddings)
    if cfg.sentence_head == "nsp":
      out["nsp_logits"] = _dense(cfg, 2, ("embed", "classes"), "sentence_classifier")(
          out["pooled_output"]).astype(jnp.float32)
    return ModelOutput(**out)


def backbone_params(model: Mapping[str, Any]) -> int:
  """Embeddings + encoder + pooler of a model section (what `bert-jax presets` and `info` count)."""
  fields = {k: v for k, v in dict(model).items() if k in {f.name for f in dataclasses.fields(MobileBertConfig)}}
  config = MobileBertConfig(**{**fields, "mlm_head": False, "sentence_head": "none"})
  ids = jnp.zeros((1, 1), jnp.int32)
  shapes = jax.eval_shape(lambda: MobileBertModel(config).init(jax.random.key(0), ids))["params"]
  return sum(math.prod(x.shape) for x in jax.tree.leaves(nn.meta.unbox(shapes)))
