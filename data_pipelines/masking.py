"""Masked-LM targets as TensorFlow ops on a whole batch: choose positions, then 80% [MASK] / 10% random / 10% kept.

All strategies pick *spans of units* until the budget `min(max_predictions, max(1, round(rate * candidates)))`
is spent; a unit is a token (`token`), a whole word (`whole_word`, `ngram`, `span`: a piece plus its
continuation pieces), or for `knowledge` (ERNIE 1.0) a phrase or named entity an annotator tagged
(knowledge.py) and a whole word elsewhere, drawn with the odds of its level (`level_weights`: basic,
phrase, entity). Span lengths in units: 1 (token, whole_word), n in 1..3 with p ~ 1/n (ALBERT
n-gram), or a geometric(p=0.2) truncated to 1..10 and renormalised, mean 3.8 (SpanBERT). A multi-unit
span has a drawn length and a uniformly random place among those where it fits (no overlap with an
earlier span, no special token inside). The rate is held as SpanBERT holds it: a span that would
overrun the budget is cut to the whole units that fit; a unit that alone overruns it is skipped and
the next tried (BERT's whole-word masking). [CLS], [SEP], [PAD] (any special id) are never candidates.

Randomness is a counter-based hash (murmur3's finaliser) of (row key, stream, counter), so a row's
mask depends on its key only: `row_keys(seeds, shard, index)` gives every row ever produced its own
key, whatever the batch it lands in, the host count or the number of threads. Rows are processed
together: per-row loops become a few vectorized passes, and TensorFlow runs them without the GIL.
"""
from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from bert_jax.data_pipelines.errors import DataError
from bert_jax.data_pipelines.tftools import tf

STRATEGIES = ("token", "whole_word", "ngram", "span", "knowledge")
# Independent random streams per row (shuffling.py draws from 6..9).
_ORDER, _LENGTH, _PLACE, _ROLL, _REPLACE = 1, 2, 3, 4, 5


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
  mask_id: int  # what the 80% branch writes: [MASK], or [UNK] (Clinchant et al. 2019)
  special: np.ndarray  # bool[vocab]
  continuation: np.ndarray  # bool[vocab]
  trigram_shuffle_rate: float = 0.0  # StructBERT's word objective (shuffling.py); 0: off
  # knowledge: odds of a basic (word), phrase and entity unit being drawn; 0 splits that level into words
  level_weights: tuple = (1.0, 1.0, 1.0)
  # data.mask_rate_schedule: ((step, rate), ...): from each step on (increasing, > 0), that rate instead of `rate`
  schedule: tuple = ()

  def __post_init__(self):
    if self.strategy not in STRATEGIES:
      raise DataError(f"data.masking={self.strategy!r}; choose one of {STRATEGIES}")
    if not 0.0 < self.rate < 1.0:
      raise DataError(f"data.mask_rate={self.rate}; use a fraction in (0, 1), e.g. 0.15")
    if self.max_predictions < 1:
      raise DataError(f"data.max_predictions_per_seq={self.max_predictions}; use at least 1")
    if not 0.0 <= self.trigram_shuffle_rate < 1.0:
      raise DataError(f"data.trigram_shuffle_rate={self.trigram_shuffle_rate}; use a fraction in [0, 1) "
                      "(StructBERT: 0.05; 0 shuffles nothing)")
    weights = tuple(float(w) for w in self.level_weights)
    if len(weights) != 3 or weights[0] <= 0 or min(weights) < 0:
      raise DataError(f"data.knowledge weights (basic, phrase, entity)={weights}; use a positive basic weight and "
                      "phrase and entity weights >= 0 (0: that level's spans are masked as words)")
    object.__setattr__(self, "level_weights", weights)
    object.__setattr__(self, "schedule", check_schedule(self.schedule))
    object.__setattr__(self, "lengths", _length_distribution(self.strategy))
    object.__setattr__(self, "replacements", np.flatnonzero(~self.special).astype(np.int32))


