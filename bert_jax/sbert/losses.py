"""The bi-encoder's training losses on embeddings, one value per row, as sentence-transformers computes
them (pure functions of the embeddings; u, v, anchors [B, D]):

  softmax   SoftmaxLoss (SBERT's NLI objective): a linear classifier on the features (u, v, |u - v|),
            cross-entropy of its logits against the pair's label
  cosine    CosineSimilarityLoss (STS): (cos(u, v) - score)^2, the score in [0, 1] (or [-1, 1])
  ranking   MultipleNegativesRankingLoss: row i's anchor against every candidate (all positives, then
            any hard negatives), scores scale * cos; cross-entropy with candidate i as the answer, so
            every other row's positive is an in-batch negative
  ranking_rows  the same, and its variants (sentence-transformers' `directions` and `partition_mode`: the
            symmetric loss, GTE's), for some rows of a batch against the whole batch: what one chunk or one
            device's rows contribute, so GradCache (sbert/gradcache.py) and the mesh take it piecewise
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from bert_jax.models.pooling import l2_normalize

Array = jax.Array
DIRECTIONS = ("query_to_doc", "query_to_query", "doc_to_query", "doc_to_doc")
PARTITION_MODES = ("joint", "per_direction")


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


def ranking_rows(rows: Array, batch: Array, first: Array | int, scale: float = 20.0,
                 directions: tuple[str, ...] = ("query_to_doc",), partition_mode: str = "joint") -> Array:
  """rows [R, K, D], rows first .. first + R of batch [B, K, D] (column 0 the query, 1 its positive, then
  hard negatives) -> [R]: each row's -(scale cos(q_i, d_i) - log Z_i), sentence-transformers'
  MultipleNegativesRankingLoss.compute_loss_from_embeddings per row. Z over the chosen directions' scores:
  query_to_doc q_i against every document of the batch (positives, then hard negatives), query_to_query
  against every other query, doc_to_query d_i against every query, doc_to_doc d_i against every document
  but its own row's; "joint" one softmax over them all, "per_direction" the mean of each one's log Z."""
  rows, batch = l2_normalize(rows.astype(jnp.float32)), l2_normalize(batch.astype(jnp.float32))
  size, own = batch.shape[0], first + jnp.arange(rows.shape[0])
  docs = jnp.swapaxes(batch[:, 1:], 0, 1).reshape(-1, batch.shape[-1])  # [(K - 1) B, D]
  queries, local_docs = rows[:, 0], rows[:, 1]
  mine = own[:, None] == jnp.arange(size)[None, :]  # [R, B]: the row's own column
  scores = {"query_to_doc": queries @ docs.T}
  if "query_to_query" in directions:
    scores["query_to_query"] = jnp.where(mine, -jnp.inf, queries @ batch[:, 0].T)
  if "doc_to_query" in directions:
    scores["doc_to_query"] = local_docs @ batch[:, 0].T
  if "doc_to_doc" in directions:
    scores["doc_to_doc"] = jnp.where(jnp.tile(mine, (1, docs.shape[0] // size)), -jnp.inf, local_docs @ docs.T)
  scores = {k: scale * v for k, v in scores.items()}
  positive = jnp.take_along_axis(scores["query_to_doc"], own[:, None], axis=1)[:, 0]
  if partition_mode == "joint":
    log_z = jax.nn.logsumexp(jnp.concatenate(list(scores.values()), axis=1), axis=1)
  else:
    log_z = sum(jax.nn.logsumexp(v, axis=1) for v in scores.values()) / len(scores)
  return log_z - positive
