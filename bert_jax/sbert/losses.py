"""The bi-encoder's training losses on embeddings, one value per row, as sentence-transformers computes
them (pure functions of the embeddings; u, v, anchors [B, D]):

  softmax   SoftmaxLoss (SBERT's NLI objective): a linear classifier on the features (u, v, |u - v|),
            cross-entropy of its logits against the pair's label
  cosine    CosineSimilarityLoss (STS): (cos(u, v) - score)^2, the score in [0, 1] (or [-1, 1])
  ranking   MultipleNegativesRankingLoss: row i's anchor against every candidate (all positives, then
            any hard negatives), scores scale * cos; cross-entropy with candidate i as the answer, so
            every other row's positive is an in-batch negative
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from bert_jax.models.pooling import l2_normalize

Array = jax.Array


def cosine(u: Array, v: Array, eps: float = 1e-8) -> Array:
  """Row-wise cosine of u, v [B, D] -> [B]: u.v / max(|u| |v|, eps) (torch's cosine_similarity)."""
  u, v = u.astype(jnp.float32), v.astype(jnp.float32)
  norms = jnp.linalg.norm(u, axis=-1) * jnp.linalg.norm(v, axis=-1)
  return jnp.sum(u * v, axis=-1) / jnp.maximum(norms, eps)


def pair_features(u: Array, v: Array) -> Array:
  """u, v [B, D] -> (u, v, |u - v|) concatenated, [B, 3D]: what SBERT's NLI classifier reads."""
  return jnp.concatenate([u, v, jnp.abs(u - v)], axis=-1)


def softmax(u: Array, v: Array, kernel: Array, bias: Array, labels: Array) -> Array:
  """u, v [B, D], the classifier's kernel [3D, C] and bias [C], labels int[B] -> [B]."""
  logits = pair_features(u, v).astype(jnp.float32) @ kernel.astype(jnp.float32) + bias
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels)


def cosine_regression(u: Array, v: Array, scores: Array) -> Array:
  """u, v [B, D], scores [B] -> [B]."""
  return jnp.square(cosine(u, v) - scores)


def ranking(anchors: Array, candidates: Array, scale: float = 20.0) -> Array:
  """anchors [B, D], candidates [M >= B, D] (row i's positive at i) -> [B]; scale 20 is
  sentence-transformers' default."""
  scores = scale * l2_normalize(anchors.astype(jnp.float32)) @ l2_normalize(candidates.astype(jnp.float32)).T
  return optax.softmax_cross_entropy_with_integer_labels(scores, jnp.arange(anchors.shape[0]))
