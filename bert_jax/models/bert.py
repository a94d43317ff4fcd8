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
from typing import Any, Callable, Optional

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.models import attention, batch_rows, unpad
from bert_jax.models.activations import ACTIVATIONS, REMAT_POLICIES
from bert_jax.models.config import ModelConfig
from bert_jax.models.dropout import Dropout

Array = jax.Array


@flax.struct.dataclass
class ModelOutput:
  """What the encoder returns; heads that the model does not have are None.

  last_hidden_state: [B, T, H] (None when BertModel ran with heads_only); pooled_output: [B, H];
  mlm_logits: [B, P, V] at the masked positions (or [B, T, V] when none are given); nsp_logits /
  sop_logits: [B, 2]; rtd_logits: [B, T];
  hidden_states: the embedding output and each layer's output, [L + 1, B, T, H], when asked for;
  attentions: float32 [L, B, N, T, T], each layer's attention probabilities (softmax, before dropout
  and head mask; zero for pruned heads), when asked for.
  """
  last_hidden_state: Optional[Array]
  pooled_output: Optional[Array] = None
  mlm_logits: Optional[Array] = None
  nsp_logits: Optional[Array] = None
  sop_logits: Optional[Array] = None
  rtd_logits: Optional[Array] = None
  hidden_states: Optional[Array] = None
  attentions: Optional[Array] = None


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
  return ACTIVATIONS[config.hidden_act]


def lookup(embed: nn.Embed, ids: Array, table_axes: tuple) -> Array:
  """Rows of an nn.Embed table, with the table first gathered to `table_axes` (logical names).

  The `embed` axis of a table is split over fsdp for storage; gathering it back before the lookup
  (as FSDP does for every weight) keeps the looked-up rows split over the batch, like the ids. A
  vocab axis split over tensor stays split: each device gathers the ids it holds, then a sum.
  """
  table = nn.with_logical_constraint(embed.embedding, table_axes)
  return jnp.take(table, ids, axis=0).astype(embed.dtype)


class Embeddings(nn.Module):
  """Word + position + token-type (+ task: config.num_tasks) embeddings, LayerNorm, dropout, and the E -> H
  projection if E != H."""
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
    if cfg.num_tasks:
      self.task_embeddings = embed(cfg.num_tasks, embedding_init=kernel_init(cfg, ("type_vocab", "embed")))
    self.layer_norm = layer_norm(cfg, "layer_norm")
    self.dropout = Dropout(cfg.hidden_dropout)
    if cfg.embed_dim != cfg.hidden_size:
      self.projection = dense(cfg, cfg.hidden_size, ("embed", "mlp"), "projection")

  def __call__(self, input_ids: Array, token_type_ids: Array, position_ids: Array,
               deterministic: bool, task_ids: Optional[Array] = None) -> Array:
    x = (lookup(self.word_embeddings, input_ids, ("vocab", None))
         + lookup(self.position_embeddings, position_ids, (None, None))
         + lookup(self.token_type_embeddings, token_type_ids, (None, None)))
    if self.config.num_tasks:  # one task per row: int32[B]
      tasks = jnp.zeros(input_ids.shape[:1], jnp.int32) if task_ids is None else task_ids
      x = x + lookup(self.task_embeddings, tasks, (None, None))[:, None, :]
    x = self.dropout(self.layer_norm(x), deterministic=deterministic)
    if self.config.embed_dim != self.config.hidden_size:
      x = self.projection(x)
    return x

  def attend(self, x: Array) -> Array:
    """Logits against the word-embedding table (the tied MLM output layer): [..., E] -> [..., V]."""
    return self.word_embeddings.attend(x)


