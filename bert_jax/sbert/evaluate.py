"""How good sentence embeddings are, and semantic search with them. `embed` is anything that maps a list
of sentences to float[N, D] (an `Embedder`, or the training run's current parameters).

  sts        Spearman (and Pearson) correlation of cos(u, v) with the gold scores of sentence pairs,
             the STS benchmarks' measure (Spearman as finetune/metrics.py computes it: Pearson of
             average ranks, scipy's definition)
  retrieval  query i's answer is corpus line i (more corpus lines are distractors): recall@k, the share
             of queries whose answer ranks in the top k by cosine, and MRR@10, the mean of 1 / its rank
             (0 beyond rank 10), as sentence-transformers' InformationRetrievalEvaluator reports them.
             Ties rank the earlier corpus line first.
  search     the top-k corpus lines by cosine for each query (one query string: its top-k)
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from bert_jax.errors import UserError
from bert_jax.finetune import metrics
from bert_jax.sbert.data import Pairs

Embed = Callable[[Sequence[str]], np.ndarray]
MRR_AT = 10


def _unit(x: np.ndarray) -> np.ndarray:
  x = np.asarray(x, np.float64)
  return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def cosine_scores(queries: np.ndarray, corpus: np.ndarray) -> np.ndarray:
  """[Q, D], [C, D] -> cosines [Q, C]."""
  return _unit(queries) @ _unit(corpus).T


def check_sts_pairs(pairs: Pairs, source: str) -> Pairs:
  """UserError unless the pairs can be scored: at least two, and scores that are not all equal (Spearman
  and Pearson are undefined otherwise, whatever the embeddings)."""
  if len(pairs) == 0:
    raise UserError(f"{source}: no sentence pairs to score; give sentence1<TAB>sentence2<TAB>score lines")
  if len(pairs) < 2 or np.ptp(pairs.target) == 0:
    raise UserError(f"{source}: {len(pairs)} pair{'s' * (len(pairs) != 1)}, all scored {pairs.target[0]:g}: "
                    "Spearman and Pearson need at least two different scores")
  return pairs


def sts(embed: Embed, pairs: Pairs) -> dict[str, float]:
  """{"spearman", "pearson", "pairs"} of cos(u, v) against the pairs' scores."""
  check_sts_pairs(pairs, "STS")
  u, v = embed(pairs.columns[0]), embed(pairs.columns[1])
  cosines = np.sum(_unit(u) * _unit(v), axis=-1)
  return {"spearman": metrics.spearman(pairs.target, cosines), "pearson": metrics.pearson(pairs.target, cosines),
          "pairs": len(pairs)}


def ranks(scores: np.ndarray) -> np.ndarray:
  """scores [Q, C >= Q] -> the 1-based rank of corpus line q for query q: 1 + the lines scoring higher,
  + the earlier lines scoring the same."""
  gold = scores[np.arange(len(scores)), np.arange(len(scores))][:, None]
  earlier = np.arange(scores.shape[1])[None] < np.arange(len(scores))[:, None]
  return 1 + np.sum(scores > gold, axis=1) + np.sum((scores == gold) & earlier, axis=1)


def retrieval(embed: Embed, queries: Sequence[str], corpus: Sequence[str], ks: Sequence[int] = (1, 5, 10)
              ) -> dict[str, float]:
  """{"recall@k" for each k, "mrr@10", "queries", "corpus"}."""
  check_retrieval(queries, corpus)
  found = ranks(cosine_scores(embed(queries), embed(corpus)))
  results = {f"recall@{k}": float(np.mean(found <= k)) for k in ks}
  results[f"mrr@{MRR_AT}"] = float(np.mean(np.where(found <= MRR_AT, 1.0 / found, 0.0)))
  return {**results, "queries": len(queries), "corpus": len(corpus)}


def check_retrieval(queries: Sequence[str], corpus: Sequence[str]) -> None:
  _list_of_lines(queries, "queries")
  _list_of_lines(corpus, "corpus")
  if len(corpus) < len(queries):
    raise UserError(f"{len(queries)} queries but {len(corpus)} corpus lines: corpus line i answers query i")


def check_top_k(top_k: int) -> None:
  if top_k < 1:
    raise UserError(f"--top-k {top_k} must be at least 1")


def search(embed: Embed, queries: Sequence[str], corpus: Sequence[str], top_k: int
           ) -> list[list[tuple[int, float]]]:
  """Per query: (corpus line index, cosine) of its top_k lines, best first (ties: earlier line first); for one
  query string, its list alone."""
  check_top_k(top_k)
  _list_of_lines(corpus, "corpus")
  if isinstance(queries, str):  # one query: its hits, as Embedder gives one string one vector
    return search(embed, [queries], corpus, top_k)[0]
  scores = cosine_scores(embed(queries), embed(corpus))
  order = np.argsort(-scores, axis=1, kind="stable")[:, :top_k]
  return [[(int(i), float(row[i])) for i in best] for row, best in zip(scores, order)]


def _list_of_lines(lines, name: str) -> None:
  """A string where a list of them belongs would be read a character at a time."""
  if isinstance(lines, str):
    raise UserError(f"{name}: expected a list of strings, got one string")


def parse_ks(text: str) -> tuple[int, ...]:
  try:
    ks = tuple(int(k) for k in text.split(","))
  except ValueError:
    ks = ()
  if not ks or min(ks) < 1:
    raise UserError(f"--k {text!r}: give positive cut-offs separated by commas, e.g. 1,5,10")
  return ks