def check_schedule(schedule) -> tuple:
  """data.mask_rate_schedule as ((step, rate), ...), steps increasing from 1 and rates in (0, 1); else one line."""
  try:
    pairs = tuple((int(step), float(rate)) for step, rate in schedule)
    ok = all(p == tuple(x) for p, x in zip(pairs, schedule))
  except (TypeError, ValueError):
    ok = False
  if not ok or any(not 0 < r < 1 for _, r in pairs) or [s for s, _ in pairs] != sorted({s for s, _ in pairs}) or \
      (pairs and pairs[0][0] < 1):
    raise DataError(f"data.mask_rate_schedule={schedule!r}; use ((step, rate), ...) with steps increasing from 1 and "
                    "rates in (0, 1), e.g. ((15895, 0.05),): data.mask_rate before the first step")
  return pairs


def rates_at(cfg: MaskingConfig, steps: np.ndarray) -> np.ndarray:
  """float64[N]: the masking rate of each row's step (data.mask_rate, then the schedule's from its steps)."""
  bounds = np.asarray([s for s, _ in cfg.schedule], np.int64)
  values = np.asarray([cfg.rate] + [r for _, r in cfg.schedule], np.float64)
  return values[np.searchsorted(bounds, np.asarray(steps, np.int64), side="right")]


def predictions_per_seq(data_cfg) -> int:
  """The masked positions a row has room for (P): data.max_predictions_per_seq, or for 0 (the default)
  ceil(data.mask_rate * data.max_seq_length), so a row gets the rate it asks for at any length (BERT's 20 at 128
  tokens and 15%, 77 at 512; ModernBERT's 308 at 1024 and 30%)."""
  cap = data_cfg.max_predictions_per_seq
  rate = max([data_cfg.mask_rate] + [r for _, r in check_schedule(data_cfg.get("mask_rate_schedule", ()))])
  return cap if cap else max(math.ceil(round(rate * data_cfg.max_seq_length, 6)), 1)


def check_predictions(data_cfg) -> None:
  """A set data.max_predictions_per_seq that cuts the rate's count by more than 10%: one line. A row's budget is
  min(P, rate * its candidates), at most rate * (max_seq_length - 2) ([CLS] and [SEP] are never candidates), so
  a cap below it lowers the rate silently as the length grows (BERT's 76 at 512 and 15% passes). XLNet's rows
  (data.example_builder=xlnet_stream) predict max_seq_length // xlnet.prediction_k, whatever the rate."""
  rate, length, cap = data_cfg.mask_rate, data_cfg.max_seq_length, data_cfg.max_predictions_per_seq
  if data_cfg.get("example_builder") == "xlnet_stream" or not isinstance(cap, int) or cap <= 0:
    return
  if cap < 0.9 * rate * (length - 2):
    raise DataError(f"data.max_predictions_per_seq={cap} caps data.mask_rate {rate} at {length} tokens to "
                    f"{cap / length:.1%}; set it >= ceil({rate}*{length})={math.ceil(round(rate * length, 6))}, or "
                    "to 0: derived from the rate")


def _mix(x):
  """murmur3 fmix32: a bijective avalanche on uint32."""
  t = tf()
  x = t.bitwise.bitwise_xor(x, t.bitwise.right_shift(x, 16)) * np.uint32(0x85EBCA6B)
  x = t.bitwise.bitwise_xor(x, t.bitwise.right_shift(x, 13)) * np.uint32(0xC2B2AE35)
  return t.bitwise.bitwise_xor(x, t.bitwise.right_shift(x, 16))


def row_keys(seeds: tuple, shard, index):
  """uint32[B] keys from Python-int seeds and int64[B] shard and row index."""
  t = tf()
  key = t.constant(np.uint32(0x9E3779B9))
  for s in seeds:
    key = _mix(t.bitwise.bitwise_xor(key, np.uint32(int(s) & 0xFFFFFFFF)))
  shard, index = t.cast(shard, t.int64), t.cast(index, t.int64)
  for word in (shard, t.bitwise.right_shift(index, 32), index):
    key = _mix(t.bitwise.bitwise_xor(key, t.cast(t.bitwise.bitwise_and(word, 0xFFFFFFFF), t.uint32)))
  return key


def uniform(keys, stream: int, counter):
  """float64 in [0, 1), shape of `counter` broadcast against keys[:, None]; one stream per kind of draw."""
  t = tf()
  k = _mix(t.bitwise.bitwise_xor(keys, np.uint32(stream * 0x9E3779B9 & 0xFFFFFFFF)))
  h = _mix(t.bitwise.bitwise_xor(k[:, None], _mix(t.cast(counter, t.uint32) + np.uint32(0x6A09E667))))
  return t.cast(h, t.float64) / 2.0 ** 32


