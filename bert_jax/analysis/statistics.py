"""Per-head attention statistics (Clark et al. 2019, "What does BERT look at?").

For each head, averaged over every (non-padding) query token of every input:
  cls, sep       attention mass on the [CLS] token, on the [SEP] tokens (summed over them)
  punctuation    mass on tokens made only of punctuation ("." "," "##-" ...)
  previous, next, self   A[i, i-1], A[i, i+1], A[i, i] (previous: queries i >= 1; next: i + 1 not padding)
  entropy        -sum_j A[i, j] log A[i, j] (nats)
Sums and counts are additive over batches (`head_sums`), so any number of batches gives the exact mean.
"""
from __future__ import annotations

import unicodedata

import jax
import jax.numpy as jnp
import numpy as np

STATISTICS = ("cls", "sep", "punctuation", "previous", "next", "self", "entropy")
_WORD_MARKS = ("##", "\u0120", "\u2581")  # WordPiece continuation, byte-level BPE space, SentencePiece space


def punctuation_table(tokenizer) -> np.ndarray:
  """bool[vocab]: tokens that are punctuation only, after the word-piece marks are stripped."""
  specials = {i for i in tokenizer.special_ids.values() if i is not None}
  table = np.zeros(tokenizer.vocab_size, bool)
  for i in range(tokenizer.vocab_size):
    token = tokenizer.id_to_token(i)
    for mark in _WORD_MARKS:
      token = token[len(mark):] if token.startswith(mark) else token
    table[i] = (i not in specials and bool(token)
                and all(unicodedata.category(c).startswith("P") for c in token))
  return table


@jax.jit
def head_sums(attentions: jax.Array, input_ids: jax.Array, attention_mask: jax.Array,
              example_weight: jax.Array, cls: jax.Array, sep: jax.Array, punctuation: jax.Array
              ) -> dict[str, tuple[jax.Array, jax.Array]]:
  """{statistic: (sum [L, N], count)} over one batch.

  attentions: float32[L, B, N, T, T]; input_ids, attention_mask: int32[B, T]; example_weight: [B];
  cls, sep: bool[B, T]; punctuation: bool[vocab].
  """
  keys = attention_mask.astype(jnp.float32)
  queries = keys * example_weight[:, None]

  def mean_over_queries(per_query: jax.Array, weights: jax.Array) -> tuple[jax.Array, jax.Array]:
    return jnp.einsum("lbnt,bt->ln", per_query, weights), jnp.sum(weights)

  def mass_on(columns: jax.Array) -> jax.Array:
    return jnp.einsum("lbnts,bs->lbnt", attentions, columns.astype(jnp.float32))

  plogp = jnp.where(attentions > 0, attentions * jnp.log(jnp.where(attentions > 0, attentions, 1.0)), 0.0)
  return {
      "cls": mean_over_queries(mass_on(cls), queries),
      "sep": mean_over_queries(mass_on(sep), queries),
      "punctuation": mean_over_queries(mass_on(punctuation[input_ids]), queries),
      "previous": mean_over_queries(jnp.diagonal(attentions, -1, -2, -1), queries[:, 1:]),
      "next": mean_over_queries(jnp.diagonal(attentions, 1, -2, -1), queries[:, :-1] * keys[:, 1:]),
      "self": mean_over_queries(jnp.diagonal(attentions, 0, -2, -1), queries),
      "entropy": mean_over_queries(-jnp.sum(plogp, axis=-1), queries),
  }


def means(totals: dict[str, tuple[np.ndarray, float]]) -> dict[str, np.ndarray]:
  """{statistic: [L, N] mean} from summed (sum, count) pairs."""
  return {k: np.asarray(s) / max(float(c), 1e-12) for k, (s, c) in totals.items()}


def add(totals: dict | None, batch: dict) -> dict:
  batch = jax.device_get(batch)
  if totals is None:
    return batch
  return {k: (totals[k][0] + s, totals[k][1] + c) for k, (s, c) in batch.items()}
