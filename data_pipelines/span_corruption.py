"""T5's span corruption (data.example_builder="span_corruption"): t5.data.preprocessors.span_corruption, in NumPy.

The split's documents are tokenized (tokenizer kind t5_spm), concatenated and cut into chunks of
`tokens_length` tokens, the length `random_spans_helper` derives from the encoder length (data.max_seq_length)
so that a corrupted chunk plus its sentinels and </s> fills it: 568 tokens for 512 inputs and 114 targets at
T5's noise density 0.15 and mean span length 3 (data.noise_density, data.mean_noise_span_length). Each chunk's
noise mask is `random_spans_noise_mask`: the noise and non-noise token counts split into the same number of
spans by uniformly random segmentation, interleaved non-noise first. Inputs keep the non-noise tokens with one
sentinel in place of each noise span (<extra_id_0>, <extra_id_1>, ... : the top ids counting down); targets are
each sentinel followed by the span it replaced; both end with </s>.

Rows are packed: examples are laid end to end (segment ids 1, 2, ...; 0 padding) while both the inputs and the
targets still fit, the decoder's inputs being each target shifted right within its segment (0, T5's start id,
first). Chunks are full length except each shuffle block's last, so most rows hold one example.

The streamed input (span_stream.py) reads the corpus as the masked-LM pipeline does and draws example k's noise
mask from `example_rng(seeds, shard, counter)`, a function of (data.seed, split, shard, epoch, k) alone: re-drawn
every epoch, and the same draw here and there, which is what its tests compare.
"""
from __future__ import annotations

import numpy as np

from bert_jax.data_pipelines.errors import DataError

BUILDER = "span_corruption"
# name: (dtype, dims, meaning); T: the encoder length (data.max_seq_length), U: the targets' (target_length).
FEATURES = {
    "encoder_input_tokens": ("int32", ("B", "T"), "corrupted text, a sentinel per dropped span, </s> per example"),
    "encoder_segment_ids": ("int32", ("B", "T"), "the packed example of each input token (1, 2, ...; 0 padding)"),
    "decoder_input_tokens": ("int32", ("B", "U"), "the targets shifted right within their example (0 first)"),
    "decoder_target_tokens": ("int32", ("B", "U"), "each sentinel followed by its span, </s> per example"),
    "decoder_segment_ids": ("int32", ("B", "U"), "the packed example of each target token"),
    "decoder_loss_weights": ("float32", ("B", "U"), "1 at real target tokens"),
}


def random_spans_helper(inputs_length: int, noise_density: float, mean_noise_span_length: float,
                        extra_tokens_per_span_inputs: int = 1, extra_tokens_per_span_targets: int = 1
                        ) -> tuple[int, int]:
  """(tokens_length, targets_length): the raw chunk length whose corrupted inputs (non-noise tokens, a sentinel
  per span, </s>) fit `inputs_length`, and its targets' length (t5.data.preprocessors.random_spans_helper)."""
  def lengths(tokens_length):
    noise = int(round(tokens_length * noise_density))
    spans = int(round(noise / mean_noise_span_length))
    return (tokens_length - noise + spans * extra_tokens_per_span_inputs + 1,
            noise + spans * extra_tokens_per_span_targets + 1)

  tokens_length = inputs_length - 1
  while lengths(tokens_length + 1)[0] <= inputs_length:
    tokens_length += 1
  _, targets_length = lengths(tokens_length)
  if noise_density == 0.5 and targets_length > inputs_length:  # T5's: targets as long as the inputs then
    tokens_length -= 1
    targets_length -= 1
  return tokens_length, targets_length


def _random_segmentation(num_items: int, num_segments: int, rng: np.random.Generator) -> np.ndarray:
  """Lengths (each >= 1) of `num_segments` segments of `num_items` items, the boundaries drawn uniformly."""
  first = np.zeros(num_items, np.int64)
  first[1:] = rng.permutation((np.arange(num_items - 1) < num_segments - 1).astype(np.int64))
  return np.bincount(np.cumsum(first), minlength=num_segments)


