"""Self-attention pattern classes (Kovaleva et al. 2019, "Revealing the dark secrets of BERT").

Kovaleva et al. sorted attention maps into five classes with a classifier trained on hand labels;
here the class follows from three numbers of each map A (one input, one head; non-padding queries),
three disjoint shares of the mass:
  s  vertical mass:  mean over queries of the mass on the [CLS] and [SEP] tokens (the vertical stripes)
  d  diagonal mass:  mean over queries of the mass on the previous, same and next token, [CLS]/[SEP] left out
  b  block mass:     mean over queries of the mass inside the query's own segment, [CLS]/[SEP] and the
                     previous/same/next tokens left out; inputs with two segments only (0 otherwise)
and the rule (RULE, checked in this order):
  vertical           s >= 0.6
  diagonal           d >= 0.6
  vertical+diagonal  s >= 0.2 and d >= 0.2 and s + d >= 0.6
  block              b >= 0.5
  heterogeneous      anything else
Each head gets the share of inputs in each class and its majority class.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

CLASSES = ("vertical", "diagonal", "vertical+diagonal", "block", "heterogeneous")
RULE = ("s = mean mass on [CLS]/[SEP]; d = mean mass on the previous/same/next token without [CLS]/[SEP]; "
        "b = mean mass inside the query's own segment without [CLS]/[SEP] and that band (two-segment inputs, "
        "else 0). vertical if s >= 0.6; else diagonal if d >= 0.6; else vertical+diagonal if s >= 0.2 and "
        "d >= 0.2 and s + d >= 0.6; else block if b >= 0.5; else heterogeneous")


@jax.jit
def pattern_features(attentions: jax.Array, attention_mask: jax.Array, token_type_ids: jax.Array,
                     special: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(s, d, b), each float32[B, L, N], for attentions float32[L, B, N, T, T].

  attention_mask, token_type_ids: int32[B, T]; special: bool[B, T] ([CLS] or [SEP]).
  """
  t = attentions.shape[-1]
  valid = attention_mask.astype(jnp.float32)
  count = jnp.maximum(jnp.sum(valid, axis=1), 1.0)
  offset = jnp.arange(t)[None, :] - jnp.arange(t)[:, None]
  band = (jnp.abs(offset) <= 1).astype(jnp.float32)
  same = token_type_ids[:, :, None] == token_type_ids[:, None, :]
  two_segments = jnp.any((token_type_ids > 0) & (attention_mask > 0), axis=1)
  inside = same & ~special[:, None, :] & (band[None] == 0) & two_segments[:, None, None]

  def mean_mass(keys: jax.Array) -> jax.Array:  # keys: [B, T, T] (query, key) or [B, T] key weights
    per_query = (jnp.einsum("lbnts,bts->lbnt", attentions, keys) if keys.ndim == 3
                 else jnp.einsum("lbnts,bs->lbnt", attentions, keys))
    return jnp.transpose(jnp.einsum("lbnt,bt->lbn", per_query, valid) / count[None, :, None], (1, 0, 2))

  s = mean_mass(special.astype(jnp.float32))
  d = mean_mass(band[None] * ~special[:, None, :])
  b = mean_mass(inside.astype(jnp.float32))
  return s, d, b


def classify(s: np.ndarray, d: np.ndarray, b: np.ndarray) -> np.ndarray:
  """Index into CLASSES for each map, by RULE."""
  s, d, b = np.asarray(s), np.asarray(d), np.asarray(b)
  conditions = [s >= 0.6, d >= 0.6, (s >= 0.2) & (d >= 0.2) & (s + d >= 0.6), b >= 0.5]
  names = [CLASSES.index(c) for c in ("vertical", "diagonal", "vertical+diagonal", "block")]
  return np.select(conditions, names, default=CLASSES.index("heterogeneous"))


def class_counts(classes: np.ndarray, weights: np.ndarray) -> np.ndarray:
  """[len(CLASSES), L, N] weighted counts of each class, from classes int[B, L, N] and weights [B]."""
  return np.stack([np.einsum("bln,b->ln", (classes == k).astype(float), weights) for k in range(len(CLASSES))])
