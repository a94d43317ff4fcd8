"""On-the-fly masked-LM targets: choose positions, then 80% [MASK] / 10% random token / 10% unchanged.

All strategies pick *spans of units* in random anchor order until the budget
`min(max_predictions, max(1, round(rate * candidates)))` is spent; a unit is a token (`token`) or a
whole word (`whole_word`, `ngram`, `span`: word = a piece plus its continuation pieces). Span lengths
in units: 1 (token, whole_word), n in 1..3 with p ~ 1/n (ALBERT n-gram), or a geometric(p=0.2)
truncated to 1..10 and renormalised, mean 3.8 (SpanBERT). A span never overlaps an earlier one and
never crosses a special token (an overlapping draw is skipped, as in SpanBERT); a span that would overrun the budget keeps only the units that fit
(for single-unit strategies that means the word is skipped, as in BERT's whole-word masking).
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


def _choose_spans(starts, ends, run, budget, cfg, rng):
  """[(first_unit, last_unit_exclusive)] with at most `budget` tokens, non-overlapping."""
  taken = np.zeros(len(starts), bool)
  spans, used = [], 0
  lengths = rng.choice(len(cfg.lengths), size=len(starts), p=cfg.lengths) + 1
  for anchor, length in zip(rng.permutation(len(starts)), lengths):
    if used >= budget:
      break
    last = anchor
    while last + 1 < min(anchor + length, len(starts)) and run[last + 1] == run[anchor]:
      last += 1
    if taken[anchor:last + 1].any():
      continue
    while last >= anchor and used + ends[last] - starts[anchor] > budget:
      last -= 1
    if last < anchor:
      continue
    taken[anchor:last + 1] = True
    used += ends[last] - starts[anchor]
    spans.append((starts[anchor], ends[last]))
  return spans


def mask_tokens(ids: np.ndarray, cfg: MaskingConfig, rng: np.random.Generator) -> Masked:
  """Masks one unpadded row `ids` (int32[n], with its [CLS]/[SEP])."""
  starts, ends, run, num_candidates = _units(ids, cfg)
  budget = min(cfg.max_predictions, max(1, int(round(num_candidates * cfg.rate))))
  spans = sorted(_choose_spans(starts, ends, run, budget, cfg, rng))
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
