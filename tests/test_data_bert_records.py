"""data.format=bert_tfrecord: create_pretraining_data.py records, static masks, fresh masks, resume, bad records."""
import os

import numpy as np
import pytest

import data_fixtures
from bert_jax.configs import common
from bert_jax.data_pipelines import tftools
from bert_jax.data_pipelines.errors import DataError
from bert_jax.data_pipelines.pipeline import make_pretrain_input

tf = tftools.tf()  # TensorFlow without Keras, as bert_jax imports it

RECORD_LENGTH, RECORD_SLOTS, VOCAB_SIZE = 32, 5, 7716  # the embedded vocabulary
CLS, SEP, MASK = 2, 3, 4


def _record(rng, length=RECORD_LENGTH, slots=RECORD_SLOTS, top=VOCAB_SIZE, drop=None):
  """One record as create_pretraining_data.py writes it: masked ids, zero padding, sorted predictions."""
  n = int(rng.integers(12, length + 1))
  cut = int(rng.integers(2, n - 3))
  ids = np.concatenate([[CLS], rng.integers(5, top, n - 3), [SEP], rng.integers(5, top, 0), [SEP]])
  ids = np.concatenate([ids[:cut], [SEP], ids[cut:]])[:n]
  ids[-1] = SEP
  segments = (np.arange(n) > cut).astype(int)
  positions = np.sort(rng.choice(np.arange(1, cut), size=min(slots, cut - 1), replace=False))
  labels = ids[positions].copy()
  masked = ids.copy()
  masked[positions] = MASK
  pad = lambda v, k: list(np.pad(v, (0, k - len(v))).astype(int))  # noqa: E731
  feature = {
      "input_ids": pad(masked, length), "input_mask": pad(np.ones(n), length), "segment_ids": pad(segments, length),
      "masked_lm_positions": pad(positions, slots), "masked_lm_ids": pad(labels, slots),
      "next_sentence_labels": [int(rng.integers(2))]}
  example = {k: tf.train.Feature(int64_list=tf.train.Int64List(value=v)) for k, v in feature.items()}
  example["masked_lm_weights"] = tf.train.Feature(float_list=tf.train.FloatList(
      value=pad(np.ones(len(positions)), slots)))
  if drop:
    del example[drop]
  return tf.train.Example(features=tf.train.Features(feature=example)).SerializeToString()


def _write(directory, num_files=4, per_file=40, seed=0, **kw):
  rng = np.random.default_rng(seed)
  records = []
  for f in range(num_files):
    with tf.io.TFRecordWriter(str(directory / f"part-{f}.tfrecord")) as writer:
      for _ in range(per_file):
        records.append(_record(rng, **kw))
        writer.write(records[-1])
  return str(directory / "*.tfrecord"), [tf.train.Example.FromString(r).features.feature for r in records]


def _cfg(glob, **kw):
  kw.setdefault("num_shards", 4)
  return common.data_config(format="bert_tfrecord", corpus=glob, vocab=data_fixtures.embedded_paths()[1],
                            max_seq_length=48, max_predictions_per_seq=8, seed=1, **kw)


def _input(cfg, **kw):
  return make_pretrain_input(cfg, global_batch_size=16, process_index=0, process_count=1, **kw)


def _key(ids, length):
  return tuple(int(i) for i in ids[:length])


@pytest.fixture(scope="module")
def records(tmp_path_factory):
  return _write(tmp_path_factory.mktemp("records"))


def test_static_masks_are_the_records(records):
  glob, examples = records
  by_ids = {_key(e["input_ids"].int64_list.value, int(sum(e["input_mask"].int64_list.value))): e for e in examples}
  data = _input(_cfg(glob, masking_mode="static"))
  seen = set()
  for _ in range(12):  # 192 rows: more than the 160 records, so the next epoch starts
    batch = next(data)
    assert batch["input_ids"].shape == (16, 48) and batch["masked_lm_ids"].shape == (16, 8)
    for r in range(16):
      length = int(batch["input_mask"][r].sum())
      e = by_ids[_key(batch["input_ids"][r], length)]  # the record itself, padded from 32 to 48
      k = len(e["masked_lm_ids"].int64_list.value)
      assert list(batch["masked_lm_ids"][r, :k]) == list(e["masked_lm_ids"].int64_list.value)
      assert list(batch["masked_lm_positions"][r, :k]) == list(e["masked_lm_positions"].int64_list.value)
      assert batch["next_sentence_labels"][r] == e["next_sentence_labels"].int64_list.value[0]
      assert not batch["input_ids"][r, length:].any()
      seen.add(_key(batch["input_ids"][r], length))
  assert len(seen) == len(examples)  # an epoch covers every record once


def _restored(batch, r):
  ids = batch["input_ids"][r].copy()
  w = batch["masked_lm_weights"][r] > 0
  ids[batch["masked_lm_positions"][r][w]] = batch["masked_lm_ids"][r][w]
  return _key(ids, int(batch["input_mask"][r].sum()))