class HeadWeights(nn.Module):
  """The kernel and bias of one attention projection, in the compute dtype; both shapes are given.

  q/k/v: kernel [H, N, D] ("embed", "heads", "kv"), bias [N, D]; output: kernel [N, D, H], bias [H].
  SelfAttention does the matmuls (q/k/v fused into one), so this module only owns the parameters.
  """
  config: ModelConfig
  kernel_shape: tuple[int, ...]
  kernel_axes: tuple[str, ...]
  bias_shape: tuple[int, ...]
  bias_axes: tuple[str, ...]

  @nn.compact
  def __call__(self) -> tuple[Array, Array]:
    cfg = self.config
    kernel = self.param("kernel", kernel_init(cfg, self.kernel_axes), self.kernel_shape, cfg.weight_dtype)
    bias = self.param("bias", zeros_init(self.bias_axes), self.bias_shape, cfg.weight_dtype)
    return kernel.astype(cfg.compute_dtype), bias.astype(cfg.compute_dtype)


class SelfAttention(nn.Module):
  """Multi-head self-attention: q/k/v kernels [H, N, D], output kernel [N, D, H].

  q, k and v come from one matmul against the three kernels stacked at run time ([H, 3, N, D]):
  one wide matmul (and one for each gradient) instead of three narrow ones, faster on CPU (BENCHMARKS.md,
  "q, k and v in one matmul"). The parameters stay three separate q/k/v kernels, as checkpoints name them.

  `layer` names the layer of an unrolled encoder, whose heads may be pruned (`config.pruned_heads`):
  its kernels then hold only the kept heads. head_mask: [N] over the original heads; it multiplies
  each head's attention probabilities (0 disables a head; the output bias still applies, as in HF).
  Returns (output [B, T, H], probabilities float32 [B, N, T, T] or None): the softmax before dropout
  and head mask, zero for pruned heads, when `keep_attentions`. Without dropout, a head mask or
  attentions, `attention.attend` does the work with the configured backend (the fast path of every
  train step); those three need the probabilities, so they take the explicit path (dot's masks).
  Deterministic (inference) with the dot backend, q, k and v are projected heads-first and
  `attention.attend_heads_first` does the work (the same numbers up to rounding, faster on CPU).
  """
  config: ModelConfig
  layer: Optional[int] = None

  @nn.compact
  def __call__(self, x: Array, segments: attention.Segments, deterministic: bool,
               head_mask: Optional[Array] = None, keep_attentions: bool = False,
               queries: Optional[Array] = None) -> tuple[Array, Optional[Array]]:
    """queries: int32[B, Q] or None: the positions whose outputs to compute ([B, Q, H]; keys and values
    stay at every position): BertModel's `heads_only` last layer, which always takes dot's path."""
    cfg = self.config
    heads = cfg.kept_heads(self.layer)
    n, d, h = len(heads), cfg.head_dim, cfg.hidden_size
    qkv_weights = [HeadWeights(cfg, (h, n, d), ("embed", "heads", "kv"), (n, d), ("heads", "kv"), name=name)()
                   for name in ("query", "key", "value")]
    dtype = cfg.compute_dtype
    kernel = jnp.stack([w for w, _ in qkv_weights], axis=1)
    bias = jnp.stack([b for _, b in qkv_weights])
    out_weights = HeadWeights(cfg, (n, d, h), ("heads", "kv", "embed"), (h,), ("embed",), name="out")
    backend = attention.resolve(cfg.attention, x.shape[1], segments.causal)
    if deterministic and backend == "dot" and head_mask is None and not keep_attentions and queries is None:
      # Inference: q, k and v projected straight into heads-first [B, N, T, D] (attend_heads_first).
      qkv = jnp.einsum("bth,hcnd->cbntd", x.astype(dtype), kernel) + bias[:, None, :, None, :]
      y = attention.attend_heads_first(qkv[0], qkv[1], qkv[2], segments)
      out_kernel, out_bias = out_weights()
      return jnp.einsum("bntd,ndh->bth", y, out_kernel) + out_bias, None
    project = lambda x, kernel: on_rows(lambda r: jnp.tensordot(r, kernel, axes=1), x)  # noqa: E731
    if queries is None:
      qkv = project(x.astype(dtype), kernel) + bias
      q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    else:
      q = project(gather_positions(x, queries).astype(dtype), kernel[:, 0]) + bias[0]
      kv = project(x.astype(dtype), kernel[:, 1:]) + bias[1:]
      k, v = kv[:, :, 0], kv[:, :, 1]
    dropout = cfg.attention_dropout > 0 and not deterministic
    probs = None
    if dropout or head_mask is not None or keep_attentions or queries is not None:
      if head_mask is not None and n != cfg.num_heads:
        head_mask = head_mask[jnp.asarray(heads)]
      mask = segments.dense_mask()
      if queries is not None and mask.shape[2] > 1:  # the rows of the queries kept
        mask = jnp.take_along_axis(mask, queries[:, None, :, None].astype(jnp.int32), axis=2)
      y, probs = self._explicit_attention(q, k, v, mask, head_mask, dropout)
      if n != cfg.num_heads:
        probs = jnp.zeros(probs.shape[:1] + (cfg.num_heads,) + probs.shape[2:], probs.dtype
                          ).at[:, jnp.asarray(heads)].set(probs)
    else:
      # The backend has no parameters: init runs dot, which takes any length and traces no kernel.
      y = attention.attend(q, k, v, segments, backend="dot" if self.is_initializing() else backend)
    out_kernel, out_bias = out_weights()
    return heads_out(y, out_kernel) + out_bias, (probs if keep_attentions else None)

  def _explicit_attention(self, q: Array, k: Array, v: Array, mask: Array, head_mask: Optional[Array],
                          dropout: bool) -> tuple[Array, Array]:
    probs = attention.probabilities(q, k, mask)
    weights = probs.astype(q.dtype)
    if dropout:
      weights = Dropout(self.config.attention_dropout)(weights, deterministic=False)
    if head_mask is not None:
      weights = weights * head_mask.astype(weights.dtype)[None, :, None, None]
    return jnp.einsum("bnts,bsnd->btnd", weights, v), probs


