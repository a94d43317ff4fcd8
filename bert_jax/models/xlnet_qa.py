"""XLNet's SQuAD v2 span head with beam search (Yang et al. 2019's run_squad.py; Hugging Face's
XLNetForQuestionAnswering: PoolerStartLogits, PoolerEndLogits, PoolerAnswerClass). Head kind `xlnet_beam`
(models/head_kinds.py), `task.head=xlnet_beam` in configs/squad.py.

  start: dense(h_t) -> start logits [B, T]
  end, given a start s: dense_1(LayerNorm(tanh(dense_0([h_t; h_s])))) -> end logits [B, T]
  answer class: dense_1(tanh(dense_0([start state; h_cls]))) (no bias) -> one logit [B], "no answer"
The padding (attention_mask 0: Hugging Face's p_mask) is masked out of the start and end logits. <cls> is
the last real token (XLNet's layout: a <sep> b <sep> <cls>, left padding; Hugging Face's cls_index).

Training (`start_positions` given): the end logits conditioned on the gold start, and the answer class
read at the gold start's state (the loss: head_kinds' xlnet_beam). Inference: the start_n_top starts of
highest probability; for each, the end logits conditioned on it and their end_n_top best ends; the answer
class from the start states weighted by the start probabilities. The outputs are Hugging Face's:
start_top_log_probs [B, k1] and end_top_log_probs [B, k2 * k1] hold probabilities (softmax, as
transformers' despite the name; the original code's are log-softmax), the ends laid out end rank major
(index j * k1 + i: the j-th best end of the i-th start), start_top_index and end_top_index positions.
"""
from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.errors import UserError
from bert_jax.models import bert
from bert_jax.models.xlnet import layer_norm

Array = jax.Array
_MASKED = -1e30  # Hugging Face's p_mask fill in float32


def _dense(config: Any, features: int, axes: tuple[str, str], name: str, use_bias: bool = True) -> nn.Dense:
  return nn.Dense(features, use_bias=use_bias, dtype=config.compute_dtype, param_dtype=config.weight_dtype,
                  name=name, kernel_init=bert.kernel_init(config, axes), bias_init=bert.zeros_init(axes[-1:]))


class EndLogits(nn.Module):
  """[..., T, H] hidden states and the start states beside them (same shape) -> end logits [..., T]."""
  config: Any

  @nn.compact
  def __call__(self, hidden: Array, start_states: Array) -> Array:
    x = _dense(self.config, self.config.hidden_size, ("embed", "mlp"), "dense_0")(
        jnp.concatenate([hidden, start_states], axis=-1))
    x = layer_norm(self.config, "layer_norm")(jnp.tanh(x))
    return _dense(self.config, 1, ("mlp", "classes"), "dense_1")(x)[..., 0].astype(jnp.float32)


class AnswerClass(nn.Module):
  """The start state [B, H] and the <cls> state [B, H] -> the "no answer" logit [B]."""
  config: Any

  @nn.compact
  def __call__(self, start_states: Array, cls_states: Array) -> Array:
    x = jnp.tanh(_dense(self.config, self.config.hidden_size, ("embed", "mlp"), "dense_0")(
        jnp.concatenate([start_states, cls_states], axis=-1)))
    return _dense(self.config, 1, ("mlp", "classes"), "dense_1", use_bias=False)(x)[..., 0].astype(jnp.float32)


def _gather(hidden: Array, positions: Array) -> Array:
  """hidden [B, T, H] at positions [B, K] -> [B, K, H]."""
  return jnp.take_along_axis(hidden, positions[..., None], axis=1)


class BeamSpanHead(nn.Module):
  """The head module (HeadKind's fields: config, num_labels, pooling, dropout). Called as
  (out, attention_mask, deterministic, start_positions=None): with int32[B] start_positions, the training
  outputs {start_logits [B, T], end_logits [B, T], cls_logits [B]}; without, the beam outputs (module doc).
  Hugging Face's head has no dropout, so `dropout` is not used."""
  config: Any
  num_labels: int = 2
  pooling: str = "pooled"
  dropout: float = 0.1

  @nn.compact
  def __call__(self, out: bert.ModelOutput, attention_mask: Array, deterministic: bool,
               start_positions: Array | None = None) -> dict[str, Array]:
    del deterministic
    if self.pooling != "pooled":
      raise UserError(f"head.pooling={self.pooling!r}: task.head=xlnet_beam reads the last layer only")
    cfg = self.config
    hidden = out.last_hidden_state
    valid = attention_mask > 0
    length = attention_mask.shape[1]
    cls_index = length - 1 - jnp.argmax(valid[:, ::-1], axis=1)  # the last real token: <cls>
    cls_states = _gather(hidden, cls_index[:, None])[:, 0]
    start_logits = _dense(cfg, 1, ("embed", "classes"), "start_logits")(hidden)[..., 0].astype(jnp.float32)
    start_logits = jnp.where(valid, start_logits, _MASKED)
    end_head, answer_class = EndLogits(cfg, name="end_logits"), AnswerClass(cfg, name="answer_class")
    if start_positions is not None:
      start_states = _gather(hidden, start_positions[:, None])  # [B, 1, H]
      end_logits = end_head(hidden, jnp.broadcast_to(start_states, hidden.shape))
      return {"start_logits": start_logits, "end_logits": jnp.where(valid, end_logits, _MASKED),
              "cls_logits": answer_class(start_states[:, 0], cls_states)}
    start_probs = jax.nn.softmax(start_logits, axis=-1)
    start_top, start_index = jax.lax.top_k(start_probs, cfg.start_n_top)  # [B, k1]
    states = _gather(hidden, start_index)  # [B, k1, H]
    beams = hidden.shape[:2] + (cfg.start_n_top, hidden.shape[-1])  # [B, T, k1, H]
    end_logits = end_head(jnp.broadcast_to(hidden[:, :, None], beams), jnp.broadcast_to(states[:, None], beams))
    end_probs = jax.nn.softmax(jnp.where(valid[..., None], end_logits, _MASKED), axis=1)  # [B, T, k1]
    end_top, end_index = jax.lax.top_k(jnp.swapaxes(end_probs, 1, 2), cfg.end_n_top)  # [B, k1, k2]
    rows = hidden.shape[0]
    weighted = jnp.einsum("bth,bt->bh", hidden.astype(jnp.float32), start_probs).astype(hidden.dtype)
    return {"start_top_log_probs": start_top, "start_top_index": start_index,
            "end_top_log_probs": jnp.swapaxes(end_top, 1, 2).reshape(rows, -1),
            "end_top_index": jnp.swapaxes(end_index, 1, 2).reshape(rows, -1),
            "cls_logits": answer_class(weighted, cls_states)}
