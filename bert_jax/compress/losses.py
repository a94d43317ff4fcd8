"""Knowledge-distillation losses as sums over rows (divided by the row count in the objective).

  soft       T^2 KL(softmax(t / T) || softmax(s / T))            (Hinton et al.; DistilBERT)
  hidden     mean over valid tokens and width of (W h_s - h_t)^2, per mapped layer (TinyBERT)
  attention  mean over heads, valid queries and keys of (a_s - a_t)^2, per mapped layer (TinyBERT,
             on the attention probabilities that the model returns)
  pkd        || W c_s / ||W c_s|| - c_t / ||c_t|| ||^2 of each mapped layer's [CLS] vector (BERT-PKD)
Shapes: logits [B, C]; hidden [L, B, T, H]; attentions [L, B, N, T, T]; mask [B, T] (1 = token).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def soft_target_sum(student_logits: Array, teacher_logits: Array, temperature: float) -> Array:
  t = jax.nn.log_softmax(teacher_logits / temperature, axis=-1)
  s = jax.nn.log_softmax(student_logits / temperature, axis=-1)
  return temperature ** 2 * jnp.sum(jnp.exp(t) * (t - s))


def hidden_mse_sum(student: Array, teacher: Array, mask: Array) -> Array:
  """student already projected to the teacher's width; summed over layers and rows."""
  mask = mask.astype(jnp.float32)
  per_token = jnp.mean(jnp.square(student.astype(jnp.float32) - teacher.astype(jnp.float32)), axis=-1)
  per_row = jnp.sum(per_token * mask, axis=-1) / jnp.maximum(jnp.sum(mask, axis=-1), 1.0)
  return jnp.sum(per_row)


def attention_mse_sum(student: Array, teacher: Array, mask: Array) -> Array:
  mask = mask.astype(jnp.float32)
  per_query = jnp.mean(jnp.sum(jnp.square(student - teacher), axis=-1), axis=2)  # [L, B, T]
  per_row = jnp.sum(per_query * mask, axis=-1) / jnp.maximum(jnp.sum(mask, axis=-1), 1.0)
  return jnp.sum(per_row) / student.shape[-1]


def pkd_sum(student_cls: Array, teacher_cls: Array) -> Array:
  """[L, B, H] each; the student's already projected to the teacher's width."""
  def unit(x):
    x = x.astype(jnp.float32)
    return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-12)
  return jnp.sum(jnp.square(unit(student_cls) - unit(teacher_cls)))