def on_rows(fn: Callable[[Array], Array], x: Array) -> Array:
  """fn (a matmul over the last axis, [N, H] -> [N, ...]) applied to x [..., H] -> [..., ...].

  Off TPU fn gets the rows flattened to 2-D: XLA:CPU then runs the weight gradient (x^T g) on x and g as
  they are, where the N-D dot's gradient went through a transposed copy of one of them; on the BERT
  train step 1.2x (BENCHMARKS.md, "2026-11-28 evening"). On TPU x goes as it is: a [B, 20, H] -> [B * 20, H]
  reshape there is a relayout copy (20 is not a multiple of the 8-row tile), and more bytes per step.
  fn's matmuls are einsum, tensordot or flax layers, not `@`: jnp.matmul's cached trace kept the int8
  dots of a QAT trace (qwix) for the float step traced after it (tests/test_quantize.py).
  """
  if attention.target_platform() == "tpu":
    return fn(x)
  y = fn(x.reshape(-1, x.shape[-1]))
  return y.reshape(x.shape[:-1] + y.shape[1:])


def heads_out(y: Array, kernel: Array) -> Array:
  """The attention output projection: y [B, T, N, D] against kernel [N, D, H] -> [B, T, H]; off TPU over
  rows [B * T, N * D] (on_rows), on TPU as the 4-D einsum (the [.., N * D] reshape would be a relayout)."""
  if attention.target_platform() == "tpu":
    return jnp.einsum("btnd,ndh->bth", y, kernel)
  n, d, h = kernel.shape
  return on_rows(lambda rows: jnp.einsum("rk,kh->rh", rows, kernel.reshape(n * d, h)),
                 y.reshape(y.shape[:2] + (n * d,)))


class FeedForward(nn.Module):
  config: ModelConfig

  @nn.compact
  def __call__(self, x: Array) -> Array:
    cfg = self.config
    intermediate = dense(cfg, cfg.intermediate_size, ("embed", "mlp"), "intermediate")
    output = dense(cfg, cfg.hidden_size, ("mlp", "embed"), "output")
    return on_rows(lambda rows: output(activation(cfg)(intermediate(rows))), x)


def constrain_hidden(x: Array) -> Array:
  """Hidden states [B, T, H] split over the batch only (logical `batch`): every token's full vector
  on the devices that hold its row, as the next layer's matmuls want it.

  Without this, XLA propagates the word-embedding table's sharding (`embed` over fsdp) into the
  lookup's output and then reshards it by replicating the whole global batch of activations on
  every device ("involuntary full rematerialization"). A no-op outside `nn.logical_axis_rules` and a
  mesh (the train and eval steps trace inside both).
  """
  return nn.with_logical_constraint(x, ("batch", "length", None))


