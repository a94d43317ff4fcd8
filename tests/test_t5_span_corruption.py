"""T5's span corruption (data_pipelines/span_corruption.py; its streamed input: test_span_stream.py) against its definition
(t5.data.preprocessors: random_spans_helper, random_spans_noise_mask, noise_span_to_unique_sentinel)."""
from __future__ import annotations

import numpy as np
import optax
import pytest

from bert_jax.config_utils import load_config
from bert_jax.configs import t5 as t5_configs
from bert_jax.data_pipelines import span_corruption as sc
from bert_jax.models import families
from bert_jax.training import optim


def test_lengths_are_t5s():
  # T5's published pairs: 512 inputs <- 568 raw tokens with 114 targets; at density 0.5 targets match inputs.
  assert sc.random_spans_helper(512, 0.15, 3.0) == (568, 114)
  assert sc.random_spans_helper(626, 0.15, 3.0)[1] == 140
  tokens, targets = sc.random_spans_helper(128, 0.5, 3.0)
  assert targets <= 128


def _spans(mask):
  """(lengths of noise spans, lengths of non-noise spans, first is noise) of a bool mask."""
  edges = np.flatnonzero(np.diff(mask.astype(int))) + 1
  pieces = np.split(mask, edges)
  return [len(p) for p in pieces if p[0]], [len(p) for p in pieces if not p[0]], bool(mask[0])


def test_noise_mask_statistics_match_the_definition():
  rng = np.random.default_rng(0)
  noise_share, span_lengths = [], []
  for _ in range(400):
    mask = sc.random_spans_noise_mask(568, 0.15, 3.0, rng)
    noise, clean, starts_noisy = _spans(mask)
    # exactly round(568 * 0.15) = 85 noise tokens in round(85 / 3) = 28 spans, alternating, clean first, noise last
    assert mask.sum() == 85 and len(noise) == 28 and len(clean) == 28 and not starts_noisy and mask[-1]
    noise_share.append(mask.mean())
    span_lengths += noise
  assert abs(np.mean(noise_share) - 85 / 568) < 1e-12
  assert abs(np.mean(span_lengths) - 85 / 28) < 1e-9  # the mean span length is 85/28 ~ 3.04, T5's "3"
  # Uniform random segmentation: a span's length is 1 + Binomial-like; P(length 1) = C(83, 26) / C(84, 27) = 27/84
  share_one = np.mean(np.asarray(span_lengths) == 1)
  assert abs(share_one - 27 / 84) < 0.02


def test_sentinels_in_inputs_and_targets_as_t5_lays_them_out():
  tokens = np.arange(10, 30)
  mask = np.zeros(20, bool)
  mask[[3, 4, 9, 15, 16, 17]] = True
  top, eos = 199, 1
  inputs, targets = sc.corrupt(tokens, mask, top, eos)
  # <extra_id_0> = 199 replaces the first span, <extra_id_1> = 198 the second, ...
  assert inputs.tolist() == [10, 11, 12, 199, 15, 16, 17, 18, 198, 20, 21, 22, 23, 24, 197, 28, 29, 1]
  # T5's targets mark each non-noise span with a sentinel: a mask ending clean (random_spans_noise_mask's never
  # does) leaves a last sentinel with nothing after it.
  assert targets.tolist() == [199, 13, 14, 198, 19, 197, 25, 26, 27, 196, 1]
  # Putting the spans back where their sentinels are gives the text again.
  spans = {s: [] for s in (199, 198, 197, 196)}
  current = None
  for t in targets[:-1]:
    if t in spans:
      current = t
    else:
      spans[current].append(t)
  rebuilt = [x for t in inputs[:-1] for x in (spans[t] if t in spans else [t])]
  assert rebuilt == tokens.tolist()


def test_packing_with_segment_ids_and_shifted_decoder_inputs():
  a = (np.array([5, 6, 99, 1], np.int32), np.array([99, 7, 1], np.int32))
  b = (np.array([8, 99, 1], np.int32), np.array([99, 9, 10, 1], np.int32))
  row = sc.pack([a, b], 8, 8)
  assert row["encoder_input_tokens"].tolist() == [5, 6, 99, 1, 8, 99, 1, 0]
  assert row["encoder_segment_ids"].tolist() == [1, 1, 1, 1, 2, 2, 2, 0]
  assert row["decoder_target_tokens"].tolist() == [99, 7, 1, 99, 9, 10, 1, 0]
  assert row["decoder_input_tokens"].tolist() == [0, 99, 7, 0, 99, 9, 10, 0]
  assert row["decoder_segment_ids"].tolist() == [1, 1, 1, 2, 2, 2, 2, 0]
  assert row["decoder_loss_weights"].tolist() == [1, 1, 1, 1, 1, 1, 1, 0]


def test_inverse_sqrt_schedule_and_adafactor_step():
  schedule = optim.inverse_sqrt(0.01, 10_000)
  assert float(schedule(0)) == pytest.approx(0.01) and float(schedule(10_000)) == pytest.approx(0.01)
  assert float(schedule(40_000)) == pytest.approx(1 / np.sqrt(40_000))  # T5's 1/sqrt(max(step, 10^4))
  # One Adafactor step equals optax's own (T5's settings), through bert_jax's wrapper.
  params = {"w": np.ones((3, 4), np.float32)}
  grads = {"w": np.arange(12, dtype=np.float32).reshape(3, 4) / 10}
  ours = optim.adafactor(0.01)
  theirs = optax.adafactor(0.01, decay_rate=0.8, clipping_threshold=1.0, multiply_by_parameter_scale=True)
  u1, _ = ours.update(grads, ours.init(params), params)
  u2, _ = theirs.update(grads, theirs.init(params), params)
  np.testing.assert_allclose(np.asarray(u1["w"]), np.asarray(u2["w"]), rtol=1e-6)


@pytest.mark.parametrize("size,published", [("small", 77e6), ("base", 248e6), ("large", 783e6)])
def test_presets_have_the_published_sizes(size, published):
  config = t5_configs.get_config(size)
  count = families.get("t5").backbone_params(config.model.to_dict())
  assert abs(count / published - 1) < 0.04, count


def test_tiny_config_loads_with_the_span_builder():
  config = load_config("configs/t5.py:tiny", [])
  assert config.objective == "span_corruption" and config.data.tokenizer == "t5_spm"
  assert config.optimizer.name == "adafactor" and config.optimizer.decay == "rsqrt"
