"""On-the-fly masked-LM targets: choose positions, then 80% [MASK] / 10% random token / 10% unchanged.

All strategies pick *spans of units* until the budget
`min(max_predictions, max(1, round(rate * candidates)))` is spent; a unit is a token (`token`) or a
whole word (`whole_word`, `ngram`, `span`: word = a piece plus its continuation pieces). Span lengths
in units: 1 (token, whole_word), n in 1..3 with p ~ 1/n (ALBERT n-gram), or a geometric(p=0.2)
truncated to 1..10 and renormalised, mean 3.8 (SpanBERT). A span never overlaps an earlier one and
never crosses a special token. The last multi-unit span is finished even past the budget, cut only
at max_predictions (the rate overshoots by part of one span; the length distribution stays exact);
a single unit that overruns the budget is skipped and the next tried, as in BERT's whole-word masking.
[CLS], [SEP], [PAD] (any special id) are never candidates.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from data_pipelines.errors import DataError

STRATEGIES = ("token", "whole_word", "ngram", "span")


def _length_distribution(strategy: str) -> np.ndarray:
  if strategy == "ngram":
    weights = 1.0 / np.arange(1, 4)
  elif strategy == "span":
    weights = 0.2 * 0.8 ** np.arange(10)
  else:
    weights = np.ones(1)
  return weights / weights.sum()


@dataclasses.dataclass(frozen=True)
class MaskingConfig:
  strategy: str
  rate: float
  max_predictions: int
  mask_id: int
  special: np.ndarray  # bool[vocab]
  continuation: np.ndarray  # bool[vocab]

  def __post_init__(self):
    if self.strategy not in STRATEGIES:
      raise DataError(f"data.masking={self.strategy!r}; choose one of {STRATEGIES}")
    if not 0.0 < self.rate < 1.0:
      raise DataError(f"data.mask_rate={self.rate}; use a fraction in (0, 1), e.g. 0.15")
    if self.max_predictions < 1:
      raise DataError(f"data.max_predictions_per_seq={self.max_predictions}; use at least 1")
    object.__setattr__(self, "lengths", _length_distribution(self.strategy))
    object.__setattr__(self, "replacements", np.flatnonzero(~self.special).astype(np.int32))


@dataclasses.dataclass
class Masked:
  input_ids: np.ndarray  # int32[n] after replacement
  positions: np.ndarray  # int32[k], ascending
  labels: np.ndarray  # int32[k], the original ids
  span_left: np.ndarray  # int32[k], position just before the prediction's span
  span_right: np.ndarray  # int32[k], position just after it
  span_offset: np.ndarray  # int32[k], index of the prediction inside its span


def _units(ids: np.ndarray, cfg: MaskingConfig):
  """(starts, ends, run) of the masking units; `run` numbers stretches not broken by special tokens."""
  candidate = ~cfg.special[ids]
  prev_candidate = np.concatenate([[False], candidate[:-1]])
  if cfg.strategy == "token":
    start = candidate
  else:
    start = candidate & (~cfg.continuation[ids] | ~prev_candidate)
  starts = np.flatnonzero(start)
  ends = np.append(starts[1:], len(ids))
  # A unit ends at the first non-candidate after its start.
  next_special = np.minimum.accumulate(np.where(candidate, len(ids), np.arange(len(ids)))[::-1])[::-1]
  ends = np.minimum(ends, next_special[starts])
  run = np.cumsum(~candidate)[starts]
  return starts, ends, run, int(candidate.sum())


def _single_units(starts, ends, budget, rng):
  """BERT: units in random order, each taken whole if it fits in what is left of the budget."""
  spans, used = [], 0
  for u in rng.permutation(len(starts)):
    if used >= budget:
      break
    if used + ends[u] - starts[u] <= budget:
      used += ends[u] - starts[u]
      spans.append((starts[u], ends[u]))
  return spans


def _free_starts(blocked, run, length):
  """Units where `length` consecutive free units start without crossing a special token."""
  n = len(blocked) - length + 1
  if n <= 0:
    return np.zeros(0, np.int64)
  taken = np.concatenate([[0], np.cumsum(blocked)])
  u = np.arange(n)
  return np.flatnonzero((taken[u + length] == taken[u]) & (run[u] == run[u + length - 1]))


def _multi_unit_spans(starts, ends, run, budget, cfg, rng):
  """Draw a length, then a uniformly random place where it fits. Drawing the place among free ones
  (rather than skipping collisions) and finishing the last span past the budget (up to
  max_predictions) keep long spans as likely as the length distribution says."""
  blocked = np.zeros(len(starts), bool)
  spans, used = [], 0
  for length in rng.choice(len(cfg.lengths), size=len(starts) + 1, p=cfg.lengths) + 1:
    if used >= budget:
      break
    free = _free_starts(blocked, run, length)
    while not free.size and length > 1:
      length -= 1
      free = _free_starts(blocked, run, length)
    if not free.size:
      break
    first = free[rng.integers(len(free))]
    last = first + length - 1
    while last >= first and used + ends[last] - starts[first] > cfg.max_predictions:
      last -= 1
    if last < first:  # this unit alone overruns max_predictions: never anchor on it again
      blocked[first] = True
      continue
    blocked[first:last + 1] = True
    used += ends[last] - starts[first]
    spans.append((starts[first], ends[last]))
  return spans


def mask_tokens(ids: np.ndarray, cfg: MaskingConfig, rng: np.random.Generator) -> Masked:
  """Masks one unpadded row `ids` (int32[n], with its [CLS]/[SEP])."""
  starts, ends, run, num_candidates = _units(ids, cfg)
  budget = min(cfg.max_predictions, max(1, int(round(num_candidates * cfg.rate))))
  if len(cfg.lengths) == 1:
    spans = _single_units(starts, ends, budget, rng)
  else:
    spans = _multi_unit_spans(starts, ends, run, budget, cfg, rng)
  spans.sort()
  positions = np.concatenate([np.arange(a, b) for a, b in spans] or [[]]).astype(np.int32)
  left = np.concatenate([np.full(b - a, a - 1) for a, b in spans] or [[]]).astype(np.int32)
  right = np.concatenate([np.full(b - a, b) for a, b in spans] or [[]]).astype(np.int32)
  offset = np.concatenate([np.arange(b - a) for a, b in spans] or [[]]).astype(np.int32)
  labels = ids[positions]
  out = ids.copy()
  roll = rng.random(len(positions))
  out[positions[roll < 0.8]] = cfg.mask_id
  random_slots = positions[roll >= 0.9]
  out[random_slots] = rng.choice(cfg.replacements, size=len(random_slots))
  return Masked(out, positions, labels, left, right, offset)
