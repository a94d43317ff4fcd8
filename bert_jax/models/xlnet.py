"""XLNet (Yang et al. 2019): Transformer-XL's relative attention with two streams (Flax linen).

What differs from BERT: no position table; every layer scores a query i against a key j as
  (q_i + u) . k_j             content        (u: r_w_bias, "content_bias")
  + (q_i + v) . r_{i-j}       position       (v: r_r_bias, "position_bias"; r: sinusoids of the distance,
                                             projected by "position_key")
  + (q_i + b) . s_{ij}        segment        (b: r_s_bias, "segment_bias"; s: "segment_embedding"[0] for
                                             the same segment, [1] for another)
all over sqrt(D). The position term is computed for every (i, distance) pair and moved into (i, j) by
Transformer-XL's relative shift (`rel_shift`): no [T, T, H] tensor of encodings. Post-LN layers.

Two streams: the content stream h sees the tokens (each position its own token too); the query stream g
(pretraining only) starts from one learnt vector (`mask_emb`) and at each predicted position sees the
position but not its token. Which tokens a position sees is the factorisation order's `perm_mask`
[B, T, T] (1: query i may not see token j); `target_mapping` [B, P, T] says which positions the P query
vectors stand for (one-hot rows). Memory (`mems` [L, B, M, H], Transformer-XL's recurrence): each layer
also attends to the previous segment's states at its input, without gradient; with `config.mem_len`
the output carries the next segment's memory.

Windows (`config.window_len`, fine-tuning over long inputs: finetune's task.memory_segments): an input
longer than window_len runs as consecutive windows of window_len tokens, in order, each attending to the
memory (the last mem_len layer inputs, without gradient) of the windows before it; the outputs are the
windows' outputs side by side, so heads read [B, T, H] as usual (XLNet's summary: the last window's last
token). Unlike Transformer-XL and Hugging Face, whose memory is always visible, padding in the memory is
masked (`_masks`): a left-padded row's outputs do not depend on how many windows of padding precede its
text (the first window's memory is mem_len masked zeros, which equals no memory).

The call and its outputs are BertModel's (`bert.ModelOutput`: last_hidden_state is the content stream's,
mlm_logits the tied LM head's, over the query stream when there is one). As Hugging Face's XLNet, an
attention_mask hides padding as keys (XLNet pads on the left; relative positions make that free).

Shapes: B batch, T length (queries), M memory, K = M + T keys, R = K + T distances, P predictions,
N heads, D head dim, H hidden, F intermediate, V vocab, L layers. Parameters keep Hugging Face's
[H, N, D] layout for q, k, v, out (o) and position_key (r).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Mapping, Optional

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax import config_schema
from bert_jax.errors import UserError
from bert_jax.models import activations
from bert_jax.models.activations import ACTIVATIONS, REMAT_POLICIES
from bert_jax.models.bert import ModelOutput, constrain_hidden, dense, layer_head_mask, lookup, tied_logits
from bert_jax.models.config import FamilyConfig, check_choices
from bert_jax.models.dropout import Dropout

Array = jax.Array

_NEG = 1e30  # what Hugging Face's and the original code subtract from a blocked score


@dataclasses.dataclass(frozen=True)
class XLNetConfig(FamilyConfig):
  """XLNet's hyper-parameters. Defaults are xlnet-base-cased.

  hidden_size (d_model), num_heads (n_head; D = hidden_size / num_heads), intermediate_size (d_inner).
  mem_len: how many states of each layer's input the output keeps as the next segment's memory (0:
    none kept); reuse_len: of this segment, the first reuse_len tokens are cached (0: all; the
    pretraining data's reuse length).
  clamp_len: distances beyond +-clamp_len share one encoding (-1: no clamp).
  bi_data: the second half of the batch reads its rows backwards (pretraining's reversed streams,
    training/objectives/xlnet.py): its distances are negated, as XLNet's and Hugging Face's
    relative_positional_encoding with bi_data (the batch must be even; one row, as at init, reads forward);
    or the rows the call's `backward_rows` names.
  max_position_embeddings: XLNet has no position table; the longest input fine-tuning builds.
  mlm_head: the LM head (the word embeddings, tied, plus a bias: Hugging Face's lm_loss).
  start_n_top, end_n_top: the SQuAD beam head's starts, and ends per start (head kind xlnet_beam,
    models/xlnet_qa.py; Hugging Face's config keys of the same names).
  window_len: an input longer than this runs as windows of window_len tokens with memory between them
    (the module docstring; needs mem_len > 0); 0: the whole input at once. Fine-tuning sets it from
    task.memory_segments (finetune/memory.py); the memory of windows keeps whole windows (reuse_len is
    pretraining's).
  remat, scan_layers, scan_unroll, dtype, param_dtype: as for BERT (bert_jax/models/config.py).
  attention: the backend, as for every family (bert_jax/models/attention.py); XLNet's relative two-stream
    attention adds position and segment scores to the content scores, which only 'dot' (XLA) takes: splash
    and cudnn are refused.
  """
  FAMILY_NAME = "XLNet"  # not a field (no annotation): the name its config errors use
  vocab_size: int = 32000
  hidden_size: int = 768
  num_layers: int = 12
  num_heads: int = 12
  intermediate_size: int = 3072
  hidden_act: str = "gelu"
  layer_norm_eps: float = 1e-12
  hidden_dropout: float = 0.1
  attention_dropout: float = 0.1
  max_position_embeddings: int = 512
  mem_len: int = 0
  reuse_len: int = 0
  clamp_len: int = -1
  bi_data: bool = False
  initializer_range: float = 0.02
  pad_token_id: int = 5
  mlm_head: bool = True
  start_n_top: int = 5
  end_n_top: int = 5
  window_len: int = 0
  dtype: str = "float32"
  param_dtype: str = "float32"
  remat: str = "none"
  scan_layers: bool = True
  scan_unroll: int = 1
  attention: str = "dot"
  family: str = "xlnet"

  # What code shared with BERT's family asks of a config (its objectives, fine-tuning's layer-wise rates).
  sentence_head = "none"
  rtd_head = False
  use_pooler = False
  share_layers = "none"

  def __post_init__(self):
    config_schema.check_block("model", self)  # the plain fields' ranges
    check_choices(self, {"hidden_act": activations.NAMES})
    if self.hidden_size % self.num_heads or self.hidden_size % 2:
      raise UserError(f"model.hidden_size={self.hidden_size} must be even and split into "
                      f"model.num_heads={self.num_heads} heads")
    if self.mem_len < 0 or self.reuse_len < 0:
      raise UserError(f"model.mem_len={self.mem_len} and model.reuse_len={self.reuse_len} must be >= 0")
    if self.window_len < 0 or (self.window_len and not self.mem_len):
      raise UserError(f"model.window_len={self.window_len} must be >= 0, and with windows model.mem_len "
                      f"(here {self.mem_len}) must be > 0: the memory the windows pass on")
    if self.family != "xlnet":
      raise UserError(f"model.family={self.family!r}: this is XLNet's config")
    if self.attention != "dot":
      raise UserError(f"model.attention={self.attention!r}: XLNet's relative attention adds position and segment "
                      "scores that only the 'dot' backend takes; set model.attention='dot'")


  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  @property
  def embed_dim(self) -> int:
    return self.hidden_size


def backbone_params(model: Mapping[str, Any]) -> int:
  """Word embeddings, mask_emb and the layers from a model section's sizes (what `bert-jax info` counts)."""
  h, f = model["hidden_size"], model["intermediate_size"]
  attention = 5 * h * h + 3 * h + 2 * h + 2 * h  # q, k, v, o, r; r_w/r_r/r_s biases; seg_embed; LayerNorm
  ffn = 2 * h * f + f + h + 2 * h
  return model["vocab_size"] * h + h + model["num_layers"] * (attention + ffn)


@flax.struct.dataclass
class XLNetOutput(ModelOutput):
  """ModelOutput plus the query stream [B, P, H] (when target_mapping made one) and the next
  segment's memory [L, B, mem_len, H] (when config.mem_len > 0)."""
  query_hidden_state: Optional[Array] = None
  mems: Optional[Array] = None


# --- Relative positions -----------------------------------------------------------------------------------

def relative_positions(q_len: int, k_len: int, hidden: int, clamp_len: int = -1, bi_data: bool = False
                       ) -> np.ndarray:
  """Sinusoidal encodings [G, R = K + T, H] of the distances K, K - 1, ..., -T + 1 (Transformer-XL's, bi-
  directional): [sin(d f), cos(d f)] with f = 10000^(-2k/H). G = 1, or 2 with bi_data: the second group's
  distances negated (for the batch's backward half)."""
  distances = np.arange(k_len, -q_len, -1.0)
  if bi_data:
    distances = np.stack([distances, -distances])
  distances = np.atleast_2d(distances)
  if clamp_len > 0:
    distances = np.clip(distances, -clamp_len, clamp_len)
  inv_freq = 1.0 / 10000 ** (np.arange(0, hidden, 2.0) / hidden)
  angles = np.einsum("gr,f->grf", distances, inv_freq)
  return np.concatenate([np.sin(angles), np.cos(angles)], axis=-1).astype(np.float32)


def rel_shift(x: Array, k_len: int) -> Array:
  """Scores [..., T, R] against the distances K, K - 1, ... -> [..., T, K] against the keys: entry (i, j)
  becomes the score of distance M + i - j (query i sits at M + i). Transformer-XL's reshape trick: view
  [R, T], drop the first row, view [T, R - 1], keep K columns."""
  *lead, t, r = x.shape
  x = x.reshape(*lead, r, t)[..., 1:, :]
  return x.reshape(*lead, t, r - 1)[..., :k_len]


def _init(cfg: XLNetConfig, axes: tuple):
  return nn.with_logical_partitioning(nn.initializers.normal(cfg.initializer_range), axes)


def _zeros(axes: tuple):
  return nn.with_logical_partitioning(nn.initializers.zeros_init(), axes)


def layer_norm(cfg: XLNetConfig, name: str) -> nn.LayerNorm:
  return nn.LayerNorm(epsilon=cfg.layer_norm_eps, dtype=cfg.compute_dtype, param_dtype=cfg.weight_dtype, name=name,
                      scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), ("norm",)),
                      bias_init=_zeros(("norm",)))


# --- The layer --------------------------------------------------------------------------------------------

class RelativeAttention(nn.Module):
  """Two-stream relative multi-head attention with Hugging Face's XLNetRelativeAttention's parameters."""
  config: XLNetConfig

  def setup(self):
    cfg = self.config
    h, n, d = cfg.hidden_size, cfg.num_heads, cfg.head_dim
    heads = ("embed", "heads", "kv")
    for name in ("query", "key", "value", "output", "position_key"):
      setattr(self, name, self.param(name, _init(cfg, heads), (h, n, d), cfg.weight_dtype))
    for name in ("content_bias", "position_bias", "segment_bias"):
      setattr(self, name, self.param(name, _init(cfg, ("heads", "kv")), (n, d), cfg.weight_dtype))
    self.segment_embedding = self.param("segment_embedding", _init(cfg, (None, "heads", "kv")), (2, n, d),
                                        cfg.weight_dtype)
    self.layer_norm = layer_norm(cfg, "layer_norm")
    self.attention_dropout = Dropout(cfg.attention_dropout)
    self.output_dropout = Dropout(cfg.hidden_dropout)

  def _w(self, w: Array) -> Array:
    return w.astype(self.config.compute_dtype)

  def core(self, q: Array, k: Array, v: Array, kr: Array, backward: Optional[Array], other_segment: Optional[Array],
           mask: Optional[Array], head_mask: Optional[Array], deterministic: bool) -> Array:
    """q [B, T, N, D], k/v [B, K, N, D], kr [G, R, N, D] (G = 2: forward, backward), backward int32 [B] (the
    group of each row; None when G = 1), other_segment bool [B, T, K], mask [B, T, K] (1: blocked) ->
    [B, T, N, D]."""
    cfg = self.config
    content = jnp.einsum("bind,bjnd->bnij", q + self._w(self.content_bias), k)
    qr = q + self._w(self.position_bias)
    if backward is None:
      position = jnp.einsum("bind,rnd->bnir", qr, kr[0])
    else:
      position = jnp.einsum("bind,brnd->bnir", qr, kr[backward])
    position = rel_shift(position, k.shape[1])
    score = content + position
    if other_segment is not None:
      per_segment = jnp.einsum("bind,snd->bnis", q + self._w(self.segment_bias), self._w(self.segment_embedding))
      score = score + jnp.where(other_segment[:, None], per_segment[..., 1:], per_segment[..., :1])
    score = score.astype(jnp.float32) * (1.0 / np.sqrt(cfg.head_dim))
    if mask is not None:
      score = score - _NEG * mask[:, None].astype(jnp.float32)
    probs = jax.nn.softmax(score, axis=-1).astype(q.dtype)
    probs = self.attention_dropout(probs, deterministic=deterministic)
    if head_mask is not None:
      probs = probs * head_mask.astype(probs.dtype)[None, :, None, None]
    return jnp.einsum("bnij,bjnd->bind", probs, v)

  def post(self, x: Array, vec: Array, deterministic: bool) -> Array:
    out = jnp.einsum("bind,hnd->bih", vec, self._w(self.output))
    return self.layer_norm(self.output_dropout(out, deterministic=deterministic) + x)

  def __call__(self, h: Array, g: Optional[Array], mem: Optional[Array], pos: Array, other_segment, mask_h, mask_g,
               target_mapping: Optional[Array], head_mask: Optional[Array], deterministic: bool):
    """h [B, T, H]; g [B, P, H] or None; mem [B, M, H] or None; pos: (encodings [G, R, H], each row's group
    int32 [B] or None) -> (h, g)."""
    pos, backward = pos
    keys = h if mem is None else jnp.concatenate([mem.astype(h.dtype), h], axis=1)
    k = jnp.einsum("bjh,hnd->bjnd", keys, self._w(self.key))
    v = jnp.einsum("bjh,hnd->bjnd", keys, self._w(self.value))
    kr = jnp.einsum("grh,hnd->grnd", pos.astype(h.dtype), self._w(self.position_key))
    args = (k, v, kr, backward, other_segment)
    q_h = jnp.einsum("bih,hnd->bind", h, self._w(self.query))
    h_out = self.post(h, self.core(q_h, *args, mask_h, head_mask, deterministic), deterministic)
    if g is None:
      return h_out, None
    q_g = jnp.einsum("bmh,hnd->bmnd", g, self._w(self.query))
    if target_mapping is not None:  # each query vector to the position it predicts, and back
      q_g = jnp.einsum("bmnd,bml->blnd", q_g, target_mapping.astype(q_g.dtype))
    vec_g = self.core(q_g, *args, mask_g, head_mask, deterministic)
    if target_mapping is not None:
      vec_g = jnp.einsum("blnd,bml->bmnd", vec_g, target_mapping.astype(vec_g.dtype))
    return h_out, self.post(g, vec_g, deterministic)


class FeedForward(nn.Module):
  """LayerNorm(x + W2 act(W1 x)) with dropout after the activation and after W2."""
  config: XLNetConfig

  @nn.compact
  def __call__(self, x: Array, deterministic: bool) -> Array:
    cfg = self.config
    y = nn.Dense(cfg.intermediate_size, dtype=cfg.compute_dtype, param_dtype=cfg.weight_dtype,
                 kernel_init=_init(cfg, ("embed", "mlp")), bias_init=_zeros(("mlp",)), name="intermediate")(x)
    y = Dropout(cfg.hidden_dropout)(ACTIVATIONS[cfg.hidden_act](y), deterministic=deterministic)
    y = nn.Dense(cfg.hidden_size, dtype=cfg.compute_dtype, param_dtype=cfg.weight_dtype,
                 kernel_init=_init(cfg, ("mlp", "embed")), bias_init=_zeros(("embed",)), name="output")(y)
    return layer_norm(cfg, "layer_norm")(Dropout(cfg.hidden_dropout)(y, deterministic=deterministic) + x)


class Layer(nn.Module):
  """Relative attention then the feed-forward network, on both streams (shared weights).

  Returns the (carry, kept) pair nn.scan expects: carry (h, g); kept: the layer's input h (what the
  hidden states and the next memory are made of) when `keep_input`, else None.
  """
  config: XLNetConfig
  keep_input: bool = False

  @nn.compact
  def __call__(self, carry, mem, head_mask, pos, other_segment, mask_h, mask_g, target_mapping, deterministic):
    h, g = carry
    h_in = h
    h, g = RelativeAttention(self.config, name="attention")(h, g, mem, pos, other_segment, mask_h, mask_g,
                                                            target_mapping, head_mask, deterministic)
    ffn = FeedForward(self.config, name="feed_forward")
    h = constrain_hidden(ffn(h, deterministic))
    g = None if g is None else ffn(g, deterministic)
    return (h, g), (h_in if self.keep_input else None)


class Encoder(nn.Module):
  """num_layers Layers, scanned (params stacked on a leading `layers` axis) or unrolled (layer_{i}).
  Returns ((h, g), each layer's input h [L, B, T, H] or None)."""
  config: XLNetConfig
  keep_inputs: bool = False

  @nn.compact
  def __call__(self, h, g, mems, head_mask, pos, other_segment, mask_h, mask_g, target_mapping, deterministic):
    cfg = self.config
    layer_cls = Layer
    if cfg.remat != "none":
      layer_cls = nn.remat(layer_cls, policy=REMAT_POLICIES[cfg.remat], prevent_cse=not cfg.scan_layers,
                           static_argnums=(9,))
    shared = (pos, other_segment, mask_h, mask_g, target_mapping, deterministic)
    if cfg.scan_layers:
      scanned = nn.scan(layer_cls, variable_axes={"params": 0}, split_rngs={"params": True, "dropout": True},
                        in_axes=(0, 0) + (nn.broadcast,) * 6, length=cfg.num_layers,
                        unroll=min(cfg.scan_unroll, cfg.num_layers), metadata_params={nn.PARTITION_NAME: "layers"})
      return scanned(cfg, self.keep_inputs, name="layers")((h, g), mems, head_mask, *shared)
    carry, inputs = (h, g), []
    for i in range(cfg.num_layers):
      carry, kept = layer_cls(cfg, self.keep_inputs, name=f"layer_{i}")(
          carry, None if mems is None else mems[i], None if head_mask is None else head_mask[i], *shared)
      inputs.append(kept)
    return carry, (jnp.stack(inputs) if self.keep_inputs else None)


def _masks(attention_mask: Optional[Array], perm_mask: Optional[Array], q_len: int, m_len: int,
           mems_mask: Optional[Array] = None):
  """(content-stream mask, query-stream mask), float [B or 1, T, K] with 1 where blocked, or (None, None).

  As XLNet: padding blocks keys, perm_mask blocks what the order hides; the memory is visible (as XLNet's,
  always, when mems_mask [B, M] is None; else where it is 1: windows mask their memory's padding);
  the content stream always sees its own position, the query stream only when nothing else blocks it.
  """
  if attention_mask is None and perm_mask is None:
    return None, None
  blocked = jnp.zeros((1, q_len, q_len), jnp.float32)
  if attention_mask is not None:
    blocked = blocked + (1.0 - attention_mask.astype(jnp.float32))[:, None, :]
  if perm_mask is not None:
    blocked = blocked + perm_mask.astype(jnp.float32)
  blocked = jnp.pad(blocked, ((0, 0), (0, 0), (m_len, 0)))
  if mems_mask is not None:
    blocked = blocked + jnp.pad(1.0 - mems_mask.astype(jnp.float32), ((0, 0), (0, q_len)))[:, None, :]
  eye = jnp.pad(jnp.eye(q_len, dtype=jnp.float32), ((0, 0), (m_len, 0)))
  mask_g = (blocked > 0).astype(jnp.float32)
  mask_h = ((mask_g - eye[None]) > 0).astype(jnp.float32)
  return mask_h, mask_g


def _other_segment(token_type_ids: Optional[Array], m_len: int) -> Optional[Array]:
  """bool [B, T, K]: query and key in different segments (the memory counts as segment 0)."""
  if token_type_ids is None:
    return None
  keys = jnp.pad(token_type_ids, ((0, 0), (m_len, 0)))
  return token_type_ids[:, :, None] != keys[:, None, :]


class Embeddings(nn.Module):
  """The word embeddings [V, H] and the query stream's start (mask_emb [1, 1, H]); no positions, no norm."""
  config: XLNetConfig

  def setup(self):
    cfg = self.config
    self.word_embeddings = nn.Embed(cfg.vocab_size, cfg.hidden_size, dtype=cfg.compute_dtype,
                                    param_dtype=cfg.weight_dtype, embedding_init=_init(cfg, ("vocab", "embed")))
    self.mask_emb = self.param("mask_emb", _init(cfg, (None, None, "embed")), (1, 1, cfg.hidden_size),
                               cfg.weight_dtype)

  def __call__(self, input_ids: Array) -> Array:
    return constrain_hidden(lookup(self.word_embeddings, input_ids, ("vocab", None)))

  def queries(self, batch: int, count: int) -> Array:
    """The query stream's input: mask_emb at each of `count` predictions, [B, P, H]."""
    return jnp.broadcast_to(self.mask_emb.astype(self.config.compute_dtype), (batch, count, self.config.hidden_size))

  def attend(self, x: Array) -> Array:
    """Logits against the word embeddings (the tied LM decoder): [..., H] -> [..., V]."""
    return self.word_embeddings.attend(x)


class LMHead(nn.Module):
  """The tied LM head: [..., H] -> float32 [..., V] against the word embeddings, plus a bias."""
  config: XLNetConfig

  @nn.compact
  def __call__(self, x: Array, embeddings: Embeddings) -> Array:
    cfg = self.config
    bias = self.param("output_bias", _zeros(("vocab",)), (cfg.vocab_size,), cfg.weight_dtype)
    return tied_logits(embeddings.attend, x, bias)


class XLNetModel(nn.Module):
  """The XLNet encoder with its LM head when config.mlm_head."""
  config: XLNetConfig

  @nn.compact
  def __call__(self, input_ids: Array, attention_mask: Optional[Array] = None,
               token_type_ids: Optional[Array] = None, *, perm_mask: Optional[Array] = None,
               target_mapping: Optional[Array] = None, mems: Optional[Array] = None, deterministic: bool = True,
               output_hidden_states: bool = False, head_mask: Optional[Array] = None,
               backward_rows: Optional[Array] = None) -> XLNetOutput:
    """input_ids, attention_mask, token_type_ids: int32[B, T]; perm_mask: [B, T, T] (1: i may not see j);
    target_mapping: [B, P, T] (a query stream of P vectors; none without it, as Hugging Face); mems:
    [L, B, M, H]; head_mask: [L, N] or [N]; backward_rows: int[B], with config.bi_data the rows that read
    backwards (default: the second half, as Hugging Face; the pretraining rows say it, so a device's or a
    micro-batch's share of the rows reads each row the right way)."""
    cfg = self.config
    if input_ids.ndim != 2:
      raise ValueError(f"input_ids must be [batch, length], got shape {input_ids.shape}")
    b, t = input_ids.shape
    if cfg.bi_data and b % 2 and b > 1 and backward_rows is None:
      raise ValueError(f"model.bi_data reads half the batch backwards: the batch ({b} rows) must be even")
    windowed = cfg.window_len and t > cfg.window_len
    if windowed and (t % cfg.window_len or perm_mask is not None or target_mapping is not None):
      raise ValueError(f"model.window_len={cfg.window_len}: an input of {t} tokens must be whole windows, "
                       "without perm_mask or target_mapping (windows are for fine-tuning)")
    embeddings = Embeddings(cfg, name="embeddings")
    dropout = Dropout(cfg.hidden_dropout)
    encoder = Encoder(cfg, output_hidden_states or cfg.mem_len > 0, name="encoder")
    segment = functools.partial(_segment, cfg, embeddings, encoder, dropout, head_mask=layer_head_mask(cfg, head_mask),
                                backward_rows=backward_rows, deterministic=deterministic)
    if windowed:
      h, g, hidden_states, next_mems = _windows(segment, cfg, input_ids, attention_mask, token_type_ids, mems)
      hidden_states = hidden_states if output_hidden_states else None
    else:
      h, g, inputs = segment(input_ids, attention_mask, token_type_ids, perm_mask, target_mapping, mems)
      hidden_states = jnp.concatenate([inputs, h[None]], axis=0) if output_hidden_states else None
      next_mems = next_memory(inputs, mems, cfg) if cfg.mem_len > 0 else None
    out = {"last_hidden_state": h, "query_hidden_state": g, "hidden_states": hidden_states, "mems": next_mems}
    if cfg.mlm_head:
      top = h if g is None else g
      out["mlm_logits"] = LMHead(cfg, name="mlm_head")(dropout(top, deterministic=deterministic), embeddings)
    return XLNetOutput(**{k: v for k, v in out.items() if v is not None})


def _segment(cfg: XLNetConfig, embeddings: Embeddings, encoder: Encoder, dropout: Dropout, input_ids: Array,
             attention_mask: Optional[Array], token_type_ids: Optional[Array], perm_mask: Optional[Array],
             target_mapping: Optional[Array], mems: Optional[Array], mems_mask: Optional[Array] = None, *,
             head_mask: Optional[Array], backward_rows: Optional[Array], deterministic: bool):
  """One segment through the model's embeddings and encoder: (h [B, T, H], g [B, P, H] or None, each layer's
  input [L, B, T, H] or None); mems_mask [B, M]: 0 hides a memory slot (None: all visible)."""
  b, t = input_ids.shape
  m = 0 if mems is None else mems.shape[2]
  h = dropout(embeddings(input_ids), deterministic=deterministic)
  g = None
  if target_mapping is not None:
    g = dropout(embeddings.queries(b, target_mapping.shape[1]), deterministic=deterministic)
  two_ways = cfg.bi_data and (b > 1 or backward_rows is not None)
  pos = dropout(jnp.asarray(relative_positions(t, m + t, cfg.hidden_size, cfg.clamp_len, two_ways)),
                deterministic=deterministic)
  if two_ways:
    backward = (jnp.arange(b) >= b // 2) if backward_rows is None else backward_rows
    pos = (pos, jnp.asarray(backward).astype(jnp.int32))
  else:
    pos = (pos, None)
  mask_h, mask_g = _masks(attention_mask, perm_mask, t, m, mems_mask)
  (h, g), inputs = encoder(h, g, None if mems is None else jax.lax.stop_gradient(mems), head_mask, pos,
                           _other_segment(token_type_ids, m), mask_h, mask_g, target_mapping, deterministic)
  return h, g, inputs


def _windows(segment, cfg: XLNetConfig, input_ids: Array, attention_mask: Optional[Array],
             token_type_ids: Optional[Array], mems: Optional[Array]):
  """The input as consecutive windows of cfg.window_len, in order, each attending to the memory of the ones
  before (the last mem_len states per layer, padding masked; `mems` [L, B, M, H], all visible, before the first
  window, else mem_len masked zeros) -> (h [B, T, H], None, hidden states [L + 1, B, T, H], next memory)."""
  b, t = input_ids.shape
  w = cfg.window_len
  if attention_mask is None:
    attention_mask = jnp.ones((b, t), jnp.int32)
  if mems is None:
    mems = jnp.zeros((cfg.num_layers, b, cfg.mem_len, cfg.hidden_size), cfg.compute_dtype)
    seen = jnp.zeros((b, cfg.mem_len), jnp.float32)
  else:
    seen = jnp.ones(mems.shape[1:3], jnp.float32)
  hs, states = [], []
  for start in range(0, t, w):
    part = lambda x, start=start: None if x is None else x[:, start:start + w]  # noqa: E731
    mask = part(attention_mask)
    h, _, inputs = segment(part(input_ids), mask, part(token_type_ids), None, None, mems, seen)
    hs.append(h)
    states.append(jnp.concatenate([inputs, h[None]], axis=0))
    mems = jax.lax.stop_gradient(jnp.concatenate([mems.astype(inputs.dtype), inputs], axis=2)[:, :, -cfg.mem_len:])
    seen = jnp.concatenate([seen, mask.astype(jnp.float32)], axis=1)[:, -cfg.mem_len:]
  return jnp.concatenate(hs, axis=1), None, jnp.concatenate(states, axis=2), mems


def next_memory(inputs: Array, mems: Optional[Array], cfg: XLNetConfig) -> Array:
  """The last mem_len states of [memory, this segment's first reuse_len (or all) layer inputs], [L, B, mem_len, H],
  without gradient."""
  current = inputs[:, :, :cfg.reuse_len] if cfg.reuse_len else inputs
  both = current if mems is None else jnp.concatenate([mems.astype(current.dtype), current], axis=2)
  return jax.lax.stop_gradient(both[:, :, -cfg.mem_len:])


class LastTokenSummary(nn.Module):
  """XLNet's sequence summary for sequence-level fine-tuning heads (Hugging Face's XLNetSequenceSummary,
  summary_type="last"): tanh(dense(the last real token's vector)), [B, H]. XLNet pads on the left, so
  the last real token is the last position there; a right-padded batch gives the same token."""
  config: XLNetConfig

  @nn.compact
  def __call__(self, out: ModelOutput, attention_mask: Array, deterministic: bool) -> Array:
    del deterministic  # the head's dropout follows (Hugging Face's summary_last_dropout)
    length = attention_mask.shape[1]
    last = length - 1 - jnp.argmax(attention_mask[:, ::-1] > 0, axis=1)
    h = jnp.take_along_axis(out.last_hidden_state, last[:, None, None], axis=1)[:, 0]
    return jnp.tanh(dense(self.config, self.config.hidden_size, ("embed", "mlp"), "dense")(h))