class Adapter(nn.Module):
  """Houlsby et al. (2019)'s bottleneck adapter: y = x + up(gelu(down(x))), [B, T, H] -> [B, T, H].

  `up` starts at zero, so a model with fresh adapters computes exactly what the model without them
  does (the paper's near-identity initialisation, taken to the limit).
  """
  config: ModelConfig

  @nn.compact
  def __call__(self, x: Array) -> Array:
    cfg = self.config
    h = activation(cfg)(dense(cfg, cfg.adapter_size, ("embed", "mlp"), "down")(x))
    up = nn.Dense(cfg.hidden_size, dtype=cfg.compute_dtype, param_dtype=cfg.weight_dtype, name="up",
                  kernel_init=zeros_init(("mlp", "embed")), bias_init=zeros_init(("embed",)))
    return x + up(h)


def adapted(config: ModelConfig, name: str):
  """An Adapter named `name` when config.adapter_size > 0, else the identity (no parameters)."""
  return Adapter(config, name=name) if config.adapter_size > 0 else (lambda x: x)


class TransformerLayer(nn.Module):
  """A post-LN layer: x = LN(x + Attn(x)); x = LN(x + FFN(x)). With adapters (config.adapter_size),
  each sublayer's output passes an Adapter before the residual sum (Houlsby et al. 2019, figure 2).

  `attention`/`feed_forward` may be passed in to share them across layers (ALBERT). Returns
  (x, (x or None, attention probabilities or None)): the (carry, output) pair that nn.scan expects;
  the outputs are kept only when the caller asked for them. head_mask: [N] or None. queries: int32[B, Q]
  or None: the output only at those positions ([B, Q, H]; BertModel's `heads_only` last layer).
  """
  config: ModelConfig
  keep_output: bool = False
  keep_attentions: bool = False
  layer: Optional[int] = None
  attention: Optional[nn.Module] = None
  feed_forward: Optional[nn.Module] = None

  @nn.compact
  def __call__(self, x: Array, segments: attention.Segments, head_mask: Optional[Array], deterministic: bool,
               queries: Optional[Array] = None):
    cfg = self.config
    drop = Dropout(cfg.hidden_dropout)
    self_attention = self.attention or SelfAttention(cfg, self.layer, name="attention")
    feed_forward = self.feed_forward or FeedForward(cfg, name="feed_forward")
    y, probs = self_attention(x, segments, deterministic, head_mask, self.keep_attentions, queries)
    if queries is not None:
      x = gather_positions(x, queries)
    y = drop(y, deterministic=deterministic)
    x = layer_norm(cfg, "attention_layer_norm")(x + adapted(cfg, "attention_adapter")(y))
    y = drop(feed_forward(x), deterministic=deterministic)
    x = layer_norm(cfg, "output_layer_norm")(x + adapted(cfg, "output_adapter")(y))
    x = constrain_hidden(x)
    return x, (x if self.keep_output else None, probs)


