"""Masking statistics over thousands of rows, against the numbers the papers state."""
import numpy as np
import pytest

from bert_jax.data_pipelines.errors import DataError
from bert_jax.data_pipelines.masking import MaskingConfig, mask_batch, row_keys

VOCAB = 1000
CLS, SEP, MASK, PAD = 2, 3, 4, 0
SPECIAL = np.arange(VOCAB) < 5
CONTINUATION = np.arange(VOCAB) >= 600  # ids 600.. play the role of "##piece"


def _config(strategy, max_predictions=20, rate=0.15, mask_id=MASK):
  return MaskingConfig(strategy, rate, max_predictions, mask_id, SPECIAL, CONTINUATION)


def _rows(n, length, seed=0):
  rng = np.random.default_rng(seed)
  rows = []
  for _ in range(n):
    body = rng.integers(5, VOCAB, size=length - 3).astype(np.int32)
    cut = int(rng.integers(1, length - 4))
    rows.append(np.concatenate([[CLS], body[:cut], [SEP], body[cut:], [SEP]]).astype(np.int32))
  return rows


class Masked:
  """One row's result, unpadded (the per-row view the statistics below read)."""

  def __init__(self, out, r, length):
    k = int(out["masked_lm_weights"][r].sum())
    self.input_ids = out["input_ids"][r, :length]
    self.positions = out["masked_lm_positions"][r, :k]
    self.labels = out["masked_lm_ids"][r, :k]
    self.span_left = out["masked_lm_span_left"][r, :k]
    self.span_right = out["masked_lm_span_right"][r, :k]
    self.span_offset = out["masked_lm_span_offset"][r, :k]


def _mask(rows, cfg, seed=7):
  width = max(len(r) for r in rows)
  ids = np.stack([np.pad(r, (0, width - len(r))) for r in rows])
  lengths = np.array([len(r) for r in rows], np.int32)
  keys = row_keys((seed,), np.zeros(len(rows)), np.arange(len(rows)))
  out = {k: v.numpy() for k, v in mask_batch(ids, lengths, keys, cfg).items()}
  return [Masked(out, r, len(row)) for r, row in enumerate(rows)]


def _mask_all(strategy, n=2000, length=128, **kw):
  rows = _rows(n, length)
  return list(zip(rows, _mask(rows, _config(strategy, **kw))))


@pytest.fixture(scope="module")
def token_masked():
  return _mask_all("token", max_predictions=128)


def test_rate_is_fifteen_percent_of_real_tokens(token_masked):
  predicted = sum(len(m.positions) for _, m in token_masked)
  candidates = sum(len(row) - 3 for row, _ in token_masked)
  assert abs(predicted / candidates - 0.15) < 0.005


def test_eighty_ten_ten(token_masked):
  replaced = np.concatenate([m.input_ids[m.positions] for _, m in token_masked])
  labels = np.concatenate([m.labels for _, m in token_masked])
  n = len(labels)
  assert abs((replaced == MASK).sum() / n - 0.8) < 0.015
  assert abs((replaced == labels).sum() / n - 0.1) < 0.01
  other = (replaced != MASK) & (replaced != labels)
  assert abs(other.sum() / n - 0.1) < 0.01
  assert not SPECIAL[replaced[other]].any()  # random replacements are never special tokens


@pytest.mark.parametrize("strategy", ["token", "whole_word", "ngram", "span"])
def test_never_specials_and_budget(strategy):
  for row, m in _mask_all(strategy, n=300):
    assert not SPECIAL[row[m.positions]].any()
    assert 1 <= len(m.positions) <= 20
    assert np.all(np.diff(m.positions) > 0)
    assert np.array_equal(m.labels, row[m.positions])
    untouched = np.setdiff1d(np.arange(len(row)), m.positions)
    assert np.array_equal(m.input_ids[untouched], row[untouched])


