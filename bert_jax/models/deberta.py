"""DeBERTa-v2/v3 (He et al. 2021, 2023): its config and its encoder with the MLM and RTD heads (Flax linen).

What differs from BERT: attention scores are the sum of three terms (disentangled attention), content to
content q_i.k_j, content to position q_i.Pk[d(i,j)] (c2p) and position to content k_j.Pq[d(j,i)] (p2c),
divided by sqrt(D * (1 + number of position terms)). d(i,j) is i - j mapped to log-spaced buckets beyond
position_buckets/2 (`relative_positions`), offset into a table of 2 * S relative embeddings (S = position_buckets,
or max_relative_positions without buckets), LayerNorm'd once (norm_rel_ebd="layer_norm") and projected by each
layer's own query and key projections (share_att_key). v3 adds no absolute positions to the input
(position_biased_input=False) and has no token types (type_vocab_size=0). Post-LN layers as BERT's.

Hugging Face's DebertaV2ForMaskedLM is what this reproduces, numbers included: the default (legacy) MLM head,
dense -> activation -> LayerNorm -> the tied word embeddings plus a bias, at every position or the masked ones.
v2's convolution layer (conv_kernel_size) is refused on import. Padding is masked on both sides of the score matrix,
as Hugging Face does: a padded query attends uniformly to every key and its embedding is zeroed before the first
layer; only real tokens' outputs matter.

The enhanced mask decoder (EMD, the paper's section 3.2; `EnhancedMaskDecoder` in Microsoft's code) is the MLM head's
option `emd_steps` (0: off, Hugging Face's layout, which has none). With n = emd_steps > 0 the MLM head does not read
the last layer's output: it reads Q_n, where I = H_{L-1} + P (the last layer's input plus absolute position
embeddings P, the head's own table `emd_positions`), Q_0 = I, and Q_k = layer_L(queries Q_{k-1}, keys and values
H_{L-1}), layer_L the encoder's last layer, its weights shared (`enhanced_mask_decode`). Only the MLM logits change:
last_hidden_state and the RTD head are the plain encoder's. Hugging Face export drops `emd_positions` (with its note).

The RTD head (ELECTRA's discriminator head, models/bert.py:ReplacedTokenHead) serves DeBERTa-v3's
replaced-token-detection pretraining (training/objectives/deberta_rtd.py); the summary that sequence heads read is
Hugging Face's ContextPooler, dense -> activation over [CLS] (`ContextPooler`, under head/summary).

Shapes: B batch, T length, N heads, D head dim, H hidden, R relative embeddings used, V vocab, L layers.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Mapping, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax import config_schema
from bert_jax.errors import UserError
from bert_jax.models import activations, attention
from bert_jax.models.activations import REMAT_POLICIES
from bert_jax.models.bert import (ModelOutput, ReplacedTokenHead, activation, constrain_hidden, dense, gather_positions,
                                  kernel_init, layer_head_mask, layer_norm, lookup, on_rows, tied_logits, zeros_init)
from bert_jax.models.config import FamilyConfig, check_choices
from bert_jax.models.dropout import Dropout

Array = jax.Array

_CHOICES = {"hidden_act": activations.NAMES, "pooler_act": (*activations.NAMES, "tanh"),  # tanh: HF's ContextPooler
            "norm_rel_ebd": ("layer_norm", "none")}
_POSITION_TERMS = ("c2p", "p2c")


@dataclasses.dataclass(frozen=True)
class DebertaConfig(FamilyConfig):
  """DeBERTa-v2/v3's hyper-parameters. Defaults are DeBERTa-v3-base (microsoft/deberta-v3-base).

  pos_att_type: the position terms, "|"-separated (Hugging Face's list): c2p, p2c, both, or "" (content only).
  position_buckets: S, half the relative embedding table; distances beyond S/2 share log-spaced buckets up to
    max_relative_positions (<1: max_position_embeddings). 0: no buckets, S = max_relative_positions.
  norm_rel_ebd: "layer_norm" normalises the relative embeddings once, before every layer reads them.
  position_biased_input: absolute position embeddings added to the input (v2 and v3: False).
  type_vocab_size: token type embeddings (0: none, as v3).
  use_pooler / pooler_act: not a pretraining head here (Hugging Face's ContextPooler belongs to its task classes):
    fine-tuning's sequence heads own it under head/summary (`ContextPooler`); pooler_act is its activation.
  rtd_head: the replaced-token-detection head (the RTD objective's discriminator).
  emd_steps: the enhanced mask decoder's passes through the last layer (module docstring; the paper's 2); only with
    the MLM head and without absolute positions at the input. 0: off (Hugging Face's layout).
  remat, scan_layers, dtype, param_dtype: as for BERT (bert_jax/models/config.py).
  """
  FAMILY_NAME = "DeBERTa"  # not a field (no annotation): the name its config errors use
  vocab_size: int = 128100
  hidden_size: int = 768
  num_layers: int = 12
  num_heads: int = 12
  intermediate_size: int = 3072
  hidden_act: str = "gelu"
  hidden_dropout: float = 0.1
  attention_dropout: float = 0.1
  max_position_embeddings: int = 512
  type_vocab_size: int = 0
  initializer_range: float = 0.02
  layer_norm_eps: float = 1e-7
  pos_att_type: str = "p2c|c2p"
  position_buckets: int = 256
  max_relative_positions: int = -1
  norm_rel_ebd: str = "layer_norm"
  position_biased_input: bool = False
  pad_token_id: int = 0
  pooler_act: str = "gelu"
  mlm_head: bool = True
  rtd_head: bool = False
  emd_steps: int = 0
  dtype: str = "float32"
  param_dtype: str = "float32"
  remat: str = "none"
  scan_layers: bool = True
  family: str = "deberta"

  # What code shared with BERT's family asks of a config: its pretraining objective (the sentence head) and
  # fine-tuning's layer-wise rates (shared layers); DeBERTa attends with its own explicit path.
  sentence_head = "none"
  share_layers = "none"
  attention = "dot"
  embedding_size = 0

  def __post_init__(self):
    config_schema.check_block("model", self)  # the plain fields' ranges
    check_choices(self, _CHOICES)
    if self.hidden_size % self.num_heads:
      raise UserError(f"model.hidden_size={self.hidden_size} must split into model.num_heads={self.num_heads} heads")
    unknown = [t for t in self.position_terms if t not in _POSITION_TERMS]
    if unknown:
      raise UserError(f"model.pos_att_type={self.pos_att_type!r}: {unknown[0]!r} is not one of {_POSITION_TERMS}")
    if self.position_buckets < 0 or self.position_buckets == 1:
      raise UserError(f"model.position_buckets={self.position_buckets} must be 0 (none) or at least 2")
    if self.emd_steps < 0:
      raise UserError(f"model.emd_steps={self.emd_steps} must be 0 (no enhanced mask decoder) or positive")
    if self.emd_steps and self.position_biased_input:
      raise UserError(f"model.emd_steps={self.emd_steps} needs model.position_biased_input=False: the enhanced mask "
                      "decoder adds the absolute positions that the input then lacks")
    if self.family != "deberta":
      raise UserError(f"model.family={self.family!r}: this is DeBERTa's config")

  @property
  def position_terms(self) -> tuple[str, ...]:
    return tuple(t.strip() for t in self.pos_att_type.lower().split("|") if t.strip())

  @property
  def max_relative(self) -> int:
    """The largest distance the buckets tell apart (Hugging Face's max_relative_positions after its default)."""
    return self.max_relative_positions if self.max_relative_positions >= 1 else self.max_position_embeddings

  @property
  def span(self) -> int:
    """S: the relative embedding table has 2 * S rows (Hugging Face's pos_ebd_size)."""
    return self.position_buckets if self.position_buckets > 0 else self.max_relative

  @property
  def emd(self) -> bool:
    """Whether the MLM head decodes through the enhanced mask decoder."""
    return self.mlm_head and self.emd_steps > 0

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  @property
  def embed_dim(self) -> int:
    return self.hidden_size

  @property
  def use_pooler(self) -> bool:
    return False


def backbone_params(model: Mapping[str, Any]) -> int:
  """Embeddings, relative embeddings and layers from a model section's sizes: what `bert-jax info` counts as
  the backbone (without the MLM and RTD heads)."""
  h, f = model["hidden_size"], model["intermediate_size"]
  span = model["position_buckets"] if model["position_buckets"] > 0 else (
      model["max_relative_positions"] if model["max_relative_positions"] >= 1 else model["max_position_embeddings"])
  layer = 4 * (h * h + h) + 2 * h * f + f + h + 2 * 2 * h
  embeddings = model["vocab_size"] * h + 2 * h + model["type_vocab_size"] * h
  if model["position_biased_input"]:
    embeddings += model["max_position_embeddings"] * h
  relative = 2 * span * h + (2 * h if model["norm_rel_ebd"] == "layer_norm" else 0)
  return embeddings + relative + model["num_layers"] * layer


def log_buckets(relative: np.ndarray, buckets: int, max_position: int) -> np.ndarray:
  """Hugging Face's make_log_bucket_position, in float32 as torch computes it: distances below buckets/2 as they
  are, farther ones to mid + ceil(log(|d| / mid) / log((max_position - 1) / mid) * (mid - 1)), signed."""
  sign = np.sign(relative)
  mid = buckets // 2
  near = (relative < mid) & (relative > -mid)
  abs_pos = np.where(near, mid - 1, np.abs(relative))
  ratio = (abs_pos / np.float32(mid)).astype(np.float32)
  log_pos = np.ceil(np.log(ratio) / np.log(np.float32((max_position - 1) / mid)) * np.float32(mid - 1)) + mid
  return np.where(abs_pos <= mid, relative, log_pos * sign).astype(np.int64)


def relative_positions(length: int, buckets: int, max_position: int) -> np.ndarray:
  """int64[T, T]: d(i, j), query i's relative position to key j (i - j, bucketed when buckets > 0)."""
  relative = np.arange(length)[:, None] - np.arange(length)[None, :]
  if buckets > 0 and max_position > 0:
    relative = log_buckets(relative, buckets, max_position)
  return relative


def distance_rows(cfg: DebertaConfig, length: int) -> tuple[np.ndarray, np.ndarray, int, int]:
  """(c2p [2T - 1], p2c [2T - 1], lo, hi): for each distance d = T - 1 - m (m = 0 .. 2T - 2), the row of the
  relative embedding table that Hugging Face's c2p reads for a query d positions after its key, clamp(b(d) + S),
  and that its p2c reads for a key d positions after its query, clamp(-b(d) + S) (b: the log buckets), less `lo`;
  only table rows lo..hi-1 are read at this length."""
  span = cfg.span
  d = length - 1 - np.arange(2 * length - 1)
  if cfg.position_buckets > 0 and cfg.max_relative > 0:
    d = log_buckets(d, cfg.position_buckets, cfg.max_relative)
  c2p, p2c = np.clip(d + span, 0, 2 * span - 1), np.clip(-d + span, 0, 2 * span - 1)
  lo, hi = int(min(c2p.min(), p2c.min())), int(max(c2p.max(), p2c.max())) + 1
  return (c2p - lo).astype(np.int32), (p2c - lo).astype(np.int32), lo, hi


def by_distance(w: Array) -> Array:
  """w [..., T, 2T - 1], column m holding distance T - 1 - m -> [..., T, T]: out[i, j] = w[i, T - 1 - (i - j)],
  by reshapes and slices (Transformer-XL's shift: row i starts T - 1 - i columns in), no gather."""
  t, width = w.shape[-2], w.shape[-1]
  if t == 1:
    return w
  flat = w.reshape(w.shape[:-2] + (t * width,))[..., t - 1:t - 1 + t * (width - 1)]
  return flat.reshape(w.shape[:-2] + (t, width - 1))[..., :t]


def _split_heads(x: Array, n: int) -> Array:
  return x.reshape(x.shape[:-1] + (n, x.shape[-1] // n))


class DisentangledAttention(nn.Module):
  """Self-attention with c2p and p2c position terms; query/key/value/output dense layers [H, H] with biases (the
  relative embeddings go through the same query and key layers: share_att_key). Returns (the attention output
  after its residual LayerNorm [B, T, H], probabilities float32 [B, N, T, T] or None)."""
  config: DebertaConfig

  @nn.compact
  def __call__(self, x: Array, mask: Array, relative: Array, head_mask: Optional[Array], keep_attentions: bool,
               deterministic: bool, queries: Optional[Array] = None) -> tuple[Array, Optional[Array]]:
    """queries [B, T, H]: the states the queries (and the residual) come from, x's keys and values (the enhanced
    mask decoder's); None: x's."""
    cfg = self.config
    n, d, h = cfg.num_heads, cfg.head_dim, cfg.hidden_size
    query, key, value = (dense(cfg, h, ("embed", "mlp"), name) for name in ("query", "key", "value"))
    rows = x.astype(cfg.compute_dtype)
    queries = x if queries is None else queries
    q = _split_heads(on_rows(query, queries.astype(cfg.compute_dtype)), n)
    k, v = (_split_heads(on_rows(layer, rows), n) for layer in (key, value))
    terms = cfg.position_terms
    scale = jnp.asarray((d * (1 + len(terms))) ** -0.5, cfg.compute_dtype)
    scores = jnp.einsum("btnd,bsnd->bnts", q * scale, k)
    if terms:
      c2p_rows, p2c_rows, lo, hi = distance_rows(cfg, x.shape[1])
      rel = Dropout(cfg.hidden_dropout)(relative[lo:hi].astype(cfg.compute_dtype), deterministic=deterministic)
      if "c2p" in terms:  # query i, key j: q_i . key(rel[c2p row of i - j])
        pos_key = _split_heads(key(jnp.take(rel, jnp.asarray(c2p_rows), axis=0)), n)  # [2T - 1, N, D]
        scores += by_distance(jnp.einsum("btnd,mnd->bntm", q * scale, pos_key))
      if "p2c" in terms:  # key j, query i: k_j . query(rel[p2c row of j - i]), laid out [key, query], then swapped
        pos_query = _split_heads(query(jnp.take(rel, jnp.asarray(p2c_rows), axis=0)), n)
        scores += jnp.swapaxes(by_distance(jnp.einsum("bsnd,mnd->bnsm", k, pos_query * scale)), -1, -2)
    scores = jnp.where(mask, scores.astype(jnp.float32), jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1)
    weights = Dropout(cfg.attention_dropout)(probs.astype(cfg.compute_dtype), deterministic=deterministic)
    if head_mask is not None:
      weights = weights * head_mask.astype(weights.dtype)[None, :, None, None]
    y = jnp.einsum("bnts,bsnd->btnd", weights, v).reshape(x.shape[:2] + (h,))
    y = on_rows(dense(cfg, h, ("mlp", "embed"), "output"), y)
    y = Dropout(cfg.hidden_dropout)(y, deterministic=deterministic)
    return layer_norm(cfg, "output_norm")(y + queries), (probs if keep_attentions else None)


class Layer(nn.Module):
  """Disentangled attention, then BERT's feed-forward with its residual LayerNorm. Returns the (carry, (output or
  None, probabilities or None)) pair that nn.scan expects."""
  config: DebertaConfig
  keep_output: bool = False
  keep_attentions: bool = False

  @nn.compact
  def __call__(self, x: Array, mask: Array, relative: Array, head_mask: Optional[Array], deterministic: bool,
               queries: Optional[Array] = None):
    """queries: as DisentangledAttention's (the enhanced mask decoder's); the output is then theirs."""
    cfg = self.config
    x, probs = DisentangledAttention(cfg, name="attention")(x, mask, relative, head_mask, self.keep_attentions,
                                                            deterministic, queries)
    intermediate = dense(cfg, cfg.intermediate_size, ("embed", "mlp"), "intermediate")
    output = dense(cfg, cfg.hidden_size, ("mlp", "embed"), "output")
    y = on_rows(lambda rows: output(activation(cfg)(intermediate(rows))), x)
    y = Dropout(cfg.hidden_dropout)(y, deterministic=deterministic)
    x = constrain_hidden(layer_norm(cfg, "output_norm")(y + x))
    return x, (x if self.keep_output else None, probs)


class Encoder(nn.Module):
  """The relative embeddings [2S, H] (LayerNorm'd once) and num_layers Layers, scanned (params stacked on a leading
  `layers` axis) or unrolled (layer_{i}). Returns (the last layer's output, each layer's output [L, B, T, H] or
  None, probabilities [L, B, N, T, T] or None, what the enhanced mask decoder reads or None: `DecoderInputs`)."""
  config: DebertaConfig
  keep_outputs: bool = False
  keep_attentions: bool = False

  @nn.compact
  def __call__(self, x: Array, mask: Array, head_mask: Optional[Array], deterministic: bool):
    cfg = self.config
    relative = self.param("rel_embeddings", nn.with_logical_partitioning(
        nn.initializers.normal(cfg.initializer_range), (None, "embed")), (2 * cfg.span, cfg.hidden_size),
        cfg.weight_dtype)
    if cfg.norm_rel_ebd == "layer_norm":
      relative = layer_norm(cfg, "rel_norm")(relative)
    layer_cls = Layer
    if cfg.remat != "none":
      layer_cls = nn.remat(layer_cls, policy=REMAT_POLICIES[cfg.remat], prevent_cse=not cfg.scan_layers,
                           static_argnums=(5,))
    keep = (self.keep_outputs or cfg.emd, self.keep_attentions)  # the decoder reads the last layer's input
    if cfg.scan_layers:
      scanned = nn.scan(layer_cls, variable_axes={"params": 0}, split_rngs={"params": True, "dropout": True},
                        in_axes=(nn.broadcast, nn.broadcast, 0, nn.broadcast), length=cfg.num_layers,
                        metadata_params={nn.PARTITION_NAME: "layers"})
      heads = jnp.ones((cfg.num_layers, cfg.num_heads), cfg.compute_dtype) if head_mask is None else head_mask
      h, (outputs, probs) = scanned(cfg, *keep, name="layers")(x, mask, relative, heads, deterministic)
    else:
      columns = []
      h = x
      for i in range(cfg.num_layers):
        h, out = layer_cls(cfg, *keep, name=f"layer_{i}")(
            h, mask, relative, None if head_mask is None else head_mask[i], deterministic)
        columns.append(out)
      outputs, probs = (jnp.stack(column) if kept else None for kept, column in zip(keep, zip(*columns)))
    decoder = None
    if cfg.emd:
      params = nn.meta.unbox(self.variables["params"])
      last = (jax.tree.map(lambda w: w[-1], params["layers"]) if cfg.scan_layers
              else params[f"layer_{cfg.num_layers - 1}"])
      decoder = DecoderInputs(last, x if cfg.num_layers == 1 else outputs[-2], mask, relative)
    return h, (outputs if self.keep_outputs else None), probs, decoder


@dataclasses.dataclass(frozen=True)
class DecoderInputs:
  """What the enhanced mask decoder reads from the encoder: the last layer's params, its input H_{L-1} [B, T, H],
  the score mask and the (LayerNorm'd) relative embeddings."""
  layer_params: Any
  hidden: Array
  mask: Array
  relative: Array


def enhanced_mask_decode(cfg: DebertaConfig, inputs: DecoderInputs, positions: Array, deterministic: bool,
                         rng: Optional[Array] = None) -> Array:
  """The enhanced mask decoder's states [B, T, H]: Q_0 = H_{L-1} + positions (absolute position embeddings
  [B, T, H]), then emd_steps times Q_k = the last layer (shared weights) over queries Q_{k-1} and keys and values
  H_{L-1} (Microsoft's EnhancedMaskDecoder.emd_context_layer). rng: dropout's, when not deterministic."""
  layer = Layer(cfg, parent=None)
  queries = inputs.hidden + positions.astype(inputs.hidden.dtype)
  for step in range(cfg.emd_steps):
    rngs = None if deterministic else {"dropout": jax.random.fold_in(rng, step)}
    queries, _ = layer.apply({"params": inputs.layer_params}, inputs.hidden, inputs.mask, inputs.relative, None,
                             deterministic, queries, rngs=rngs)
  return queries


class Embeddings(nn.Module):
  """Word (+ absolute position, + token type, where the config has them) embeddings, LayerNorm, zero at padding,
  dropout."""
  config: DebertaConfig

  def setup(self):
    cfg = self.config
    embed = functools.partial(nn.Embed, features=cfg.hidden_size, dtype=cfg.compute_dtype,
                              param_dtype=cfg.weight_dtype)
    self.word_embeddings = embed(cfg.vocab_size, embedding_init=kernel_init(cfg, ("vocab", "embed")))
    if cfg.position_biased_input:
      self.position_embeddings = embed(cfg.max_position_embeddings, embedding_init=kernel_init(cfg, (None, "embed")))
    if cfg.type_vocab_size:
      self.token_type_embeddings = embed(cfg.type_vocab_size, embedding_init=kernel_init(cfg, (None, "embed")))
    self.layer_norm = layer_norm(cfg, "layer_norm")
    self.dropout = Dropout(cfg.hidden_dropout)

  def __call__(self, input_ids: Array, token_type_ids: Array, position_ids: Array, attention_mask: Array,
               deterministic: bool) -> Array:
    x = lookup(self.word_embeddings, input_ids, ("vocab", None))
    if self.config.position_biased_input:
      x = x + lookup(self.position_embeddings, position_ids, (None, None))
    if self.config.type_vocab_size:
      x = x + lookup(self.token_type_embeddings, token_type_ids, (None, None))
    x = self.layer_norm(x) * attention_mask[..., None].astype(self.config.compute_dtype)
    return self.dropout(x, deterministic=deterministic)

  def attend(self, x: Array) -> Array:
    """Logits against the word embeddings (the tied MLM decoder): [..., H] -> [..., V]."""
    return self.word_embeddings.attend(x)


class MaskedLMHead(nn.Module):
  """Hugging Face's (legacy) DeBERTa-v2 MLM head: dense -> activation -> LayerNorm -> tied word embeddings + bias,
  over x [B, T, H] at masked_positions [B, P] (every position when None); with the enhanced mask decoder
  (config.emd) over the decoder's states instead, from `decoder` and its own absolute position table."""
  config: DebertaConfig

  @nn.compact
  def __call__(self, x: Array, attend, masked_positions: Optional[Array] = None,
               decoder: Optional[DecoderInputs] = None, position_ids: Optional[Array] = None,
               deterministic: bool = True) -> Array:
    cfg = self.config
    if cfg.emd:
      table = nn.Embed(cfg.max_position_embeddings, cfg.hidden_size, dtype=cfg.compute_dtype,
                       param_dtype=cfg.weight_dtype, embedding_init=kernel_init(cfg, (None, "embed")),
                       name="emd_positions")
      rng = None if deterministic else self.make_rng("dropout")
      x = enhanced_mask_decode(cfg, decoder, lookup(table, position_ids, (None, None)), deterministic, rng)
    x = x if masked_positions is None else gather_positions(x, masked_positions)
    h = on_rows(dense(cfg, cfg.hidden_size, ("mlp", "embed"), "transform"), x)
    h = layer_norm(cfg, "layer_norm")(activation(cfg)(h))
    bias = self.param("output_bias", zeros_init(("vocab",)), (cfg.vocab_size,), cfg.weight_dtype)
    return tied_logits(attend, h, bias)


class ContextPooler(nn.Module):
  """Hugging Face's ContextPooler, the summary DebertaV2ForSequenceClassification reads: activation(dense([CLS]))
  [B, H] (its pooler_dropout is 0 in every released config; the head's dropout follows): the family's `summary`."""
  config: DebertaConfig

  @nn.compact
  def __call__(self, out: ModelOutput, attention_mask: Array, deterministic: bool) -> Array:
    del attention_mask, deterministic
    cfg = self.config
    pooled = dense(cfg, cfg.hidden_size, ("embed", "mlp"), "dense")(out.last_hidden_state[:, 0])
    return jnp.tanh(pooled) if cfg.pooler_act == "tanh" else activation(cfg.replace(hidden_act=cfg.pooler_act))(pooled)


def score_mask(attention_mask: Array, document_ids: Optional[Array]) -> Array:
  """bool[B, 1, T, T]: the keys each query sees: real keys of its own document, and none for a padded query
  (Hugging Face's mask_i * mask_j: its softmax is then uniform)."""
  segments = attention.Segments.of(attention_mask, document_ids)
  keys = segments.dense_mask()
  return keys & (segments.ids > 0)[:, None, :, None]


class DebertaModel(nn.Module):
  """The DeBERTa-v2/v3 encoder with the heads its config asks for (MLM, RTD)."""
  config: DebertaConfig

  @nn.compact
  def __call__(self, input_ids: Array, attention_mask: Optional[Array] = None,
               token_type_ids: Optional[Array] = None, position_ids: Optional[Array] = None,
               document_ids: Optional[Array] = None, masked_positions: Optional[Array] = None, *,
               deterministic: bool = True, output_hidden_states: bool = False,
               output_attentions: bool = False, head_mask: Optional[Array] = None) -> ModelOutput:
    """input_ids, attention_mask, token_type_ids, position_ids (absolute; read with position_biased_input or the
    enhanced mask decoder), document_ids (packed rows: attention stays inside each document): int32[B, T];
    masked_positions: int32[B, P] (MLM logits only there; every position when None); head_mask: float[L, N] or [N]."""
    cfg = self.config
    if input_ids.ndim != 2:
      raise ValueError(f"input_ids must be [batch, length], got shape {input_ids.shape}")
    if input_ids.shape[1] > cfg.max_position_embeddings:
      raise ValueError(f"sequence length {input_ids.shape[1]} exceeds max_position_embeddings "
                       f"{cfg.max_position_embeddings}")
    if attention_mask is None:
      attention_mask = jnp.ones_like(input_ids)
    if token_type_ids is None:
      token_type_ids = jnp.zeros_like(input_ids)
    if position_ids is None:
      position_ids = jnp.broadcast_to(jnp.arange(input_ids.shape[1], dtype=jnp.int32), input_ids.shape)
    embeddings = Embeddings(cfg, name="embeddings")
    x = constrain_hidden(embeddings(input_ids, token_type_ids, position_ids, attention_mask, deterministic))
    encoder = Encoder(cfg, output_hidden_states, output_attentions, name="encoder")
    h, layer_outputs, attentions, decoder = encoder(x, score_mask(attention_mask, document_ids),
                                                    layer_head_mask(cfg, head_mask), deterministic)
    out = {"last_hidden_state": h, "attentions": attentions}
    if output_hidden_states:
      out["hidden_states"] = jnp.concatenate([x[None], layer_outputs], axis=0)
    if cfg.mlm_head:
      out["mlm_logits"] = MaskedLMHead(cfg, name="mlm_head")(h, embeddings.attend, masked_positions, decoder,
                                                             position_ids, deterministic)
    if cfg.rtd_head:
      out["rtd_logits"] = ReplacedTokenHead(cfg, name="rtd_head")(h)
    return ModelOutput(**out)


# --- DeBERTa-v3's pretraining pair (training/objectives/deberta_rtd.py): the discriminator's token table ----------

WORD_TABLE = ("embeddings", "word_embeddings", "embedding")


def leaf(tree: Mapping, path: tuple[str, ...]) -> Any:
  for key in path:
    tree = tree[key]
  return tree


def with_leaf(tree: Mapping, path: tuple[str, ...], value: Any) -> dict:
  """`tree` with the leaf at `path` replaced (the dicts on the way copied)."""
  if not path:
    return value
  return {**tree, path[0]: with_leaf(tree[path[0]], path[1:], value)}


def discriminator_tree(pair: Mapping, disentangled: bool = True) -> dict:
  """The discriminator's DebertaModel tree out of a {"generator", "discriminator"} pair trained with
  gradient-disentangled embedding sharing: its token table E_D = stop_gradient(E) + E_delta (E the generator's,
  E_delta the discriminator's own), or E + E_delta (disentangled=False: the finished discriminator's table)."""
  shared = leaf(pair["generator"], WORD_TABLE)
  shared = jax.lax.stop_gradient(shared) if disentangled else shared
  return with_leaf(pair["discriminator"], WORD_TABLE, shared + leaf(pair["discriminator"], WORD_TABLE))


def from_pretraining(params: Mapping) -> dict:
  """A DeBERTa tree as a conversion reads it: a pretraining run's pair becomes its finished discriminator."""
  if "discriminator" in params and "generator" in params:
    return discriminator_tree({k: jax.tree.map(np.asarray, params[k]) for k in ("generator", "discriminator")},
                              disentangled=False)
  return dict(params)
