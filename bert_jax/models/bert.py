"""The BERT encoder and its pretraining heads (Flax linen).

One encoder serves the family through `ModelConfig` switches: factorised embeddings (ALBERT, ELECTRA),
cross-layer sharing (ALBERT), RoBERTa positions, optional pooler and heads. Parameter names are the
contract that checkpoint conversion and sharding rules depend on: keep them stable.

Shapes: B batch, T length, N heads, D head dim, H hidden, E embedding width, V vocab, P predictions.

Dropout is bert_jax.models.dropout.Dropout (cheaper random bits than flax's, same semantics).

Parameters carry logical axis names. Activations carry two constraints, applied when the step traces
inside a mesh and logical rules (`partitioning.in_mesh`): embedding tables are gathered over fsdp
before the lookup (`lookup`), and hidden states between layers stay split over the batch
(`constrain_hidden`); the rest follows from the jitted step's shardings. tests/test_sharding.py
compares 1 device with a 2x2x2 mesh for rolled and unrolled layer scans.
"""
from __future__ import annotations

import functools
from typing import Any, Optional

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.models.config import ModelConfig
from bert_jax.models.dropout import Dropout

Array = jax.Array


def gelu(x: Array) -> Array:
  """Exact GELU as the original BERT code and PyTorch write it: 0.5 x (1 + erf(x / sqrt(2))).

  jax.nn.gelu(approximate=False) uses erfc for relative accuracy far in the negative tail, which
  XLA:CPU lowers through exp and selects; erf is cheaper (~1% of the `mini` CPU step) and the
  values differ by less than 1e-6 absolute (tests/test_dropout.py).
  """
  return 0.5 * x * (1.0 + jax.lax.erf(x * jnp.asarray(2 ** -0.5, x.dtype)))


_ACTIVATIONS = {
    "gelu": gelu,
    "gelu_tanh": functools.partial(jax.nn.gelu, approximate=True),
    "relu": jax.nn.relu,
}

_REMAT_POLICIES = {
    "full": None,
    "dots": jax.checkpoint_policies.checkpoint_dots,
    "dots_no_batch": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
}


@flax.struct.dataclass
class ModelOutput:
  """What the encoder returns; heads that the model does not have are None.

  last_hidden_state: [B, T, H]; pooled_output: [B, H]; mlm_logits: [B, P, V] at the masked positions
  (or [B, T, V] when none are given); nsp_logits / sop_logits: [B, 2]; rtd_logits: [B, T];
  hidden_states: the embedding output and each layer's output, [L + 1, B, T, H], when asked for.
  """
  last_hidden_state: Array
  pooled_output: Optional[Array] = None
  mlm_logits: Optional[Array] = None
  nsp_logits: Optional[Array] = None
  sop_logits: Optional[Array] = None
  rtd_logits: Optional[Array] = None
  hidden_states: Optional[Array] = None


def kernel_init(config: ModelConfig, axes: tuple[str, ...]):
  return nn.with_logical_partitioning(nn.initializers.truncated_normal(config.initializer_range), axes)


def zeros_init(axes: tuple[str, ...]):
  return nn.with_logical_partitioning(nn.initializers.zeros_init(), axes)


def layer_norm(config: ModelConfig, name: str) -> nn.LayerNorm:
  return nn.LayerNorm(epsilon=config.layer_norm_eps, dtype=config.compute_dtype,
                      param_dtype=config.weight_dtype, name=name,
                      scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), ("norm",)),
                      bias_init=zeros_init(("norm",)))


def dense(config: ModelConfig, features: int, axes: tuple[str, str], name: str) -> nn.Dense:
  return nn.Dense(features, dtype=config.compute_dtype, param_dtype=config.weight_dtype, name=name,
                  kernel_init=kernel_init(config, axes), bias_init=zeros_init(axes[-1:]))


def activation(config: ModelConfig):
  return _ACTIVATIONS[config.hidden_act]