def _words(row):
  """[(start, end)] of whole words: a non-continuation piece plus following continuations."""
  starts = [i for i in range(len(row)) if not SPECIAL[row[i]] and (not CONTINUATION[row[i]] or SPECIAL[row[i - 1]])]
  words = []
  for s in starts:
    e = s + 1
    while e < len(row) and CONTINUATION[row[e]] and not SPECIAL[row[e]]:
      e += 1
    words.append((s, e))
  return words


@pytest.mark.parametrize("strategy", ["whole_word", "ngram", "span"])
def test_whole_words_masked_together(strategy):
  for row, m in _mask_all(strategy, n=300):
    masked = set(m.positions.tolist())
    for s, e in _words(row):
      inside = [p in masked for p in range(s, e)]
      assert all(inside) or not any(inside), (strategy, row[s:e])


def _span_lengths_in_words(row, m):
  word_starts = {s for s, _ in _words(row)}
  lengths = {}
  for p, left, right in zip(m.positions, m.span_left, m.span_right):
    lengths[(left, right)] = lengths.get((left, right), 0) + (p in word_starts)
  return list(lengths.values())


def test_spanbert_mean_span_length():
  """Geometric(p=0.2) truncated to 1..10 words has mean 3.8 (SpanBERT, section 3.1)."""
  lengths = []
  for row, m in _mask_all("span", n=400, length=512, max_predictions=512):
    lengths.extend(_span_lengths_in_words(row, m))
    starts = m.span_left + 1
    assert np.array_equal(m.positions - starts, m.span_offset)
  assert abs(np.mean(lengths) - 3.8) < 0.25, np.mean(lengths)
  assert max(lengths) <= 10


def test_ngram_lengths_follow_one_over_n():
  lengths = []
  for row, m in _mask_all("ngram", n=600, length=512, max_predictions=512):
    lengths.extend(_span_lengths_in_words(row, m))
  freq = np.bincount(lengths, minlength=4)[1:4] / len(lengths)
  assert np.allclose(freq, np.array([6, 3, 2]) / 11, atol=0.04), freq


def test_fresh_masks_per_seed_and_bad_config():
  rows = _rows(1, 128)
  a, = _mask(rows, _config("token"), seed=1)
  b, = _mask(rows, _config("token"), seed=2)
  assert not np.array_equal(a.positions, b.positions)
  with pytest.raises(DataError, match="data.masking"):
    _config("random_words")
  with pytest.raises(DataError, match="data.mask_rate"):
    _config("token", rate=1.5)


def test_a_rows_mask_depends_on_its_key_only():
  rows = _rows(6, 128)
  alone, = _mask(rows[3:4], _config("span"))
  keys = row_keys((7,), np.zeros(1), np.array([3]))
  out = mask_batch(np.stack(rows[3:4]), np.array([128], np.int32), keys, _config("span"))
  together = _mask(rows, _config("span"))[3]
  assert np.array_equal(out["masked_lm_positions"].numpy()[0, :len(together.positions)], together.positions)
  assert not np.array_equal(alone.positions, together.positions)  # key 0 vs key 3


@pytest.mark.parametrize("strategy", ["token", "whole_word", "ngram", "span"])
def test_short_rows_hold_the_rate(strategy):
  """#16 item 9: on rows of 12-40 tokens the last span is cut to the budget, as SpanBERT does (14-16%)."""
  rng = np.random.default_rng(3)
  rows = [r for n in rng.integers(12, 41, size=3000) for r in _rows(1, int(n), seed=int(rng.integers(1 << 30)))]
  masked = _mask(rows, _config(strategy))
  rate = sum(len(m.positions) for m in masked) / sum(len(r) - 3 for r in rows)
  assert 0.14 <= rate <= 0.16, rate


def test_unk_replaces_mask_in_the_eighty_percent_branch():
  unk = 1
  masked = _mask(_rows(500, 128), _config("token", mask_id=unk))
  replaced = np.concatenate([m.input_ids[m.positions] for m in masked])
  assert abs((replaced == unk).mean() - 0.8) < 0.02 and not (replaced == MASK).any()


