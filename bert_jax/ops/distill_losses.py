"""Knowledge-distillation losses as sums over rows (divided by the row count in the objective).

  soft       T^2 KL(softmax(t / T) || softmax(s / T))            (Hinton et al.; DistilBERT), per row or,
             with weights, per weighted masked-LM prediction (general distillation)
  logit_mse  ||s - t||^2 of the logits, per row (Tang et al. 2019's BiLSTM students)
  cosine     1 - cos(h_s, h_t) of the last hidden states, per valid token (DistilBERT)
  hidden     mean over valid tokens and width of (W h_s - h_t)^2, per mapped layer (TinyBERT)
  attention  mean over heads, valid queries and keys of (a_s - a_t)^2, per mapped layer (TinyBERT,
             on the attention probabilities that the model returns)
  pkd        || W c_s / ||W c_s|| - c_t / ||c_t|| ||^2 of each mapped layer's [CLS] vector (BERT-PKD)
  feature    mean over width of (h_s - h_t)^2, per valid token and layer (MobileBERT's feature-map transfer)
  attention_kl  mean over heads of KL(a_t || a_s) over the keys, per valid query and layer (MobileBERT's
             attention transfer)
Shapes: logits [B, C] (or [B, P, V] with weights [B, P]); hidden [L, B, T, H]; attentions
[L, B, N, T, T]; mask [B, T] (1 = token).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def logit_mse_sum(student_logits: Array, teacher_logits: Array) -> Array:
  """The squared distance between the logits, summed over classes and rows."""
  return jnp.sum(jnp.square(student_logits.astype(jnp.float32) - teacher_logits.astype(jnp.float32)))


def soft_target_sum(student_logits: Array, teacher_logits: Array, temperature: float,
                    weights: Array | None = None) -> Array:
  """The KL over the last (class or vocab) axis, summed over the others, each term times its weight."""
  t = jax.nn.log_softmax(teacher_logits.astype(jnp.float32) / temperature, axis=-1)
  s = jax.nn.log_softmax(student_logits.astype(jnp.float32) / temperature, axis=-1)
  kl = jnp.sum(jnp.exp(t) * (t - s), axis=-1)
  if weights is not None:
    kl = kl * weights.astype(jnp.float32)
  return temperature ** 2 * jnp.sum(kl)


def cosine_sum(student: Array, teacher: Array, mask: Array) -> Array:
  """[B, T, H] each (the same width), mask [B, T]: the sum over valid tokens of 1 - cos."""
  s, t = student.astype(jnp.float32), teacher.astype(jnp.float32)
  cos = jnp.sum(s * t, axis=-1) / jnp.maximum(jnp.linalg.norm(s, axis=-1) * jnp.linalg.norm(t, axis=-1), 1e-12)
  return jnp.sum((1.0 - cos) * mask.astype(jnp.float32))


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


def feature_map_sums(student: Array, teacher: Array, mask: Array) -> Array:
  """[L, B, T, H] each: per layer, the sum over valid tokens of the mean over H of (h_s - h_t)^2 -> [L]
  (MobileBERT's feature-map transfer, divided by the valid token count in the objective)."""
  per_token = jnp.mean(jnp.square(student.astype(jnp.float32) - teacher.astype(jnp.float32)), axis=-1)
  return jnp.sum(per_token * mask.astype(jnp.float32), axis=(1, 2))


def attention_kl_sums(student: Array, teacher: Array, mask: Array) -> Array:
  """[L, B, N, T, T] attention probabilities each: per layer, the sum over valid queries of the mean over
  heads of KL(teacher row || student row) -> [L] (MobileBERT's attention transfer). Keys the teacher gives
  no weight (padding) add nothing, and no NaN reaches the gradient through them."""
  t, s = teacher.astype(jnp.float32), student.astype(jnp.float32)
  some = t > 0
  t_safe, s_safe = jnp.where(some, t, 1.0), jnp.where(some, s, 1.0)
  kl = jnp.sum(jnp.where(some, t * (jnp.log(t_safe) - jnp.log(jnp.maximum(s_safe, 1e-30))), 0.0), axis=-1)
  return jnp.sum(jnp.mean(kl, axis=2) * mask.astype(jnp.float32), axis=(1, 2))