def random_spans_noise_mask(length: int, noise_density: float, mean_noise_span_length: float,
                            rng: np.random.Generator) -> np.ndarray:
  """bool[length]: round(length * density) noise tokens (at least 1, at most length - 1) in
  round(noise / mean) spans (at least 1), alternating with as many non-noise spans, non-noise first."""
  orig_length, length = length, max(length, 2)
  num_noise = int(np.clip(round(length * noise_density), 1, length - 1))
  num_spans = max(int(round(num_noise / mean_noise_span_length)), 1)
  noise_lengths = _random_segmentation(num_noise, num_spans, rng)
  nonnoise_lengths = _random_segmentation(length - num_noise, num_spans, rng)
  interleaved = np.stack([nonnoise_lengths, noise_lengths], axis=1).reshape(-1)
  starts = np.zeros(length, np.int64)
  starts[np.cumsum(interleaved)[:-1]] = 1
  return (np.cumsum(starts) % 2 == 1)[:orig_length]


def example_rng(seeds: tuple, shard: int, counter: int) -> np.random.Generator:
  """The generator of one example's noise mask: (data.seed, split), its shard and its counter (epoch << 40 | its
  index in the shard's epoch, shards.COUNTER_EPOCH_SHIFT)."""
  return np.random.default_rng([*seeds, shard, counter])


def noise_span_to_unique_sentinel(tokens: np.ndarray, noise_mask: np.ndarray, top_sentinel: int) -> np.ndarray:
  """Each noise span replaced by one sentinel: the first by top_sentinel (<extra_id_0>), then counting down."""
  prev = np.concatenate([[False], noise_mask[:-1]])
  first = noise_mask & ~prev
  out = np.where(first, top_sentinel + 1 - np.cumsum(first), tokens)
  return out[~(noise_mask & prev)]


def corrupt(tokens: np.ndarray, noise_mask: np.ndarray, top_sentinel: int, eos: int) -> tuple[np.ndarray, np.ndarray]:
  """(inputs, targets) of one chunk, each ending with </s>."""
  inputs = noise_span_to_unique_sentinel(tokens, noise_mask, top_sentinel)
  targets = noise_span_to_unique_sentinel(tokens, ~noise_mask, top_sentinel)
  return np.append(inputs, eos).astype(np.int32), np.append(targets, eos).astype(np.int32)


def pack(examples: list[tuple[np.ndarray, np.ndarray]], inputs_length: int, targets_length: int) -> dict:
  """One row of FEATURES from examples that fit it together (their total lengths within the row's)."""
  row = {k: np.zeros(inputs_length if k.startswith("encoder") else targets_length,
                     np.float32 if k == "decoder_loss_weights" else np.int32) for k in FEATURES}
  at_in = at_tgt = 0
  for segment, (inputs, targets) in enumerate(examples, start=1):
    row["encoder_input_tokens"][at_in:at_in + len(inputs)] = inputs
    row["encoder_segment_ids"][at_in:at_in + len(inputs)] = segment
    span = slice(at_tgt, at_tgt + len(targets))
    row["decoder_target_tokens"][span] = targets
    row["decoder_input_tokens"][at_tgt + 1:span.stop] = targets[:-1]  # position at_tgt keeps 0: the start id
    row["decoder_segment_ids"][span] = segment
    row["decoder_loss_weights"][span] = 1.0
    at_in, at_tgt = at_in + len(inputs), span.stop
  if at_in > inputs_length or at_tgt > targets_length:
    raise AssertionError(f"packed {at_in} inputs and {at_tgt} targets into a row of {inputs_length}, {targets_length}")
  return row


def noise(data_cfg) -> tuple[float, float]:
  """(data.noise_density, data.mean_noise_span_length), T5's 0.15 and 3 where a config has neither."""
  density, mean = data_cfg.get("noise_density", 0.15), data_cfg.get("mean_noise_span_length", 3.0)
  if not 0 < density < 1 or mean < 1:
    raise DataError(f"data.noise_density={density} must be in (0, 1) and data.mean_noise_span_length={mean} >= 1")
  return density, mean


def target_length(data_cfg) -> int:
  """The decoder's length for this config: random_spans_helper's targets length."""
  return random_spans_helper(data_cfg.max_seq_length, *noise(data_cfg))[1]