@pytest.mark.parametrize("strategy", ["whole_word", "span"])
def test_short_rows_masked_cut_to_a_narrower_width_give_the_same_masks(strategy):
  """mask_batch masks rows of <= T/8 (T/4) tokens cut to T/8 (T/4) wide: every output equals masking the batch
  whole."""
  from bert_jax.data_pipelines.masking import _mask_rows  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(5)
  rows = [r for n in (12, 40, 128, 129, 300, 512, 20, 127) for r in _rows(1, n, seed=int(rng.integers(1 << 30)))]
  ids = np.stack([np.pad(r, (0, 512 - len(r))) for r in rows])
  lengths = np.array([len(r) for r in rows], np.int32)
  keys = row_keys((7,), np.zeros(len(rows)), np.arange(len(rows)))
  cfg = _config(strategy, max_predictions=76)
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  rates = tf.fill([len(rows)], tf.constant(cfg.rate, tf.float64))  # what mask_batch fills in for rates=None
  split, whole = mask_batch(ids, lengths, keys, cfg), _mask_rows(ids, lengths, keys, cfg, None, rates)
  assert split.keys() == whole.keys()
  for name in whole:
    assert np.array_equal(split[name].numpy(), whole[name].numpy()), name
  assert whole["masked_lm_weights"].numpy().sum(1).min() >= 1


def _np_uniform(key, stream, counter):
  """masking.uniform for one row key, in NumPy."""
  def mix(x):
    x = np.uint32(x)
    x = (x ^ (x >> np.uint32(16))) * np.uint32(0x85EBCA6B)
    x = (x ^ (x >> np.uint32(13))) * np.uint32(0xC2B2AE35)
    return x ^ (x >> np.uint32(16))
  with np.errstate(over="ignore"):
    k = mix(np.uint32(key) ^ np.uint32(stream * 0x9E3779B9 & 0xFFFFFFFF))
    return float(mix(k ^ mix(np.uint32(counter) + np.uint32(0x6A09E667)))) / 2.0 ** 32


def _reference_spans(row, length, key, budget, lengths_p):
  """SpanBERT's sampler as the masking module's docstring states it, one row in plain Python: [(first, end)]."""
  units = []  # [start, end) tokens of whole words, and the run (stretch between special tokens) each is in
  run = 0
  for p in range(length):
    if SPECIAL[row[p]]:
      run += 1
    elif CONTINUATION[row[p]] and units and units[-1][1] == p and units[-1][2] == run:
      units[-1][1] = p + 1
    else:
      units.append([p, p + 1, run])
  blocked, spans, used = [False] * len(units), [], 0
  cdf = np.cumsum(lengths_p)[:-1]
  for i in range(len(units) + 1):
    free = [0] * len(units)
    for k in range(len(units) - 1, -1, -1):
      if not blocked[k]:
        free[k] = 1 + (free[k + 1] if k + 1 < len(units) and units[k + 1][2] == units[k][2] else 0)
    if used >= budget or max(free, default=0) == 0:
      break
    size = min(1 + int((_np_uniform(key, 2, i) >= cdf).sum()), max(free))
    fits = [k for k in range(len(units)) if free[k] >= size]
    first = fits[int(_np_uniform(key, 3, i) * len(fits))]
    take = 0
    while take < size and used + units[first + take][1] - units[first][0] <= budget:
      take += 1
    for k in range(first, first + max(take, 1)):
      blocked[k] = True
    if take:
      spans.append((units[first][0], units[first + take - 1][1]))
      used += units[first + take - 1][1] - units[first][0]
  return spans