class Encoder(nn.Module):
  """num_layers TransformerLayers, scanned (params stacked on a leading `layers` axis) or unrolled.

  Returns (x, each layer's output [L, B, T, H] or None, attention probabilities [L, B, N, T, T] or
  None). head_mask: [L, N] or None. queries: int32[B, Q] or None: the last layer runs at those
  positions only and x is theirs ([B, Q, H]; BertModel's `heads_only`), with no outputs, attentions or
  head mask.
  """
  config: ModelConfig
  keep_outputs: bool = False
  keep_attentions: bool = False

  @nn.compact
  def __call__(self, x: Array, segments: attention.Segments, head_mask: Optional[Array], deterministic: bool,
               queries: Optional[Array] = None):
    cfg = self.config
    if queries is not None and (self.keep_outputs or self.keep_attentions or head_mask is not None):
      raise ValueError("the last layer at queries only keeps no layer outputs, attentions or head masks")
    if cfg.sublayer_order:
      if self.keep_outputs or self.keep_attentions or head_mask is not None:
        raise ValueError("model.sublayer_order has no layers to return outputs, attentions or head masks of")
      x = SandwichSublayers(cfg, cfg.sublayer_order, name="sandwich")(x, segments, deterministic)
      return (x if queries is None else gather_positions(x, queries)), None, None
    layer_cls = TransformerLayer
    if cfg.remat != "none":
      layer_cls = nn.remat(layer_cls, policy=REMAT_POLICIES[cfg.remat], prevent_cse=not cfg.scan_layers,
                           static_argnums=(4,))
    shared = self._shared_submodules()
    keep = (self.keep_outputs, self.keep_attentions)
    if cfg.scan_layers:
      if queries is not None and not self.is_initializing():
        # The stacked parameters as init made them, sliced into the first L-1 layers' and the last's.
        share_all = cfg.share_layers == "all"
        def split(variables):  # {"params": the stacked layers'}
          params = nn.meta.unbox(variables["params"])
          if share_all:
            return {"params": {"first": params, "last": params}}
          return {"params": {"first": jax.tree.map(lambda a: a[:-1], params),
                             "last": jax.tree.map(lambda a: a[-1], params)}}
        stack = nn.map_variables(_LastAtQueries, "params", trans_in_fn=split, init=False)
        return stack(cfg, layer_cls, shared, name="layers")(x, segments, deterministic, queries), None, None
      x, (outputs, probs) = _scan(layer_cls, cfg, cfg.num_layers)(cfg, *keep, name="layers", **shared)(
          x, segments, head_mask, deterministic)
      return (x if queries is None else gather_positions(x, queries)), outputs, probs
    if cfg.share_layers == "all":
      layers = [layer_cls(cfg, *keep, name="layer")] * cfg.num_layers
    else:
      layers = [layer_cls(cfg, *keep, i, name=f"layer_{i}", **shared) for i in range(cfg.num_layers)]
    outputs = []
    for i, layer in enumerate(layers):
      last = queries if i == cfg.num_layers - 1 else None
      x, out = layer(x, segments, None if head_mask is None else head_mask[i], deterministic, last)
      outputs.append(out)
    stacked = [jnp.stack(column) if keep_it else None for keep_it, column in zip(keep, zip(*outputs))]
    return x, *stacked

  def _shared_submodules(self) -> dict[str, nn.Module]:
    cfg = self.config
    if cfg.share_layers == "attention":
      return {"attention": SelfAttention(cfg, name="shared_attention")}
    if cfg.share_layers == "ffn":
      return {"feed_forward": FeedForward(cfg, name="shared_feed_forward")}
    return {}


def _scan(layer_cls, cfg: ModelConfig, length: int):
  """nn.scan of `length` layers of layer_cls: parameters stacked on a leading `layers` axis (one set
  broadcast to every layer when config.share_layers='all')."""
  share_all = cfg.share_layers == "all"
  return nn.scan(layer_cls, variable_axes={} if share_all else {"params": 0},
                 variable_broadcast="params" if share_all else False,
                 split_rngs={"params": not share_all, "dropout": True},
                 in_axes=(nn.broadcast, 0, nn.broadcast), length=length, unroll=min(cfg.scan_unroll, length),
                 metadata_params={nn.PARTITION_NAME: "layers"})


class _LastAtQueries(nn.Module):
  """A scanned Encoder's layers with the last one at `queries`: one scan over the first L-1 layers
  (`first`), then the last (`last`). Encoder hands it the parameters of the plain scan, sliced, so
  checkpoints do not change."""
  config: ModelConfig
  layer_cls: Any
  shared: dict

  @nn.compact
  def __call__(self, x: Array, segments: attention.Segments, deterministic: bool, queries: Array) -> Array:
    cfg = self.config
    if cfg.num_layers > 1:
      x, _ = _scan(self.layer_cls, cfg, cfg.num_layers - 1)(cfg, name="first", **self.shared)(
          x, segments, None, deterministic)
    x, _ = self.layer_cls(cfg, name="last", **self.shared)(x, segments, None, deterministic, queries)
    return x


