"""The official metrics of each task, written out so that they are checkable against references.

GLUE: Matthews correlation (CoLA), accuracy, binary F1 of the positive class (MRPC, QQP), Pearson and
Spearman correlation (STS-B; 0.0 where scipy gives nan, see `correlation_note`), and the dev loss
(cross-entropy or squared error, as in training). SQuAD: exact match and token F1 after the official
answer normalisation (lower case, no punctuation, no articles, single spaces), best over the gold
answers, in percent, each version as its official script scores it (`squad_scores`). NER:
entity-level micro F1 with seqeval's default (non-strict) chunking, which reads IOB1 and IOB2 alike.
"""
from __future__ import annotations

import collections
import re
import string

import numpy as np

from bert_jax.errors import UserError


def accuracy(labels, predictions) -> float:
  return float(np.mean(np.asarray(labels) == np.asarray(predictions)))


def binary_f1(labels, predictions) -> float:
  """F1 of class 1; 0 when there is neither a true nor a predicted positive."""
  labels, predictions = np.asarray(labels) == 1, np.asarray(predictions) == 1
  tp = np.sum(labels & predictions)
  denominator = np.sum(labels) + np.sum(predictions)
  return float(2 * tp / denominator) if denominator else 0.0


def matthews_corrcoef(labels, predictions) -> float:
  """Multi-class MCC from the confusion matrix (Gorodkin's R_K); 0 when undefined."""
  labels, predictions = np.asarray(labels), np.asarray(predictions)
  classes = np.union1d(labels, predictions)
  confusion = np.array([[np.sum((labels == a) & (predictions == b)) for b in classes] for a in classes],
                       dtype=np.float64)
  n, correct = confusion.sum(), np.trace(confusion)
  true_counts, predicted_counts = confusion.sum(axis=1), confusion.sum(axis=0)
  numerator = correct * n - true_counts @ predicted_counts
  denominator = np.sqrt((n * n - predicted_counts @ predicted_counts) * (n * n - true_counts @ true_counts))
  return float(numerator / denominator) if denominator else 0.0


def pearson(x, y) -> float:
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  x, y = x - x.mean(), y - y.mean()
  denominator = np.sqrt(np.sum(x * x) * np.sum(y * y))
  return float(np.sum(x * y) / denominator) if denominator else 0.0


def _average_ranks(x) -> np.ndarray:
  """Ranks 1..n with ties sharing the mean of their ranks (as Spearman's rho needs)."""
  x = np.asarray(x)
  order = np.argsort(x, kind="stable")
  sorted_x = x[order]
  starts = np.flatnonzero(np.r_[True, sorted_x[1:] != sorted_x[:-1]])
  ends = np.r_[starts[1:], len(x)]
  ranks = np.empty(len(x), np.float64)
  for start, end in zip(starts, ends):
    ranks[order[start:end]] = (start + end + 1) / 2
  return ranks


def spearman(x, y) -> float:
  return pearson(_average_ranks(x), _average_ranks(y))


def correlation_note(labels, predictions) -> str | None:
  """Why Pearson/Spearman read 0.0 when one side is constant (scipy returns nan there); else None."""
  constant = [name for name, x in (("predictions", predictions), ("labels", labels)) if np.ptp(np.asarray(x)) == 0]
  if not constant:
    return None
  return (f"pearson and spearman are undefined on constant {' and '.join(constant)} (scipy gives nan); "
          "written as 0.0")


def cross_entropy(labels, logits) -> float:
  """Mean -log softmax(logits)[label]."""
  logits = np.asarray(logits, np.float64)
  shifted = logits - logits.max(axis=-1, keepdims=True)
  log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
  return float(-np.mean(np.take_along_axis(log_probs, np.asarray(labels)[:, None], axis=-1)))


def squared_error(labels, predictions) -> float:
  return float(np.mean(np.square(np.asarray(predictions, np.float64) - np.asarray(labels, np.float64))))


# --- SQuAD --------------------------------------------------------------------------------------------

def normalize_answer(text: str) -> str:
  """The official SQuAD normalisation."""
  text = "".join(c for c in text.lower() if c not in set(string.punctuation))
  text = re.sub(r"\b(a|an|the)\b", " ", text)
  return " ".join(text.split())


def squad_exact(prediction: str, gold: str) -> float:
  return float(normalize_answer(prediction) == normalize_answer(gold))