def _suffix_min(x):
  """min(x[:, j:]) at every j, in log2(T) shifted minimums (T static)."""
  t = tf()
  width, shift = x.shape[1], 1
  while shift < width:
    x = t.minimum(x, t.concat([x[:, shift:], t.fill([t.shape(x)[0], shift], width)], 1))
    shift *= 2
  return x


def _take(x, index):
  """x[b, index[b, ...]] for every row b: one gather on the flattened rows (TF's batch_dims gather is slower)."""
  t = tf()
  rows = t.range(t.shape(x)[0])
  offset = t.reshape(rows * x.shape[1], [-1] + [1] * (len(index.shape) - 1))
  return t.gather(t.reshape(x, [-1]), index + offset)


def _nth_true(counts, n):
  """Position of the k-th True (k = 1..n) of each row from its running count `counts` (cumsum of the mask,
  int32[B, T]); T where a row has fewer: a binary search, cheaper than sorting the positions."""
  t = tf()
  return t.searchsorted(counts, t.broadcast_to(t.range(1, n + 1)[None], [t.shape(counts)[0], n]))


def _units(ids, lengths, cfg, special, continuation, tags=None):
  """Unit k of each row: start token, end token, whether a run (stretch between special tokens) starts
  there, validity; with knowledge `tags` (knowledge.py), a tagged span is one unit whatever its words."""
  t = tf()
  width = ids.shape[1]
  pos = t.range(width)
  candidate = ~t.gather(special, ids) & (pos[None] < lengths[:, None])
  if cfg.strategy == "token":
    start = candidate
  else:
    prev = t.pad(candidate[:, :-1], [[0, 0], [1, 0]])
    joins = t.gather(continuation, ids)
    if tags is not None:  # knowledge: a span's first token and the token after a span start units
      inside = tags > 0
      edge = inside | t.pad(inside[:, :-1], [[0, 0], [1, 0]])
      joins = t.where(edge, inside & (tags % 2 == 0), joins)
    start = candidate & (~joins | ~prev)
  counts = t.cumsum(t.cast(start, t.int32), 1)
  valid = pos[None] < counts[:, -1:]
  starts = _nth_true(counts, width)  # width past the last unit
  next_noncandidate = _suffix_min(t.where(candidate, width, pos[None]))
  following = t.concat([starts[:, 1:], t.fill([t.shape(ids)[0], 1], width)], 1)
  ends = t.where(valid, t.minimum(following, _take(next_noncandidate, t.minimum(starts, width - 1))), width)
  # a non-candidate lies between two units exactly where the first ends before the second starts
  run_start = t.pad(ends[:, :-1] != starts[:, 1:], [[0, 0], [1, 0]])
  return candidate, starts, ends, run_start, valid, counts - 1


def _single_units(keys, starts, ends, valid, budget, cfg, unit_weights=None):
  """BERT: units in random order, each taken whole if it fits in what is left of the budget. With
  `unit_weights` (float64[B, T], > 0 on valid units) the order is a weighted draw without replacement:
  keys -log(u) / weight, smallest first (Efraimidis and Spirakis 2006)."""
  t = tf()
  width = starts.shape[1]
  u = uniform(keys, _ORDER, t.range(width)[None])
  if unit_weights is None:
    priority = t.where(valid, u, 2.0)
  else:
    priority = t.where(valid, -t.math.log1p(-u) / t.where(valid, unit_weights, 1.0), np.inf)
  order = t.argsort(priority, axis=1, stable=True)
  sizes = t.gather(ends - starts, order, batch_dims=1)
  ok = t.gather(valid, order, batch_dims=1)
  if cfg.strategy == "token":  # every unit is one token: the first `budget` in random order
    taken = ok & (t.range(width)[None] < budget[:, None])
  else:
    def body(r, used, taken):
      fits = ok[:, r] & (used + sizes[:, r] <= budget)
      return r + 1, used + t.where(fits, sizes[:, r], 0), taken.write(r, fits)
    _, _, taken = t.while_loop(
        lambda r, used, _: (r < width) & t.reduce_any(used < budget), body,
        (t.constant(0), t.zeros_like(budget), t.TensorArray(t.bool, width, element_shape=[None])))
    taken = t.transpose(t.pad(taken.stack(), [[0, width - taken.size()], [0, 0]]))
  chosen = t.scatter_nd(t.stack([t.broadcast_to(t.range(t.shape(order)[0])[:, None], t.shape(order)), order], -1),
                        taken, t.shape(order))
  return chosen, starts, ends