class SandwichSublayers(nn.Module):
  """A sandwich transformer's sublayers (Press et al. 2020) in `config.sublayer_order`: each "s" is
  x = LN(x + Attn(x)) and each "f" x = LN(x + FFN(x)), with TransformerLayer's dropout, modules
  `sublayer_{i}_attention` or `sublayer_{i}_feed_forward` and `sublayer_{i}_layer_norm`. With the order
  "sf" * L it computes L TransformerLayers exactly (tests/test_sandwich_ltr.py)."""
  config: ModelConfig
  order: str

  @nn.compact
  def __call__(self, x: Array, segments: attention.Segments, deterministic: bool) -> Array:
    cfg = self.config
    drop = Dropout(cfg.hidden_dropout)
    for i, kind in enumerate(self.order):
      if kind == "s":
        y, _ = SelfAttention(cfg, name=f"sublayer_{i}_attention")(x, segments, deterministic)
      else:
        y = FeedForward(cfg, name=f"sublayer_{i}_feed_forward")(x)
      x = constrain_hidden(layer_norm(cfg, f"sublayer_{i}_layer_norm")(x + drop(y, deterministic=deterministic)))
    return x


class KnowledgeLayer(nn.Module):
  """ERNIE-THU's aggregator (Zhang et al. 2019, section 4.2, "Knowledgeable Encoder"): one layer of the token
  stream w [B, T, H] and the entity stream e [B, T, De] (an entity's vector at the first token of its mention,
  `entity_mask` 1 there).

  w~ = LN(w + Attn(w)) (the token self-attention sublayer of TransformerLayer), e~ = LN_e(e + Attn_e(e)) (a
  multi-head self-attention over the aligned entities only: keys where entity_mask), then the information fusion
  that takes the feed-forward sublayer's place:
    h = act(W~_t w~ + W~_e e~ + b~) at aligned tokens, act(W~_t w~ + b~) elsewhere   [B, T, intermediate_size]
    w' = act(W_t h + b_t), e' = act(W_e h + b_e)      (config.entity_fusion="paper": the paper's equations)
    w' = LN(w~ + W_t h + b_t), e' = LN_e(e~ + W_e h + b_e)   ("residual": the released code's BertOutput)
  act is config.hidden_act (GELU). Modules: attention, attention_layer_norm, entity_attention,
  entity_attention_layer_norm, token_fusion (W~_t, b~), entity_fusion (W~_e, no bias), token_output,
  entity_output (+ output_layer_norm, entity_output_layer_norm with "residual").
  """
  config: ModelConfig

  @nn.compact
  def __call__(self, x: Array, e: Array, entity_mask: Array, segments: attention.Segments,
               entity_segments: attention.Segments, deterministic: bool) -> tuple[Array, Array]:
    cfg, ecfg = self.config, self.config.entity_config()
    drop = Dropout(cfg.hidden_dropout)
    act = activation(cfg)
    y, _ = SelfAttention(cfg, name="attention")(x, segments, deterministic)
    x = layer_norm(cfg, "attention_layer_norm")(x + drop(y, deterministic=deterministic))
    y, _ = SelfAttention(ecfg, name="entity_attention")(e, entity_segments, deterministic)
    e = layer_norm(ecfg, "entity_attention_layer_norm")(e + drop(y, deterministic=deterministic))
    from_entity = nn.Dense(cfg.intermediate_size, use_bias=False, dtype=cfg.compute_dtype,
                           param_dtype=cfg.weight_dtype, name="entity_fusion",
                           kernel_init=kernel_init(cfg, ("embed", "mlp")))(e)
    h = act(dense(cfg, cfg.intermediate_size, ("embed", "mlp"), "token_fusion")(x)
            + entity_mask[..., None].astype(from_entity.dtype) * from_entity)
    w_out = dense(cfg, cfg.hidden_size, ("mlp", "embed"), "token_output")(h)
    e_out = dense(cfg, cfg.entity_dim, ("mlp", "embed"), "entity_output")(h)
    if cfg.entity_fusion == "residual":
      x = layer_norm(cfg, "output_layer_norm")(x + drop(w_out, deterministic=deterministic))
      e = layer_norm(ecfg, "entity_output_layer_norm")(e + drop(e_out, deterministic=deterministic))
    else:
      x, e = drop(act(w_out), deterministic=deterministic), drop(act(e_out), deterministic=deterministic)
    return constrain_hidden(x), e