def test_dynamic_masking_restores_and_masks_afresh(records, tmp_path):
  glob, examples = records
  originals = set()
  for e in examples:
    ids = np.array(e["input_ids"].int64_list.value)
    w = np.array(e["masked_lm_weights"].float_list.value) > 0
    ids[np.array(e["masked_lm_positions"].int64_list.value)[w]] = np.array(e["masked_lm_ids"].int64_list.value)[w]
    originals.add(_key(ids, int(sum(e["input_mask"].int64_list.value))))
  cfg = _cfg(glob)
  data = _input(cfg)
  batches = [next(data) for _ in range(14)]
  predicted = real = 0
  for batch in batches:
    for r in range(16):
      assert _restored(batch, r) in originals
    predicted += batch["masked_lm_weights"].sum()
    real += (batch["input_mask"].sum(1) - 3).sum()
  assert abs(predicted / real - 0.15) < 0.02
  # Epoch 2 sees the same records with other masks.
  first_epoch = {_restored(batches[0], r): batches[0]["masked_lm_positions"][r].tolist() for r in range(16)}
  later = {_restored(b, r): b["masked_lm_positions"][r].tolist() for b in batches[10:] for r in range(16)}
  common_rows = set(first_epoch) & set(later)
  assert common_rows and any(first_epoch[k] != later[k] for k in common_rows)
  # Resume: save after 3 batches, restore on two hosts.
  first = _input(cfg)
  for _ in range(3):
    next(first)
  first.save(str(tmp_path))
  hosts = [make_pretrain_input(cfg, global_batch_size=16, process_index=i, process_count=2) for i in range(2)]
  for h in hosts:
    h.restore(str(tmp_path))
  for want in batches[3:12]:
    got = [next(h) for h in hosts]
    for k in want:
      assert np.array_equal(want[k], np.concatenate([g[k] for g in got])), k


def test_bad_records_are_one_line_errors(tmp_path):
  cases = {"long": ({"length": 64}, "exceed data.max_seq_length=48"),
           "missing": ({"drop": "segment_ids"}, "lack segment_ids"),
           "vocab": ({"top": 9000}, "outside the vocabulary")}
  for name, (kw, message) in cases.items():
    (tmp_path / name).mkdir()
    glob, _ = _write(tmp_path / name, num_files=1, per_file=3, **kw)
    with pytest.raises(DataError, match=message):
      _input(_cfg(glob, num_shards=1))
  corrupt = tmp_path / "corrupt"
  corrupt.mkdir()
  (corrupt / "x.tfrecord").write_bytes(b"this is not a tfrecord file at all" * 4)
  with pytest.raises(DataError, match="x.tfrecord: not a readable TFRecord"):
    _input(_cfg(str(corrupt / "*.tfrecord"), num_shards=1))
  few = tmp_path / "few"
  few.mkdir()
  glob, _ = _write(few, num_files=1, per_file=3)
  with pytest.raises(DataError, match="3 records for data.num_shards=4, so this host's shards 0..3 get not all"):
    _input(_cfg(glob, num_shards=4))
  with pytest.raises(DataError, match="shards 6..7 get none; lower data.num_shards to at most 3"):
    make_pretrain_input(_cfg(glob, num_shards=8), global_batch_size=16, process_index=3, process_count=4)


def test_a_short_pretraining_run_reads_them(records, tmp_path):
  from bert_jax.training import trainer
  glob, _ = records
  config = trainer.load_run_config("configs/bert.py:demo", [
      "--config.data.format=bert_tfrecord", f"--config.data.corpus={glob}", "--config.data.max_seq_length=32",
      "--config.data.max_predictions_per_seq=5", "--config.data.num_shards=4", "--config.train.batch_size=8",
      "--config.train.num_steps=3", "--config.train.eval_every_steps=0", "--config.train.log_every_steps=1",
      "--config.model.num_layers=1", "--config.model.hidden_size=32", "--config.model.num_heads=2",
      "--config.model.intermediate_size=64", "--config.train.tensorboard=false"])
  result = trainer.pretrain(config, str(tmp_path / "run"))
  assert result["step"] == 3 and np.isfinite(result["train"]["loss"]) and result["train"]["loss"] > 5
  assert os.path.exists(tmp_path / "run" / "checkpoints" / "3" / "data" / "data_state.process00000.json")


def test_a_truncated_file_is_named_with_its_bytes(tmp_path):
  """TensorFlow says only "truncated record at <byte>"; the error names the file, the bytes the record needs
  and those left, and what the run does."""
  _write(tmp_path, num_files=1, per_file=40)
  path = tmp_path / "part-0.tfrecord"
  data, sizes, offset = path.read_bytes(), [], 0
  while offset < len(data):  # each record: u64 length, u32 crc, payload, u32 crc
    sizes.append(16 + int.from_bytes(data[offset:offset + 8], "little"))
    offset += sizes[-1]
  start = sum(sizes[:20])
  path.write_bytes(data[:start + 40])
  inputs = _input(_cfg(str(path), num_shards=1))
  next(inputs)  # records 0..15
  with pytest.raises(DataError) as info:
    next(inputs)
  assert str(info.value) == (
      f"{path} is truncated: its record at byte {start:,} needs {sizes[20]:,} bytes, the file holds 40 more (a "
      "copy or a write that was cut short); the run stops here (the checkpoints it saved are intact): write the "
      "file again (`bert-jax data prepare --format bert_tfrecord`) or leave it out of data.corpus, and rerun to "
      "resume")
