"""A small STS-format set that bert_jax builds from the embedded corpus (the standard library's
docstrings, finetune/embedded.py's sentences: offline, on every install), written for this project: the
data of configs/sbert.py:tiny and of the bi-encoder tests, and of any preset given no data files.

Each pair is a corpus sentence and an edited copy of it, scored 0..5 by the share of the sentence's
content words (those not in FUNCTION_WORDS) that the copy keeps; the others are replaced by content
words of other sentences of the same split. Independently of the score, the copy loses some of its
function words and gains others at random places: edits that leave its content alone. Mean pooling of
an untrained encoder weighs every token alike, so these edits move its cosine as much as the content
does; a trained bi-encoder learns to look past them. Dev pairs come from the first sentences of the
corpus, training pairs from the ones after them, so no sentence is in both.

The other losses read the same pairs: ranking takes the pairs scored >= 4 as (anchor, positive), softmax
labels a pair by its score (>= 4: entailment, <= 1: contradiction, else neutral), an offline stand-in
for NLI data.
"""
from __future__ import annotations

import random

import numpy as np

from bert_jax.finetune import embedded as embedded_task
from bert_jax.sbert.data import Pairs

FUNCTION_WORDS = ("the", "a", "an", "of", "to", "in", "is", "and", "that", "it", "for", "as", "with", "be",
                  "this", "on", "are", "by", "or", "if", "was", "at", "from", "which")
NLI_LABELS = ("contradiction", "entailment", "neutral")
_MIN_CONTENT = 3


def _content(word: str) -> bool:
  return word.lower() not in FUNCTION_WORDS


def edit(sentence: str, donors: list[str], rng: random.Random) -> tuple[str, float]:
  """(the edited copy, its score 0..5)."""
  words, end = sentence[:-1].split(), sentence[-1]
  content = [i for i, w in enumerate(words) if _content(w)]
  replaced = set(rng.sample(content, rng.randint(0, len(content))))
  own = {w.lower() for w in words}
  out = []
  for i, word in enumerate(words):
    if i in replaced:
      out.append(next(d for d in iter(lambda: rng.choice(donors), None) if d.lower() not in own))
    elif _content(word) or rng.random() > 0.3:
      out.append(word)
  for _ in range(rng.randint(0, len(words) // 3)):
    out.insert(rng.randint(0, len(out)), rng.choice(FUNCTION_WORDS))
  return " ".join(out) + end, 5.0 * (1.0 - len(replaced) / len(content))


def scored_pairs(sentences: list[str], seed: int) -> Pairs:
  """One scored pair per sentence with at least three content words."""
  sentences = [s for s in sentences if sum(_content(w) for w in s[:-1].split()) >= _MIN_CONTENT]
  donors = sorted({w for s in sentences for w in s[:-1].split() if _content(w)})
  rng = random.Random(seed)
  edited = [edit(s, donors, rng) for s in sentences]
  return Pairs([sentences, [e for e, _ in edited]], np.asarray([score for _, score in edited], np.float32))


def splits(num_train: int, num_dev: int) -> tuple[Pairs, Pairs]:
  """(train, dev) scored pairs (scores 0..5), from num_dev + num_train corpus sentences."""
  sentences = embedded_task.corpus_sentences(num_dev + num_train)
  return scored_pairs(sentences[num_dev:], seed=2), scored_pairs(sentences[:num_dev], seed=1)


def as_ranking(pairs: Pairs) -> Pairs:
  """The pairs scored >= 4 as (anchor, positive)."""
  keep = np.flatnonzero(pairs.target >= 4.0)
  return Pairs([[column[i] for i in keep] for column in pairs.columns], np.zeros(0, np.float32))


def as_nli(pairs: Pairs) -> Pairs:
  """Labels (indices into NLI_LABELS) by score: >= 4 entailment, <= 1 contradiction, else neutral."""
  labels = np.where(pairs.target >= 4.0, 1, np.where(pairs.target <= 1.0, 0, 2)).astype(np.int32)
  return Pairs(pairs.columns, labels)