class KnowledgeEncoder(nn.Module):
  """config.entity_layers KnowledgeLayers (`layer_{i}`), unrolled, over the text encoder's output."""
  config: ModelConfig

  @nn.compact
  def __call__(self, x: Array, entity_vectors: Optional[Array], entity_mask: Optional[Array],
               segments: attention.Segments, deterministic: bool) -> Array:
    cfg = self.config
    if entity_vectors is None:
      entity_vectors = jnp.zeros(x.shape[:2] + (cfg.entity_dim,), cfg.compute_dtype)
      entity_mask = jnp.zeros(x.shape[:2], jnp.int32)
    elif entity_mask is None:
      raise ValueError("entity_vectors need their entity_mask (1 at the tokens an entity is aligned to)")
    mask = (entity_mask != 0).astype(jnp.int32)
    # The entities of a row's own document only (packed rows): key ids are the token's segment where aligned.
    entity_segments = attention.Segments(segments.ids * mask, packed=True) if segments.packed \
        else attention.Segments(mask)
    e = entity_vectors.astype(cfg.compute_dtype)
    for i in range(cfg.entity_layers):
      x, e = KnowledgeLayer(cfg, name=f"layer_{i}")(x, e, mask, segments, entity_segments, deterministic)
    return x


class MaskedLMHead(nn.Module):
  """Dense(E) -> activation -> LayerNorm -> tied word embeddings + output bias."""
  config: ModelConfig

  @nn.compact
  def __call__(self, x: Array, embeddings: Embeddings) -> Array:
    cfg = self.config
    h = activation(cfg)(dense(cfg, cfg.embed_dim, ("mlp", "embed"), "transform")(x))
    h = layer_norm(cfg, "layer_norm")(h)
    bias = self.param("output_bias", zeros_init(("vocab",)), (cfg.vocab_size,), cfg.weight_dtype)
    return tied_logits(embeddings.attend, h, bias)


def tied_logits(attend: Callable[[Array], Array], h: Array, bias: Array) -> Array:
  """h [..., E] -> float32 [..., V]: attend(h) (the tied word embeddings) plus the output bias [V], over
  the rows flattened off TPU (on_rows: there the [N, V] gradient then feeds both matmuls and the bias's
  as it is, where the N-D einsum's went through a transposed copy)."""
  bias = bias.astype(jnp.float32)
  return on_rows(lambda rows: attend(rows).astype(jnp.float32) + rows_of(bias, rows.shape[:-1]), h)


