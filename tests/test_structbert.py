"""StructBERT (Wang et al. 2019): the trigram shuffle and the SSO rows checked row by row in NumPy, the
loss against a float64 NumPy computation, the pipeline's batches against the feature contract, and
`tiny` learning on the embedded corpus."""
import collections
import functools
import json
import os

import flax.linen as nn
import jax
import ml_collections
import numpy as np
import pytest

from bert_jax.cli import main
from bert_jax.config_utils import load_config
from bert_jax.data_pipelines import corpora, examples, features, pipeline
from bert_jax.data_pipelines.masking import MaskingConfig, mask_batch, row_keys
from bert_jax.data_pipelines.shuffling import PERMUTATIONS, shuffle_trigrams, trigram_slots
from bert_jax.models.bert import BertModel
from bert_jax.training import objectives, trainer
from core_helpers import slow

VOCAB, CLS, SEP, MASK = 5000, 2, 3, 4
SPECIAL = np.arange(VOCAB) < 5


def _rows(n, width, seed=0):
  """[CLS] A [SEP] B [SEP] rows of 12..width distinct tokens (a trigram's order is then visible)."""
  rng = np.random.default_rng(seed)
  ids, lengths = np.zeros((n, width), np.int32), np.zeros(n, np.int32)
  for i in range(n):
    length = int(rng.integers(12, width + 1))
    body = rng.choice(np.arange(5, VOCAB), length - 3, replace=False)
    cut = int(rng.integers(1, length - 3))
    ids[i, :length] = [CLS, *body[:cut], SEP, *body[cut:], SEP]
    lengths[i] = length
  return ids, lengths


def _shuffle(ids, lengths, rate, mask_rate=0.15):
  cfg = MaskingConfig("token", mask_rate, 20, MASK, SPECIAL, np.zeros(VOCAB, bool), rate)
  keys = row_keys((3,), np.zeros(len(ids)), np.arange(len(ids)))
  masked = mask_batch(ids, lengths, keys, cfg)
  out = shuffle_trigrams(ids, lengths, masked, keys, cfg)
  return {k: v.numpy() for k, v in masked.items()}, {k: v.numpy() for k, v in out.items()}


@pytest.fixture(scope="module")
def shuffled():
  ids, lengths = _rows(3000, 64)
  return ids, lengths, *_shuffle(ids, lengths, 0.05)


def test_shuffled_trigrams_row_by_row(shuffled):
  ids, lengths, masked, out = shuffled
  assert out["shuffled_positions"].shape == (len(ids), trigram_slots(64, 0.05)) == (len(ids), 6)
  permutations = collections.Counter()
  for r, length in enumerate(lengths):
    k = int(out["shuffled_weights"][r].sum())
    assert k % 3 == 0 and not out["shuffled_weights"][r, k:].any() and not out["shuffled_positions"][r, k:].any()
    positions = out["shuffled_positions"][r, :k]
    predicted = set(masked["masked_lm_positions"][r][masked["masked_lm_weights"][r] > 0])
    assert not predicted & set(positions)  # shuffled positions are never masked ones
    assert not SPECIAL[ids[r, positions]].any() and (positions < length).all()
    np.testing.assert_array_equal(out["shuffled_ids"][r, :k], ids[r, positions])  # labels: the originals
    moved = np.zeros(len(ids[r]), bool)
    moved[positions] = True
    np.testing.assert_array_equal(out["input_ids"][r, ~moved], masked["input_ids"][r, ~moved])
    for trigram in positions.reshape(-1, 3):
      assert list(trigram) == [trigram[0], trigram[0] + 1, trigram[0] + 2]
      before, after = list(ids[r, trigram]), list(out["input_ids"][r, trigram])
      permutation = tuple(before.index(token) for token in after)  # the tokens are distinct
      assert sorted(permutation) == [0, 1, 2] and permutation != (0, 1, 2)
      permutations[permutation] += 1
  # The five moving permutations, each 1/5 of the time (~1500 trigrams here: sd of a share ~0.01).
  assert set(permutations) == {tuple(p) for p in PERMUTATIONS}
  total = sum(permutations.values())
  assert all(abs(n / total - 0.2) < 0.03 for n in permutations.values()), permutations


def test_shuffle_rate_is_the_share_of_unmasked_trigrams(shuffled):
  ids, lengths, masked, out = shuffled
  free = 0
  for r, length in enumerate(lengths):
    predicted = set(masked["masked_lm_positions"][r][masked["masked_lm_weights"][r] > 0])
    free += sum(1 for p in range(length) if not SPECIAL[ids[r, p]] and p not in predicted)
  trigrams = out["shuffled_weights"].sum() / 3
  assert abs(trigrams / (free / 3) - 0.05) < 0.005, trigrams / (free / 3)
  # A higher rate on the same rows: still its share (rows have enough candidate windows for 20%).
  _, out = _shuffle(ids, lengths, 0.2)
  assert abs(out["shuffled_weights"].sum() / free - 0.2) < 0.01


