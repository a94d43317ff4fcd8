"""`bert-jax data prepare --format bert_tfrecord`: a config's rows as create_pretraining_data.py records, read back
by data.format=bert_tfrecord as the very batches data.format=text gives in the rows' first epoch."""
import json

import numpy as np
import pytest

import data_fixtures
from bert_jax.cli import main
from bert_jax.configs import common
from bert_jax.data_pipelines import tftools
from bert_jax.data_pipelines.errors import DataError
from bert_jax.data_pipelines.pipeline import make_pretrain_input

tf = tftools.tf()  # TensorFlow without Keras, as bert_jax imports it

BATCH, SHARDS = 16, 4


def _cfg(**kw):
  base = dict(corpus=kw.pop("corpus"), vocab=data_fixtures.embedded_paths()[1], max_seq_length=48,
              max_predictions_per_seq=8, num_shards=SHARDS, seed=3, shuffle_buffer=20, eval_fraction=0.0)
  return common.data_config(**{**base, **kw})


def _batches(cfg, n):
  data = make_pretrain_input(cfg, global_batch_size=BATCH, process_index=0, process_count=1)
  try:
    return [next(data) for _ in range(n)]
  finally:
    data.close()


def _prepare(corpus, out, **kw):
  overrides = [f"--config.data.{k}={v}" for k, v in dict(
      corpus=corpus, vocab=data_fixtures.embedded_paths()[1], max_seq_length=48, max_predictions_per_seq=8,
      num_shards=SHARDS, seed=3, shuffle_buffer=20, eval_fraction=0.0, **kw).items()]
  assert main(["data", "prepare", "--format", "bert_tfrecord", "--config", "configs/bert.py:demo", "--output",
               str(out), "--epochs", "2", "--workers", "1", *overrides]) == 0
  return json.loads((out / "metadata.json").read_text())


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
  corpus = data_fixtures.write_corpus(tmp_path_factory.mktemp("corpus"), num_docs=24, sentences_per_doc=5)
  out = tmp_path_factory.mktemp("rows")
  return corpus, out, _prepare(corpus, out)


def test_records_have_the_original_format_and_one_file_per_shard(prepared):
  _, out, metadata = prepared
  files = sorted(out.glob("*.tfrecord"))
  assert [f.name for f in files] == [f"part-{s:05d}-of-{SHARDS:05d}.tfrecord" for s in range(SHARDS)]
  assert not list(out.glob("*.tmp"))
  assert metadata["rows"] == sum(metadata["rows_per_file"].values()) > 0 and metadata["epochs"] == 2
  example = tf.train.Example.FromString(next(iter(tf.data.TFRecordDataset(str(files[0])))).numpy())
  feature = example.features.feature
  assert {k: len(getattr(v, v.WhichOneof("kind")).value) for k, v in feature.items()} == {
      "input_ids": 48, "input_mask": 48, "segment_ids": 48, "masked_lm_positions": 8, "masked_lm_ids": 8,
      "masked_lm_weights": 8, "next_sentence_labels": 1}


@pytest.mark.parametrize("masking_mode", ["static", "dynamic"])
def test_records_read_back_as_the_text_pipelines_batches(prepared, masking_mode):
  """Static: the records' masks are the text pipeline's epoch-0 masks. Dynamic: restored and masked afresh with
  the key of (seed, shard, epoch, row), which in epoch 0 is again the text pipeline's mask."""
  corpus, out, metadata = prepared
  text = _batches(_cfg(corpus=corpus), 3)
  records = _batches(_cfg(corpus=str(out / "*.tfrecord"), format="bert_tfrecord", masking_mode=masking_mode), 3)
  for a, b in zip(text, records):
    assert set(a) == set(b)
    for name in a:
      np.testing.assert_array_equal(a[name], b[name], err_msg=name)
  real = sum(int(b["input_mask"].sum()) for b in text)
  assert 0.10 < sum(float(b["masked_lm_weights"].sum()) for b in text) / real < 0.2


def test_packed_rows_keep_their_document_ids(prepared, tmp_path):
  corpus, _, _ = prepared
  packing = dict(packing=True, example_builder="doc_sentences")
  _prepare(corpus, tmp_path, **packing)
  text = _batches(_cfg(corpus=corpus, **packing), 2)
  records = _batches(_cfg(corpus=str(tmp_path / "*.tfrecord"), format="bert_tfrecord", **packing), 2)
  assert text[0]["document_ids"].max() > 1  # rows do hold several documents
  with pytest.raises(DataError, match="records lack document_ids, which data.packing needs"):
    _batches(_cfg(corpus=str(prepared[1] / "*.tfrecord"), format="bert_tfrecord", **packing), 1)
  for a, b in zip(text, records):
    assert set(a) == set(b) and "position_ids" in a
    for name in a:
      np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_bad_requests_are_one_line(capsys, tmp_path):
  assert main(["data", "prepare", "--format", "bert_tfrecord", "--output", str(tmp_path / "o")]) == 2
  assert "--config" in capsys.readouterr().err
  assert main(["data", "prepare", "--format", "bert_tfrecord", "--config", "configs/bert.py:demo",
               "--output", str(tmp_path / "o"), "--config.data.trigram_shuffle_rate=0.05"]) == 2
  err = capsys.readouterr().err.strip()
  assert "trigrams" in err and len(err.splitlines()) == 1
  assert not (tmp_path / "o").exists()