def _free_lengths(blocked, next_run):
  """Free units that follow each unit (itself included) before a taken unit or a special token
  (`next_run`: the first unit of the next run after each unit)."""
  t = tf()
  width = blocked.shape[1]
  pos = t.range(width)[None]
  next_blocked = _suffix_min(t.where(blocked, pos, width))
  return t.maximum(t.minimum(next_blocked, next_run) - pos, 0)


def _next_run(run_start):
  """The first unit of the next run (stretch between special tokens) after each unit; width past the last."""
  t = tf()
  width = run_start.shape[1]
  pos = t.range(width)[None]
  return t.concat([_suffix_min(t.where(run_start, pos, width))[:, 1:], t.fill([t.shape(run_start)[0], 1], width)], 1)


def _span_draws(keys, steps: int, cfg):
  """float64[B, steps, 2]: each loop step's drawn span length and place draw, made before the loop."""
  t = tf()
  step = t.range(steps)[None]
  cdf = t.constant(np.cumsum(cfg.lengths)[:-1], t.float64)
  drawn = 1 + t.reduce_sum(t.cast(uniform(keys, _LENGTH, step)[:, :, None] >= cdf, t.int32), 2)
  return t.stack([t.cast(drawn, t.float64), uniform(keys, _PLACE, step)], 2)


def _multi_unit_spans(keys, starts, ends, run_start, valid, budget, cfg):
  """Draw a length, then a uniformly random place where it fits (shortened while none is free); cut the
  span to the whole units that fit in the budget. Returns (chosen units, span start and end tokens).

  The free lengths are computed once and then cut where each new span blocks units (a unit left of
  the span can run at most up to its start): a few elementwise passes per span instead of two
  log2(T)-pass suffix minimums. A blocked unit's free length is <= 0 (not cut to 0), so a row has room
  while its longest free length is > 0. The draws are made before the loop and per-row values kept
  [B, 1]: a step runs few ops, and on a few long rows each op's fixed cost is most of a step's."""
  t = tf()
  width, max_len = starts.shape[1], len(cfg.lengths)
  rows = t.shape(starts)[0]
  draws = _span_draws(keys, width + 1, cfg)  # the loop takes at most width + 1 steps
  # (start, end) token of unit k of row b at b * width + k; max_len more past the last row for the windows
  bounds = t.pad(t.reshape(t.stack([starts, ends], -1), [-1, 2]), [[0, max_len], [0, 0]])
  row_units = t.range(rows)[:, None] * width
  # the place is found in blocks of units, then inside one: TF's cumsum over a whole row is its slowest op
  block = next(b for b in (32, 16, 8, 4, 2, 1) if width % b == 0)
  blocks = width // block
  row_blocks = t.range(rows) * blocks
  pos, steps = np.arange(width, dtype=np.int32)[None], np.arange(max_len, dtype=np.int32)[None]

  def body(i, left, most, free, lo, hi):
    drawn, place = t.split(t.gather(draws, i, axis=1), 2, axis=1)  # [B, 1] each
    length = t.minimum(t.cast(drawn, t.int32), most)
    active = (left > 0) & (most > 0)
    fits = t.cast(free >= length, t.int32)
    by_block = t.cumsum(t.reduce_sum(t.reshape(fits, [-1, blocks, block]), 2), 1)  # fits up to each block's end
    pick = t.cast(place * t.cast(by_block[:, -1:], t.float64), t.int32)  # the pick-th fit, from 0
    passed = by_block <= pick
    in_block = t.minimum(t.reduce_sum(t.cast(passed, t.int32), 1), blocks - 1)  # the block that holds it
    counts = t.cumsum(t.gather(t.reshape(fits, [-1, block]), row_blocks + in_block), 1)
    pick = pick - t.reduce_max(t.where(passed, by_block, 0), 1, keepdims=True)  # its place in that block
    first = t.minimum(in_block[:, None] * block + t.reduce_sum(t.cast(counts <= pick, t.int32), 1, keepdims=True),
                      width - 1)
    span_start, span_ends = t.unstack(t.gather(bounds, row_units + first + steps), axis=2)  # [B, max_len] each
    span_start = span_start[:, :1]
    ok = (steps < length) & (span_ends <= left + span_start)  # a prefix: its count is the length taken
    take = t.where(active, t.reduce_sum(t.cast(ok, t.int32), 1, keepdims=True), 0)
    span_end = t.reduce_max(t.where(ok, span_ends, 0), 1, keepdims=True)
    cut = pos < t.where(active, first + t.maximum(take, 1), 0)  # a unit that alone overruns is never tried again
    free = t.where(cut, t.minimum(free, first - pos), free)
    in_span = cut & (pos >= t.where(take > 0, first, width))
    lo = t.where(in_span, span_start, lo)
    hi = t.where(in_span, span_end, hi)
    left = left - t.where(take > 0, span_end - span_start, 0)
    return i + 1, left, t.reduce_max(free, 1, keepdims=True), free, lo, hi

  def cond(i, left, most, free, lo, hi):
    del free, lo, hi
    return (i <= width) & t.reduce_any((left > 0) & (most > 0))

  free = _free_lengths(~valid, _next_run(run_start))
  _, _, _, _, lo, hi = t.while_loop(
      cond, body, (t.constant(0), budget[:, None], t.reduce_max(free, 1, keepdims=True), free,
                   t.zeros_like(starts), t.zeros_like(starts)))
  return lo < hi, lo, hi