def lookup(embed: nn.Embed, ids: Array, table_axes: tuple) -> Array:
  """Rows of an nn.Embed table, with the table first gathered to `table_axes` (logical names).

  The `embed` axis of a table is split over fsdp for storage; gathering it back before the lookup
  (as FSDP does for every weight) keeps the looked-up rows split over the batch, like the ids. A
  vocab axis split over tensor stays split: each device gathers the ids it holds, then a sum.
  """
  table = nn.with_logical_constraint(embed.embedding, table_axes)
  return jnp.take(table, ids, axis=0).astype(embed.dtype)


class Embeddings(nn.Module):
  """Word + position + token-type embeddings, LayerNorm, dropout, and the E -> H projection if E != H."""
  config: ModelConfig

  def setup(self):
    cfg = self.config
    embed = functools.partial(nn.Embed, features=cfg.embed_dim, dtype=cfg.compute_dtype,
                              param_dtype=cfg.weight_dtype)
    self.word_embeddings = embed(cfg.vocab_size, embedding_init=kernel_init(cfg, ("vocab", "embed")))
    self.position_embeddings = embed(cfg.max_position_embeddings,
                                     embedding_init=kernel_init(cfg, ("positions", "embed")))
    self.token_type_embeddings = embed(cfg.type_vocab_size,
                                       embedding_init=kernel_init(cfg, ("type_vocab", "embed")))
    self.layer_norm = layer_norm(cfg, "layer_norm")
    self.dropout = Dropout(cfg.hidden_dropout)
    if cfg.embed_dim != cfg.hidden_size:
      self.projection = dense(cfg, cfg.hidden_size, ("embed", "mlp"), "projection")

  def __call__(self, input_ids: Array, token_type_ids: Array, position_ids: Array,
               deterministic: bool) -> Array:
    x = (lookup(self.word_embeddings, input_ids, ("vocab", None))
         + lookup(self.position_embeddings, position_ids, (None, None))
         + lookup(self.token_type_embeddings, token_type_ids, (None, None)))
    x = self.dropout(self.layer_norm(x), deterministic=deterministic)
    if self.config.embed_dim != self.config.hidden_size:
      x = self.projection(x)
    return x

  def attend(self, x: Array) -> Array:
    """Logits against the word-embedding table (the tied MLM output layer): [..., E] -> [..., V]."""
    return self.word_embeddings.attend(x)


class HeadsProjection(nn.Module):
  """An einsum projection with a multi-axis kernel, e.g. [H, N, D] (q/k/v) or [N, D, H] (output)."""
  config: ModelConfig
  kernel_shape: tuple[int, ...]
  kernel_axes: tuple[str, ...]
  equation: str

  def setup(self):
    cfg = self.config
    self.kernel = self.param("kernel", kernel_init(cfg, self.kernel_axes), self.kernel_shape, cfg.weight_dtype)
    out_shape = self.kernel_shape[-1:] if self.kernel_axes[-1] == "embed" else self.kernel_shape[1:]
    out_axes = self.kernel_axes[-1:] if self.kernel_axes[-1] == "embed" else self.kernel_axes[1:]
    self.bias = self.param("bias", zeros_init(out_axes), out_shape, cfg.weight_dtype)

  def __call__(self, x: Array) -> Array:
    dtype = self.config.compute_dtype
    return jnp.einsum(self.equation, x.astype(dtype), self.kernel.astype(dtype)) + self.bias.astype(dtype)