def test_a_row_without_free_trigrams_is_left_alone():
  ids = np.pad(np.array([[CLS, 10, 11, SEP, 12, 13, SEP]], np.int32), [[0, 0], [0, 17]])
  masked, out = _shuffle(ids, np.array([7], np.int32), 0.5)
  assert not out["shuffled_weights"].any()
  np.testing.assert_array_equal(out["input_ids"], masked["input_ids"])


def _sso_rows(num_docs=1500, seed=0):
  """SSO rows of documents whose token t of document d is 100000 * d + t + 10 (no truncation: rows hold
  two whole documents), and a decoder back to (document, index in its token stream)."""
  rng = np.random.default_rng(seed)
  docs = []
  for d in range(num_docs):
    lengths = rng.integers(2, 8, size=int(rng.integers(1, 6)))
    starts = np.concatenate([[0], np.cumsum(lengths)])
    docs.append([[100000 * d + t + 10 for t in range(starts[s], starts[s + 1])] for s in range(len(lengths))])
  cfg = examples.BuilderConfig("sso", 128, CLS, SEP, short_seq_prob=0.0)
  return examples.build_rows(cfg, docs, np.random.default_rng(seed), corpora.Stats())


def _segments(row):
  first = row.ids.index(SEP)
  decode = lambda tokens: [((t - 10) // 100000, (t - 10) % 100000) for t in tokens]  # noqa: E731
  return decode(row.ids[1:first]), decode(row.ids[first + 1:-1])


def _run(tokens):
  """True when the tokens are consecutive tokens of one document."""
  return all(d == tokens[0][0] and t == tokens[0][1] + i for i, (d, t) in enumerate(tokens))


def test_sso_labels_next_previous_random_a_third_each():
  rows = _sso_rows()
  labels = collections.Counter(row.label for row in rows)
  assert set(labels) == {0, 1, 2}
  assert all(abs(labels[k] / len(rows) - 1 / 3) < 0.03 for k in range(3)), labels
  for row in rows:
    a, b = _segments(row)
    assert a and b and row.segment_ids == [0] * (len(a) + 2) + [1] * (len(b) + 1)
    if row.label == 0:  # B is the text right after A
      assert _run(a + b)
    elif row.label == 1:  # B is the text right before A
      assert _run(b + a)
    else:  # B from another document
      assert _run(a) and _run(b) and a[0][0] != b[0][0]


def test_sso_and_trigram_shuffling_are_refused_where_they_cannot_work(tmp_path, capsys):
  def error(*overrides, config="configs/structbert.py:tiny"):
    assert main(["pretrain", "--config", config, "--workdir", str(tmp_path), *overrides]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]
  assert "data.trigram_shuffle_rate in (0, 1)" in error("--config.data.trigram_shuffle_rate=1.0")
  assert "data.trigram_shuffle_rate in (0, 1)" in error("--config.data.trigram_shuffle_rate=0")
  assert "needs data.example_builder='sso'" in error("--config.data.example_builder=nsp")
  assert "model.sentence_head='none'" in error("--config.model.sentence_head=nsp")
  assert "model.use_pooler=True" in error("--config.model.use_pooler=False")
  assert "objective='bert' has no loss for" in error("--config.data.example_builder=sso", config="configs/bert.py:tiny")
  assert "objective='bert' has no loss for" in error("--config.data.trigram_shuffle_rate=0.05",
                                                     config="configs/bert.py:tiny")
  # A converted checkpoint's config (what `grow` reads) names neither key: plain BERT.
  converted = ml_collections.ConfigDict({"objective": "bert", "data": {"vocab": "vocab.txt"},
                                         "model": load_config("configs/bert.py:tiny").model.to_dict()})
  assert type(objectives.make_objective(converted)).__name__ == "BertPretraining"
  with pytest.raises(examples.DataError, match="data.packing=True"):
    examples.BuilderConfig("sso", 64, CLS, SEP, packing=True)
  with pytest.raises(examples.DataError, match=r"trigram_shuffle_rate=-0.1; use a fraction in \[0, 1\)"):
    MaskingConfig("token", 0.15, 20, MASK, SPECIAL, SPECIAL, -0.1)


def test_pipeline_batches_meet_the_feature_contract():
  config = load_config("configs/structbert.py:tiny", ["--config.data.max_seq_length=64",
                                                      "--config.data.shuffle_buffer=100"])
  data = pipeline.for_config(config, "train", 16)
  try:
    batches = [next(data) for _ in range(4)]
  finally:
    data.close()
  shapes = features.feature_shapes(config.data, 16)
  for batch in batches:
    assert {k: (str(v.dtype), v.shape) for k, v in batch.items()} == shapes
  assert shapes["shuffled_positions"] == ("int32", (16, 3 * 2))  # ceil(0.05 * 62 / 3) = 2 trigrams
  labels = np.concatenate([b["next_sentence_labels"] for b in batches])
  assert set(labels) == {0, 1, 2}
  assert sum(b["shuffled_weights"].sum() for b in batches) > 0


def _fixed_batch(rng, batch=4, seq=12, predictions=3, slots=3, vocab=40):
  lengths = np.array([12, 10, 8, 12])
  mask = (np.arange(seq)[None] < lengths[:, None]).astype(np.int32)
  return {"input_ids": (rng.integers(5, vocab, (batch, seq)) * mask).astype(np.int32), "input_mask": mask,
          "segment_ids": ((np.arange(seq)[None] >= 5) * mask).astype(np.int32),
          "masked_lm_positions": np.array([[1, 2, 7], [3, 4, 0], [1, 6, 0], [2, 8, 9]], np.int32),
          "masked_lm_ids": rng.integers(5, vocab, (batch, predictions)).astype(np.int32),
          "masked_lm_weights": np.array([[1, 1, 1], [1, 1, 0], [1, 1, 0], [1, 1, 1]], np.float32),
          "shuffled_positions": np.array([[3, 4, 5], [6, 7, 8], [0, 0, 0], [4, 5, 6]], np.int32),
          "shuffled_ids": rng.integers(5, vocab, (batch, slots)).astype(np.int32),
          "shuffled_weights": np.array([[1, 1, 1], [1, 1, 1], [0, 0, 0], [1, 1, 1]], np.float32),
          "next_sentence_labels": np.array([0, 2, 1, 2], np.int32)}


def _mean_nll(logits, labels, weights):
  z = np.asarray(logits, np.float64)
  lse = np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1)) + z.max(-1)
  nll = lse - np.take_along_axis(z, labels[..., None], -1)[..., 0]
  return (nll * weights).sum() / weights.sum()


