"""The bi-encoder's training losses on embeddings, one value per row (the objective sums them), as
sentence-transformers computes them:

  softmax   SoftmaxLoss (SBERT's NLI objective): cross-entropy of the classifier's logits on
            (u, v, |u - v|) against the pair's label
  cosine    CosineSimilarityLoss (STS): (cos(u, v) - score)^2, the score in [0, 1] (or [-1, 1])
  ranking   MultipleNegativesRankingLoss: row i's anchor against every candidate in the batch (all
            positives, then any hard negatives), scores scale * cos; cross-entropy with candidate i as
            the answer. Every other row's positive is an in-batch negative; on a mesh the candidates
            are the *global* batch's (objective.py gathers them over the data axis first).
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


def softmax(logits: Array, labels: Array) -> Array:
  """logits [B, C], labels int[B] -> [B]."""
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels)


def cosine_regression(u: Array, v: Array, scores: Array) -> Array:
  """u, v [B, D], scores [B] -> [B]."""
  return jnp.square(cosine(u, v) - scores)


def ranking(anchors: Array, candidates: Array, scale: float) -> Array:
  """anchors [B, D], candidates [M >= B, D] (row i's positive at i) -> [B]."""
  scores = scale * l2_normalize(anchors.astype(jnp.float32)) @ l2_normalize(candidates.astype(jnp.float32)).T
  return optax.softmax_cross_entropy_with_integer_labels(scores, jnp.arange(anchors.shape[0]))
