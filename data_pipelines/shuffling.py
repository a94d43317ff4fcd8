"""StructBERT's word structural objective (Wang et al. 2019, section 2.2) as TensorFlow ops on a masked
batch: shuffle trigrams of unmasked tokens and keep what was there for the model to predict.

A row's free tokens are its real tokens that are neither special ([CLS], [SEP]) nor chosen by the
masking. From a random offset 0..2 the row is cut into windows of three consecutive positions; a window
of three free tokens is a candidate. The row shuffles k = floor(rate x U / 3 + u) of its candidates,
picked at random (U: its free tokens, u uniform in [0, 1): on average rate x U / 3 trigrams, "rate of
the trigrams of unmasked tokens"; fewer only when a row has fewer candidates). Each picked trigram is
reordered by one of the five permutations of three that move something, uniformly: the identity would
ask nothing. `shuffled_positions` lists all three positions of every picked trigram, ascending, and
`shuffled_ids` the original tokens there; they are never masked positions, and specials never move.

Random draws use masking.py's counter hash with streams of their own, so a row's shuffle, like its
mask, depends on its key only.
"""
from __future__ import annotations

import math

import numpy as np

from bert_jax.data_pipelines.masking import MaskingConfig, uniform
from bert_jax.data_pipelines.tftools import tf

_OFFSET, _COUNT, _PICK, _PERMUTE = 6, 7, 8, 9  # masking.py uses streams 1..5
# Token at slot i of a shuffled trigram = the one at slot PERMUTATIONS[choice][i]; every permutation
# but the identity.
PERMUTATIONS = np.array([[0, 2, 1], [1, 0, 2], [1, 2, 0], [2, 0, 1], [2, 1, 0]], np.int32)


def trigram_slots(max_seq_length: int, rate: float) -> int:
  """S, the width of the shuffled_* features: three per trigram a row of max_seq_length can get
  (at most T - 2 free tokens, so k <= ceil(rate x (T - 2) / 3))."""
  return 3 * math.ceil(rate * (max_seq_length - 2) / 3)


def _predicted(masked, width: int):
  """bool[B, T]: the positions the masking chose."""
  t = tf()
  hit = masked["masked_lm_positions"][:, :, None] == t.range(width)[None, None]
  return t.reduce_any(hit & (masked["masked_lm_weights"][:, :, None] > 0), 1)


def _picked_windows(keys, free, cfg: MaskingConfig):
  """(offset int32[B, 1], picked bool[B, J]): the windows [offset + 3j, offset + 3j + 2] to shuffle."""
  t = tf()
  width = free.shape[1]
  windows = width // 3 + 1
  offset = t.cast(uniform(keys, _OFFSET, t.zeros([1], t.int32)) * 3, t.int32)
  members = offset[:, :, None] + 3 * t.range(windows)[None, :, None] + t.range(3)[None, None]
  inside = t.gather(free, t.minimum(members, width - 1), batch_dims=1) & (members < width)
  candidate = t.reduce_all(inside, -1)
  wanted = cfg.trigram_shuffle_rate * t.reduce_sum(t.cast(free, t.float64), 1) / 3
  count = t.cast(t.floor(wanted + uniform(keys, _COUNT, t.zeros([1], t.int32))[:, 0]), t.int32)
  count = t.minimum(count, trigram_slots(width, cfg.trigram_shuffle_rate) // 3)
  priority = t.where(candidate, uniform(keys, _PICK, t.range(windows)[None]), 2.0)
  rank = t.argsort(t.argsort(priority, axis=1, stable=True), axis=1, stable=True)
  return offset, candidate & (rank < count[:, None])


def shuffle_trigrams(ids, lengths, masked: dict, keys, cfg: MaskingConfig) -> dict:
  """ids: int32[B, T] unmasked rows, `lengths` int32[B]; masked: mask_batch's output for them, with the
  same `keys`. Returns input_ids (masked, trigrams shuffled) and shuffled_{positions, ids, weights}."""
  t = tf()
  width, slots = ids.shape[1], trigram_slots(ids.shape[1], cfg.trigram_shuffle_rate)
  pos = t.range(width)[None]
  free = (~t.gather(t.constant(cfg.special), ids) & (pos < lengths[:, None])) & ~_predicted(masked, width)
  offset, picked = _picked_windows(keys, free, cfg)
  windows = picked.shape[1]
  rel = t.maximum(pos - offset, 0)
  window, slot = rel // 3, rel % 3
  moved = (pos >= offset) & t.gather(picked, window, batch_dims=1)
  choice = t.cast(uniform(keys, _PERMUTE, t.range(windows)[None]) * len(PERMUTATIONS), t.int32)
  permutation = t.gather(t.constant(PERMUTATIONS), choice)  # [B, J, 3]
  source = offset + 3 * window + t.gather_nd(permutation, t.stack([window, slot], -1), batch_dims=1)
  source = t.where(moved, source, pos)
  positions = t.argsort(t.where(moved, pos, width + pos), axis=1, stable=True)[:, :slots]
  weights = t.range(slots)[None] < t.reduce_sum(t.cast(moved, t.int32), 1)[:, None]
  positions = t.where(weights, positions, 0)
  return {
      "input_ids": t.gather(masked["input_ids"], source, batch_dims=1),
      "shuffled_positions": positions,
      "shuffled_ids": t.where(weights, t.gather(ids, positions, batch_dims=1), 0),
      "shuffled_weights": t.cast(weights, t.float32),
  }