def rows_of(v: Array, lead_shape: tuple[int, ...]) -> Array:
  """v: [V] -> [*lead_shape, V], as the product ones[..., 1] @ v[1, V] (exact: one term, HIGHEST precision).

  The values are those of broadcasting; the point is the gradient, a matmul ones^T @ g instead of a
  sum over rows, which XLA:CPU's reduce runs far slower (BENCHMARKS.md, "Changed for speed").
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


def runs_heads_only(config: ModelConfig) -> bool:
  """Whether BertModel(config)(..., heads_only=True) runs its last layer at the heads' positions only: not
  with an RTD head or entity layers (they read every position), nor a sandwich order (no last layer)."""
  return not (config.rtd_head or config.entity_layers or config.sublayer_order)


def layer_head_mask(config: ModelConfig, head_mask: Optional[Array]) -> Optional[Array]:
  """head_mask [N] (the same for every layer) or [L, N] -> [L, N], or None."""
  if head_mask is None:
    return None
  head_mask = jnp.asarray(head_mask)
  shape = (config.num_layers, config.num_heads)
  if head_mask.shape not in (shape, shape[1:]):
    raise ValueError(f"head_mask must be [num_heads] or [num_layers, num_heads] = {list(shape)}, "
                     f"got shape {head_mask.shape}")
  return jnp.broadcast_to(head_mask, shape)


class BertModel(nn.Module):
  """BERT encoder with the heads its config asks for (pooler, MLM, NSP/SOP)."""
  config: ModelConfig

  @nn.compact
  def __call__(self, input_ids: Array, attention_mask: Optional[Array] = None,
               token_type_ids: Optional[Array] = None, position_ids: Optional[Array] = None,
               document_ids: Optional[Array] = None, masked_positions: Optional[Array] = None, *,
               deterministic: bool = True, output_hidden_states: bool = False,
               output_attentions: bool = False, head_mask: Optional[Array] = None,
               task_ids: Optional[Array] = None, entity_vectors: Optional[Array] = None,
               entity_mask: Optional[Array] = None, heads_only: bool = False,
               unpad_index: Optional[Array] = None) -> ModelOutput:
    """input_ids, attention_mask, token_type_ids, position_ids, document_ids: int32[B, T];
    entity_vectors: float[B, T, entity_dim], entity_mask: int32[B, T] (config.entity_layers > 0): the frozen
    vector of the entity aligned to each token (a mention's first one), 1 in the mask there; none when None;
    masked_positions: int32[B, P] (MLM logits only there; every position when None);
    task_ids: int32[B], each row's task embedding (config.num_tasks > 0; task 0 when None);
    head_mask: float[L, N] or [N] (every layer), multiplying each head's attention probabilities;
    heads_only (with masked_positions): the last layer runs only where the pooler and MLM head read,
    [CLS] and the masked positions (a pretraining step's work; the same outputs), and last_hidden_state
    is None. Without masked_positions, or where `runs_heads_only` says no, it changes nothing but that.
    unpad_index: int32[B', T] (models/unpad.py): the inputs are packed rows of a padded batch [B', T], and the
    outputs come back in that padded layout (pooler on its [CLS], heads on its tokens)."""
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
    attention.say_fallback(cfg.attention, output_attentions, head_mask)
    segments = attention.Segments.of(attention_mask, document_ids, cfg.causal)
    if cfg.entity_layers and (output_hidden_states or output_attentions or head_mask is not None):
      raise ValueError("model.entity_layers: the fusion layers return no hidden states, attentions or head masks")
    encoder = Encoder(cfg.text_config() if cfg.entity_layers else cfg, output_hidden_states, output_attentions,
                      name="encoder")
    queries = None
    if heads_only and masked_positions is not None and runs_heads_only(cfg):
      # [CLS] (the pooler's) and the masked positions; h is [B, 1 + P, H] at them.
      queries = jnp.concatenate([jnp.zeros_like(masked_positions[:, :1]), masked_positions], axis=1)
    # packed rows draw their dropout at each token's padded place (models/batch_rows.py)
    with batch_rows.packed(None if deterministic else unpad_index, input_ids.shape[0]):
      x = constrain_hidden(embeddings(input_ids, token_type_ids, position_ids, deterministic, task_ids))
      h, layer_outputs, attentions = encoder(x, segments, layer_head_mask(cfg, head_mask), deterministic,
                                             None if queries is None else queries.astype(jnp.int32))
    if cfg.entity_layers:
      h = KnowledgeEncoder(cfg, name="knowledge_encoder")(h, entity_vectors, entity_mask, segments, deterministic)
    hidden_states = jnp.concatenate([x[None], layer_outputs], axis=0) if output_hidden_states else None
    if unpad_index is not None:
      if queries is not None or output_attentions:
        raise ValueError("unpad_index: no heads_only or attentions on packed rows")
      h = unpad.restore(h, unpad_index)
      hidden_states = None if hidden_states is None else unpad.restore(hidden_states, unpad_index)
    out = {"last_hidden_state": None if heads_only else h, "attentions": attentions}
    if output_hidden_states:
      out["hidden_states"] = hidden_states
    if cfg.use_pooler:
      out["pooled_output"] = jnp.tanh(dense(cfg, cfg.hidden_size, ("embed", "mlp"), "pooler")(h[:, 0]))
    if cfg.mlm_head:
      if queries is not None:  # h is already at [CLS] and the masked positions
        at = h[:, 1:]
      else:
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