def test_loss_matches_numpy_on_a_fixed_batch():
  config = load_config("configs/structbert.py:tiny", [
      "--config.model.vocab_size=40", "--config.model.hidden_size=16", "--config.model.num_heads=2",
      "--config.model.intermediate_size=32", "--config.model.num_layers=1",
      "--config.model.max_position_embeddings=16"])
  objective = objectives.make_objective(config)
  batch = _fixed_batch(np.random.default_rng(0))
  # Random weights of the init's shapes, large enough that every position and label moves the loss.
  rng = np.random.default_rng(1)
  params = jax.tree.map(lambda s: rng.normal(0, 0.5, s.shape).astype(s.dtype),
                        nn.meta.unbox(jax.eval_shape(objective.init, jax.random.key(1), batch)))
  sums = jax.jit(lambda p, b: objective.sums(p, b, None, True))(params, batch)
  counts = objective.counts(batch)
  metrics = objective.metrics(sums, counts)
  # Reference: the encoder's logits at every position, gathered and scored in float64 NumPy.
  encoder = {k: v for k, v in params.items() if k != "sso_head"}
  apply = jax.jit(functools.partial(BertModel(objective.config).apply, deterministic=True))
  out = apply({"params": encoder}, batch["input_ids"], batch["input_mask"], batch["segment_ids"])
  logits = np.asarray(out.mlm_logits)
  at = functools.partial(np.take_along_axis, logits, axis=1)
  mlm = _mean_nll(at(batch["masked_lm_positions"][..., None]), batch["masked_lm_ids"], batch["masked_lm_weights"])
  wso = _mean_nll(at(batch["shuffled_positions"][..., None]), batch["shuffled_ids"], batch["shuffled_weights"])
  head = params["sso_head"]
  sso_logits = np.asarray(out.pooled_output, np.float64) @ np.asarray(head["kernel"]) + np.asarray(head["bias"])
  sso = _mean_nll(sso_logits, batch["next_sentence_labels"], np.ones(4))
  np.testing.assert_allclose([metrics["mlm_loss"], metrics["wso_loss"], metrics["sso_loss"]], [mlm, wso, sso],
                             rtol=2e-5)
  np.testing.assert_allclose(objective.loss(sums, counts), mlm + wso + sso, rtol=2e-5)
  assert counts["wso"] == 9 and counts["mlm"] == 10
  assert metrics["sso_accuracy"] == np.mean(sso_logits.argmax(-1) == batch["next_sentence_labels"])


@slow  # an end-to-end chain; its parts are tested in the suite (BERT_JAX_SLOW_TESTS=1)
def test_tiny_learns_on_the_embedded_corpus(tmp_path):
  config = load_config("configs/structbert.py:tiny", [
      "--config.train.batch_size=16", "--config.data.max_seq_length=64", "--config.train.num_steps=20",
      "--config.train.log_every_steps=5", "--config.train.eval_every_steps=0",
      "--config.checkpoint.every_steps=1000", "--config.checkpoint.async_save=False",
      "--config.data.num_shards=4", "--config.data.shuffle_buffer=64", "--config.optimizer.warmup_steps=5",
      "--config.optimizer.learning_rate=2e-3"])
  trainer.pretrain(config, str(tmp_path))
  with open(os.path.join(tmp_path, "metrics.jsonl")) as f:
    rows = [r for r in map(json.loads, f) if "loss" in r]
  first, last = rows[0], rows[-1]
  assert {"mlm_loss", "wso_loss", "sso_loss", "wso_accuracy", "sso_accuracy"} <= set(last)
  assert last["loss"] < first["loss"] - 0.4, (first["loss"], last["loss"])