def squad_f1(prediction: str, gold: str, version: str = "v2.0") -> float:
  """Token F1. v2.0: an answer that normalises to nothing scores 1 against another such, else 0;
  v1.1: it scores 0 against anything (no tokens in common)."""
  pred_tokens, gold_tokens = normalize_answer(prediction).split(), normalize_answer(gold).split()
  if version == "v2.0" and (not pred_tokens or not gold_tokens):
    return float(pred_tokens == gold_tokens)
  common = collections.Counter(pred_tokens) & collections.Counter(gold_tokens)
  overlap = sum(common.values())
  if not overlap:
    return 0.0
  precision, recall = overlap / len(pred_tokens), overlap / len(gold_tokens)
  return 2 * precision * recall / (precision + recall)


def squad_scores(predictions: dict[str, str], golds: dict[str, list[str]], version: str) -> dict[str, float]:
  """Exact match and F1 in percent over the questions of `golds`, as the official script of `version`.

  v1.1 (evaluate-v1.1.py): every gold answer counts as given, also one that normalises to nothing;
  a question without a prediction scores 0 and stays in the total; one without gold answers (which
  the official script cannot score) scores 0.
  v2.0 (evaluate-v2.0.py): gold answers that normalise to nothing are dropped, and a question left
  without any has the gold answer "" (unanswerable); a question without a prediction is left out of
  the total, as the official script leaves it (it prints "Missing prediction"). No prediction at all
  is a UserError (the official script divides by zero).
  """
  if version not in ("v1.1", "v2.0"):
    raise UserError(f"SQuAD version {version!r} is not one of ('v1.1', 'v2.0')")
  exact, f1 = [], []
  for qid, answers in golds.items():
    if version == "v2.0":
      if qid not in predictions:
        continue
      answers = [a for a in answers if normalize_answer(a)] or [""]
    elif qid not in predictions or not answers:
      exact.append(0.0)
      f1.append(0.0)
      continue
    exact.append(max(squad_exact(predictions[qid], a) for a in answers))
    f1.append(max(squad_f1(predictions[qid], a, version) for a in answers))
  if not exact:
    raise UserError(f"no prediction for any of the {len(golds)} SQuAD questions; predictions must be keyed "
                    "by the question ids")
  return {"exact_match": 100.0 * float(np.mean(exact)), "f1": 100.0 * float(np.mean(f1))}


# --- NER (seqeval's default chunking) -------------------------------------------------------------------

def _split_tag(label: str) -> tuple[str, str]:
  return label[0], (label[1:].split("-", maxsplit=1)[-1] or "_")


def _ends_chunk(prev_tag: str, tag: str, prev_type: str, type_: str) -> bool:
  return (prev_tag in ("E", "S") or (prev_tag in ("B", "I") and tag in ("B", "S", "O"))
          or (prev_tag not in ("O", ".") and prev_type != type_))


def _starts_chunk(prev_tag: str, tag: str, prev_type: str, type_: str) -> bool:
  return (tag in ("B", "S") or (prev_tag in ("E", "S", "O") and tag in ("E", "I"))
          or (tag not in ("O", ".") and prev_type != type_))


def entities(sequences: list[list[str]]) -> set[tuple[int, str, int, int]]:
  """(sentence, type, first, last) of every chunk, as seqeval.metrics.sequence_labeling.get_entities."""
  found = set()
  for s, labels in enumerate(sequences):
    prev_tag, prev_type, begin = "O", "", 0
    for i, label in enumerate(list(labels) + ["O"]):
      tag, type_ = _split_tag(label)
      if _ends_chunk(prev_tag, tag, prev_type, type_):
        found.add((s, prev_type, begin, i - 1))
      if _starts_chunk(prev_tag, tag, prev_type, type_):
        begin = i
      prev_tag, prev_type = tag, type_
  return found


def entity_f1(gold: list[list[str]], predicted: list[list[str]]) -> dict[str, float]:
  """Micro precision, recall and F1 over (sentence, type, span) entities."""
  true, pred = entities(gold), entities(predicted)
  hits = len(true & pred)
  precision = hits / len(pred) if pred else 0.0
  recall = hits / len(true) if true else 0.0
  f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
  return {"precision": precision, "recall": recall, "f1": f1}