def _spans_in_two_widths(keys, starts, ends, run_start, valid, budget, cfg):
  """`_multi_unit_spans`, run separately on the rows of at most a quarter of the width in units (cut to
  that width) and on the others. A row's spans depend on its own units and key only, and one span
  blocks at least one unit, so a short row needs no more loop steps than it has units: the same
  result, while most rows of a long-width batch stop paying for the longest row's units and steps."""
  t = tf()
  width = starts.shape[1]
  narrow = width // 4
  if narrow < 32:
    return _multi_unit_spans(keys, starts, ends, run_start, valid, budget, cfg)
  short = t.reduce_sum(t.cast(valid, t.int32), 1) <= narrow
  outputs = []
  for rows, cut in ((t.where(short)[:, 0], narrow), (t.where(~short)[:, 0], width)):
    take = lambda x, rows=rows, cut=cut: t.gather(x, rows)[:, :cut]  # noqa: E731
    chosen, lo, hi = _multi_unit_spans(t.gather(keys, rows), take(starts), take(ends), take(run_start), take(valid),
                                       t.gather(budget, rows), cfg)
    pad = [[0, 0], [0, width - cut]]
    outputs.append([t.scatter_nd(rows[:, None], t.pad(x, pad), t.shape(starts, out_type=t.int64))
                    for x in (chosen, lo, hi)])
  (chosen_a, lo_a, hi_a), (chosen_b, lo_b, hi_b) = outputs
  return chosen_a | chosen_b, lo_a + lo_b, hi_a + hi_b