class SelfAttention(nn.Module):
  """Multi-head self-attention: q/k/v kernels [H, N, D], output kernel [N, D, H].

  q, k and v come from one matmul against the three kernels stacked at run time ([H, 3, N, D]):
  one wide matmul (and one for each gradient) instead of three narrow ones, ~5% of the `mini` CPU
  step (BENCHMARKS.md). The parameters stay three separate q/k/v kernels, as checkpoints name them.
  """
  config: ModelConfig

  @nn.compact
  def __call__(self, x: Array, mask: Array, deterministic: bool) -> Array:
    cfg = self.config
    n, d, h = cfg.num_heads, cfg.head_dim, cfg.hidden_size
    projections = [HeadsProjection(cfg, (h, n, d), ("embed", "heads", "kv"), "bth,hnd->btnd", name=name)
                   for name in ("query", "key", "value")]
    dtype = cfg.compute_dtype
    kernel = jnp.stack([p.kernel.astype(dtype) for p in projections], axis=1)
    bias = jnp.stack([p.bias.astype(dtype) for p in projections])
    qkv = jnp.einsum("bth,hcnd->btcnd", x.astype(dtype), kernel) + bias
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    if cfg.attention_dropout > 0 and not deterministic:
      y = self._attention_with_dropout(q, k, v, mask)
    else:
      impl = None if cfg.attention_impl == "auto" else cfg.attention_impl
      y = jax.nn.dot_product_attention(q, k, v, mask=mask, implementation=impl)
    return HeadsProjection(cfg, (n, d, h), ("heads", "kv", "embed"), "btnd,ndh->bth", name="out")(y)

  def _attention_with_dropout(self, q: Array, k: Array, v: Array, mask: Array) -> Array:
    # jax.nn.dot_product_attention has no dropout, so training with attention dropout takes this path.
    logits = jnp.einsum("btnd,bsnd->bnts", q, k) / jnp.sqrt(q.shape[-1]).astype(q.dtype)
    logits = jnp.where(mask, logits.astype(jnp.float32), jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(logits, axis=-1).astype(q.dtype)
    probs = Dropout(self.config.attention_dropout)(probs, deterministic=False)
    return jnp.einsum("bnts,bsnd->btnd", probs, v)


class FeedForward(nn.Module):
  config: ModelConfig

  @nn.compact
  def __call__(self, x: Array) -> Array:
    cfg = self.config
    h = activation(cfg)(dense(cfg, cfg.intermediate_size, ("embed", "mlp"), "intermediate")(x))
    return dense(cfg, cfg.hidden_size, ("mlp", "embed"), "output")(h)


def constrain_hidden(x: Array) -> Array:
  """Hidden states [B, T, H] split over the batch only (logical `batch`): every token's full vector
  on the devices that hold its row, as the next layer's matmuls want it.

  Without this, XLA propagates the word-embedding table's sharding (`embed` over fsdp) into the
  lookup's output and then reshards it by replicating the whole global batch of activations on
  every device ("involuntary full rematerialization"). A no-op outside `nn.logical_axis_rules` and a
  mesh (the train and eval steps trace inside both).
  """
  return nn.with_logical_constraint(x, ("batch", "length", None))


class TransformerLayer(nn.Module):
  """A post-LN layer: x = LN(x + Attn(x)); x = LN(x + FFN(x)).

  `attention`/`feed_forward` may be passed in to share them across layers (ALBERT). Returns
  (x, x or None): the (carry, output) pair that nn.scan expects; the output is kept only when the
  caller asked for every layer's hidden state.
  """
  config: ModelConfig
  keep_output: bool = False
  attention: Optional[nn.Module] = None
  feed_forward: Optional[nn.Module] = None

  @nn.compact
  def __call__(self, x: Array, mask: Array, deterministic: bool):
    cfg = self.config
    drop = Dropout(cfg.hidden_dropout)
    attention = self.attention or SelfAttention(cfg, name="attention")
    feed_forward = self.feed_forward or FeedForward(cfg, name="feed_forward")
    x = layer_norm(cfg, "attention_layer_norm")(
        x + drop(attention(x, mask, deterministic), deterministic=deterministic))
    x = layer_norm(cfg, "output_layer_norm")(
        x + drop(feed_forward(x), deterministic=deterministic))
    x = constrain_hidden(x)
    return x, (x if self.keep_output else None)


class Encoder(nn.Module):
  """num_layers TransformerLayers, scanned (params stacked on a leading `layers` axis) or unrolled."""
  config: ModelConfig
  keep_outputs: bool = False

  @nn.compact
  def __call__(self, x: Array, mask: Array, deterministic: bool):
    cfg = self.config
    layer_cls = TransformerLayer
    if cfg.remat != "none":
      layer_cls = nn.remat(layer_cls, policy=_REMAT_POLICIES[cfg.remat], prevent_cse=not cfg.scan_layers,
                           static_argnums=(3,))
    shared = self._shared_submodules()
    if cfg.scan_layers:
      share_all = cfg.share_layers == "all"
      scanned = nn.scan(layer_cls, variable_axes={} if share_all else {"params": 0},
                        variable_broadcast="params" if share_all else False,
                        split_rngs={"params": not share_all, "dropout": True},
                        in_axes=(nn.broadcast, nn.broadcast), length=cfg.num_layers,
                        unroll=min(cfg.scan_unroll, cfg.num_layers),
                        metadata_params={nn.PARTITION_NAME: "layers"})
      x, outputs = scanned(cfg, self.keep_outputs, name="layers", **shared)(x, mask, deterministic)
      return x, outputs
    outputs = []
    if cfg.share_layers == "all":
      layers = [layer_cls(cfg, self.keep_outputs, name="layer")] * cfg.num_layers
    else:
      layers = [layer_cls(cfg, self.keep_outputs, name=f"layer_{i}", **shared) for i in range(cfg.num_layers)]
    for layer in layers:
      x, out = layer(x, mask, deterministic)
      outputs.append(out)
    return x, (jnp.stack(outputs) if self.keep_outputs else None)

  def _shared_submodules(self) -> dict[str, nn.Module]:
    cfg = self.config
    if cfg.share_layers == "attention":
      return {"attention": SelfAttention(cfg, name="shared_attention")}
    if cfg.share_layers == "ffn":
      return {"feed_forward": FeedForward(cfg, name="shared_feed_forward")}
    return {}


class MaskedLMHead(nn.Module):
  """Dense(E) -> activation -> LayerNorm -> tied word embeddings + output bias."""
  config: ModelConfig

  @nn.compact
  def __call__(self, x: Array, embeddings: Embeddings) -> Array:
    cfg = self.config
    h = activation(cfg)(dense(cfg, cfg.embed_dim, ("mlp", "embed"), "transform")(x))
    h = layer_norm(cfg, "layer_norm")(h)
    bias = self.param("output_bias", zeros_init(("vocab",)), (cfg.vocab_size,), cfg.weight_dtype)
    return embeddings.attend(h).astype(jnp.float32) + rows_of(bias.astype(jnp.float32), h.shape[:-1])


def rows_of(v: Array, lead_shape: tuple[int, ...]) -> Array:
  """v: [V] -> [*lead_shape, V], as the product ones[..., 1] @ v[1, V] (exact: one term, HIGHEST precision).

  The values are those of broadcasting; the point is the gradient, a matmul ones^T @ g instead of a
  sum over rows. XLA:CPU (YNNPACK reduce) took 117 ms for that sum over a [320, 30522] MLM gradient
  and 4.4 ms for the matmul (2 EPYC cores, jax 0.10.2): ~8% of the `mini` train step.
  """
  ones = jnp.ones(lead_shape + (1,), v.dtype)
  return jnp.einsum("...o,ov->...v", ones, v[None], precision=jax.lax.Precision.HIGHEST)


class ReplacedTokenHead(nn.Module):
  """ELECTRA's discriminator head: Dense(H) -> activation -> Dense(1), one logit per token."""
  config: ModelConfig

  @nn.compact
  def __call__(self, h: Array) -> Array:
    cfg = self.config
    h = activation(cfg)(dense(cfg, cfg.hidden_size, ("embed", "mlp"), "dense")(h))
    return dense(cfg, 1, ("mlp", "classes"), "prediction")(h)[..., 0].astype(jnp.float32)


def gather_positions(x: Array, positions: Array) -> Array:
  """x: [B, T, H], positions: int32[B, P] -> [B, P, H]."""
  return jnp.take_along_axis(x, positions[..., None].astype(jnp.int32), axis=1)


def default_position_ids(config: ModelConfig, input_ids: Array, attention_mask: Optional[Array] = None
                         ) -> Array:
  if config.position_style == "roberta":
    # As the released RoBERTa models: non-pad tokens count from pad_token_id + 1, pads sit at pad_token_id.
    # Pads are read from the attention mask when there is one: a vocabulary trained here may give [PAD]
    # another id than the model's pad_token_id (which then only sets the offset).
    not_pad = input_ids != config.pad_token_id if attention_mask is None else attention_mask != 0
    not_pad = not_pad.astype(jnp.int32)
    return jnp.cumsum(not_pad, axis=1) * not_pad + config.pad_token_id
  return jnp.broadcast_to(jnp.arange(input_ids.shape[1], dtype=jnp.int32), input_ids.shape)


def attention_mask_from(attention_mask: Array, document_ids: Optional[Array]) -> Array:
  """bool[B, 1, T|1, T]: keys a query may see (padding masked; packed documents kept apart)."""
  if document_ids is not None:
    same = document_ids[:, :, None] == document_ids[:, None, :]
    return (same & (document_ids[:, None, :] > 0))[:, None]
  return attention_mask.astype(bool)[:, None, None, :]


class BertModel(nn.Module):
  """BERT encoder with the heads its config asks for (pooler, MLM, NSP/SOP)."""
  config: ModelConfig

  @nn.compact
  def __call__(self, input_ids: Array, attention_mask: Optional[Array] = None,
               token_type_ids: Optional[Array] = None, position_ids: Optional[Array] = None,
               document_ids: Optional[Array] = None, masked_positions: Optional[Array] = None, *,
               deterministic: bool = True, output_hidden_states: bool = False) -> ModelOutput:
    """input_ids, attention_mask, token_type_ids, position_ids, document_ids: int32[B, T];
    masked_positions: int32[B, P] (MLM logits only there; every position when None)."""
    cfg = self.config
    if input_ids.ndim != 2:
      raise ValueError(f"input_ids must be [batch, length], got shape {input_ids.shape}")
    if input_ids.shape[1] > cfg.max_position_embeddings:
      raise ValueError(f"sequence length {input_ids.shape[1]} exceeds max_position_embeddings "
                       f"{cfg.max_position_embeddings}")
    if position_ids is None:
      position_ids = default_position_ids(cfg, input_ids, attention_mask)
    if attention_mask is None:
      attention_mask = jnp.ones_like(input_ids)
    if token_type_ids is None:
      token_type_ids = jnp.zeros_like(input_ids)
    embeddings = Embeddings(cfg, name="embeddings")
    x = constrain_hidden(embeddings(input_ids, token_type_ids, position_ids, deterministic))
    mask = attention_mask_from(attention_mask, document_ids)
    h, layer_outputs = Encoder(cfg, output_hidden_states, name="encoder")(x, mask, deterministic)
    out = {"last_hidden_state": h}
    if output_hidden_states:
      out["hidden_states"] = jnp.concatenate([x[None], layer_outputs], axis=0)
    if cfg.use_pooler:
      out["pooled_output"] = jnp.tanh(dense(cfg, cfg.hidden_size, ("embed", "mlp"), "pooler")(h[:, 0]))
    if cfg.mlm_head:
      at = h if masked_positions is None else gather_positions(h, masked_positions)
      out["mlm_logits"] = MaskedLMHead(cfg, name="mlm_head")(at, embeddings)
    if cfg.sentence_head != "none":
      if not cfg.use_pooler:
        raise ValueError("a sentence head (nsp/sop) needs use_pooler=True")
      logits = dense(cfg, 2, ("embed", "classes"), "sentence_classifier")(out["pooled_output"])
      out[f"{cfg.sentence_head}_logits"] = logits.astype(jnp.float32)
    if cfg.rtd_head:
      out["rtd_logits"] = ReplacedTokenHead(cfg, name="rtd_head")(h)
    return ModelOutput(**out)