@pytest.mark.parametrize("width,slots", [(128, 20), (512, 76)])
def test_span_masks_equal_a_per_row_python_sampler(width, slots):
  """Every row's spans (positions, left and right ends) are the ones a plain per-row loop of the documented
  algorithm draws from the same hashes: pins the vectorized sampler exactly, not only its statistics."""
  rng = np.random.default_rng(11)
  rows = [r for n in (14, 60, 100, width, 70, width // 2) for r in _rows(1, n, seed=int(rng.integers(1 << 30)))]
  rows[2][40:42] = SEP  # a run break inside a row
  ids = np.stack([np.pad(r, (0, width - len(r))) for r in rows])
  lengths = np.array([len(r) for r in rows], np.int32)
  keys = row_keys((3,), np.zeros(len(rows)), np.arange(len(rows)))
  cfg = _config("span", max_predictions=slots)
  out = {k: v.numpy() for k, v in mask_batch(ids, lengths, keys, cfg).items()}
  for r, row in enumerate(rows):
    candidates = int((~SPECIAL[row]).sum())
    budget = min(slots, max(1, int(np.round(candidates * cfg.rate))))
    spans = _reference_spans(row, len(row), int(keys.numpy()[r]), budget, cfg.lengths)
    expected = sorted((p, lo - 1, hi) for lo, hi in spans for p in range(lo, hi))
    k = int(out["masked_lm_weights"][r].sum())
    got = list(zip(out["masked_lm_positions"][r, :k], out["masked_lm_span_left"][r, :k],
                   out["masked_lm_span_right"][r, :k]))
    assert got == expected, r


def test_masked_positions_follow_the_rate_at_any_length(capsys):
  """data.max_predictions_per_seq=0 (the default) is ceil(rate * length): a preset taken to another length or rate
  masks the rate it asks for (ModernBERT's 30% at 512 tokens: 40 positions gave 7.8%); a preset's own number
  (ALBERT's 20 at 512) stands, but with the length or rate overridden under it, a number that cuts the rate is
  one line; a number set on the command line is taken when within 10% (BERT's 76 at 512 tokens)."""
  from ml_collections import ConfigDict
  from bert_jax import cli
  from bert_jax.config_utils import load_config
  from bert_jax.data_pipelines.masking import predictions_per_seq

  def predictions(spec, *overrides):
    return load_config(spec, [f"--config.data.{o}" for o in overrides]).data.max_predictions_per_seq

  assert predictions("configs/bert.py:base") == 20 and predictions("configs/bert.py:demo") == 10
  assert predictions("configs/bert.py:base", "max_seq_length=512") == 77
  assert predictions("configs/bert.py:base", "mask_rate=0.3") == 39
  assert predictions("configs/bert.py:large", "max_seq_length=512", "max_predictions_per_seq=76") == 76
  assert predictions("configs/modernbert.py:base") == 308
  assert predictions("configs/modernbert.py:base", "max_seq_length=8192") == 2458
  assert predictions("configs/modernbert.py:tiny", "max_seq_length=512") == 154
  assert predictions("configs/modernbert.py:tiny", "max_seq_length=256", "max_predictions_per_seq=8") == 8
  assert predictions("configs/albert.py:base") == 20
  assert predictions("configs/xlnet.py:base", "max_seq_length=1024") == 85  # XLNet: max_seq_length // 6, set
  assert cli.main(["config", "show", "--config", "configs/albert.py:base", "--config.data.max_seq_length=1024"]) == 2
  assert capsys.readouterr().err.strip() == (
      "bert-jax config: error: data.max_predictions_per_seq=20 caps data.mask_rate 0.15 at 1024 tokens to 2.0%; "
      "set it >= ceil(0.15*1024)=154, or to 0: derived from the rate")
  # what the derived number gives a full row of 512 tokens at 30%: the rate, not 40 positions
  data = ConfigDict({"mask_rate": 0.3, "max_seq_length": 512, "max_predictions_per_seq": 0})
  [masked] = _mask(_rows(1, 512), _config("token", max_predictions=predictions_per_seq(data), rate=0.3))
  assert len(masked.positions) == round(0.3 * 509)