def _knowledge_tags(tags, cfg):
  """Tags with the spans of weight-0 levels dropped."""
  t = tf()
  if min(cfg.level_weights) > 0:
    return tags
  off = t.constant(np.array([False, cfg.level_weights[1] == 0, cfg.level_weights[2] == 0]))
  return t.where(t.gather(off, (tags + 1) // 2), 0, tags)


def mask_batch(ids, lengths, keys, cfg: MaskingConfig, tags=None, rates=None) -> dict:
  """Masks rows `ids` (int32[B, T], padded, with [CLS]/[SEP]; `lengths` int32[B] real tokens) with
  per-row `keys` (uint32[B]). Returns input_ids, masked_lm_{positions, ids, weights} and the span
  features (masked_lm_span_{left, right, offset}) of FEATURES. `tags` (int32[B, T], knowledge.py): the
  phrase and entity spans of knowledge masking; None or all 0 (no span) masks whole words. `rates` (float64[B]):
  each row's masking rate (`rates_at`: data.mask_rate_schedule at the row's step); None: cfg.rate.

  Rows are masked in groups cut to the width that holds them (an eighth, a quarter, all of it; cuts of
  at least 64): a row's mask depends on its own tokens and key only (never on the width past its
  length), so the result is the same, while the many short rows of a long-width batch stop paying
  for its padding."""
  t = tf()
  width = ids.shape[1]
  cuts = [cut for cut in (width // 8, width // 4) if cut >= 64] + [width]
  if rates is None:
    rates = t.fill([t.shape(ids)[0]], t.constant(cfg.rate, t.float64))
  if len(cuts) == 1:
    return _mask_rows(ids, lengths, keys, cfg, tags, rates)
  group = t.reduce_sum(t.cast(lengths[:, None] > cuts[:-1], t.int32), 1)
  groups, outputs = [], []
  for k, cut in enumerate(cuts):
    rows = t.where(group == k)[:, 0]
    group_ids = t.gather(ids, rows)
    out = _mask_rows(group_ids[:, :cut], t.gather(lengths, rows), t.gather(keys, rows), cfg,
                     None if tags is None else t.gather(tags, rows)[:, :cut], t.gather(rates, rows))
    out["input_ids"] = t.concat([out["input_ids"], group_ids[:, cut:]], 1)
    groups.append(rows)
    outputs.append(out)
  back = t.math.invert_permutation(t.concat(groups, 0))
  return {name: t.gather(t.concat([out[name] for out in outputs], 0), back) for name in outputs[0]}


def _mask_rows(ids, lengths, keys, cfg: MaskingConfig, tags, rates) -> dict:
  """mask_batch on one group of rows."""
  t = tf()
  width, slots = ids.shape[1], cfg.max_predictions
  special = t.constant(cfg.special)
  unit_weights = None
  if cfg.strategy == "knowledge":
    tags = _knowledge_tags(t.zeros_like(ids) if tags is None else tags, cfg)
  else:
    tags = None
  candidate, starts, ends, run_start, valid, unit_of = _units(ids, lengths, cfg, special, t.constant(cfg.continuation),
                                                        tags)
  if tags is not None and len(set(cfg.level_weights) - {0.0}) > 1:  # equal odds: whole_word's uniform order
    first = t.gather((tags + 1) // 2, t.minimum(starts, width - 1), batch_dims=1)  # 0 basic, 1 phrase, 2 entity
    unit_weights = t.gather(t.constant(cfg.level_weights, t.float64), first)
  num_candidates = t.reduce_sum(t.cast(candidate, t.float64), 1)
  budget = t.minimum(slots, t.maximum(1, t.cast(t.round(num_candidates * t.cast(rates, t.float64)), t.int32)))
  if len(cfg.lengths) == 1:
    chosen, lo, hi = _single_units(keys, starts, ends, valid, budget, cfg, unit_weights)
  else:
    chosen, lo, hi = _spans_in_two_widths(keys, starts, ends, run_start, valid, budget, cfg)
  unit = t.maximum(unit_of, 0)
  selected = candidate & _take(chosen, unit)
  pos = t.range(width)[None]
  # knowledge: one draw per unit (at its first token), so a unit's tokens get 80/10/10 together
  roll = uniform(keys, _ROLL, pos if tags is None else _take(starts, unit))
  replacements = t.constant(cfg.replacements)
  random_ids = t.gather(replacements, t.cast(uniform(keys, _REPLACE, pos) * len(cfg.replacements), t.int32))
  masked_ids = t.where(roll < 0.8, cfg.mask_id, t.where(roll >= 0.9, random_ids, ids))
  counts = t.cumsum(t.cast(selected, t.int32), 1)
  weights = t.range(slots)[None] < counts[:, -1:]
  positions = t.where(weights, _nth_true(counts, slots), 0)
  at = functools.partial(_take, index=positions)
  span = at(unit)
  left = _take(lo, span) - 1
  zero = t.zeros_like(positions)
  return {
      "input_ids": t.where(selected, masked_ids, ids),
      "masked_lm_positions": positions,
      "masked_lm_ids": t.where(weights, at(ids), zero),
      "masked_lm_weights": t.cast(weights, t.float32),
      "masked_lm_span_left": t.where(weights, left, zero),
      "masked_lm_span_right": t.where(weights, _take(hi, span), zero),
      "masked_lm_span_offset": t.where(weights, positions - left - 1, zero),
  }
