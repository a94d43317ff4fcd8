"""The pretraining input: contract, sentence objectives, packing, host sharding, resume, prepared records, bad input."""
import os

import numpy as np
import pytest

import data_fixtures
from bert_jax.configs import common
from bert_jax.data_pipelines import corpora, features, prepare, shards
from bert_jax.data_pipelines.errors import DataError
from bert_jax.data_pipelines.examples import Row
from bert_jax.data_pipelines.pipeline import make_pretrain_input
from bert_jax.data_pipelines.tftools import tf

BATCH = 16


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  return data_fixtures.write_corpus(str(tmp_path_factory.mktemp("corpus")), num_docs=80, num_files=8)


def _cfg(corpus, **kw):
  kw.setdefault("vocab", data_fixtures.embedded_paths()[1])
  kw.setdefault("max_seq_length", 64)
  kw.setdefault("max_predictions_per_seq", 10)
  kw.setdefault("num_shards", 4)
  kw.setdefault("shuffle_buffer", 16)
  kw.setdefault("seed", 3)
  return common.data_config(corpus=corpus, **kw)


def _batches(cfg, n, process_count=1, batch=BATCH, split="train", **kw):
  inputs = [make_pretrain_input(cfg, global_batch_size=batch, process_index=i, process_count=process_count,
                                split=split, **kw) for i in range(process_count)]
  return [{k: np.concatenate([next_batch[k] for next_batch in step]) for k in step[0]}
          for step in ([next(x) for x in inputs] for _ in range(n))]


def test_contract_shapes_and_dtypes(corpus):
  for kw in ({}, {"masking": "span"}, {"packing": True, "example_builder": "doc_sentences"},
             {"trigram_shuffle_rate": 0.05, "example_builder": "sso"}):
    cfg = _cfg(corpus, **kw)
    batch = _batches(cfg, 1)[0]
    spec = features.feature_spec(cfg)
    assert set(batch) == set(spec)
    sizes = {"B": BATCH, "T": 64, "P": 10, "S": 6}  # S: 3 x ceil(0.05 x 62 / 3) shuffled positions
    for name, (dtype, dims, _) in spec.items():
      assert batch[name].dtype == np.dtype(dtype), name
      assert batch[name].shape == tuple(sizes[d] for d in dims), name
    mask = batch["input_mask"]
    assert np.all(batch["input_ids"][mask == 0] == 0)
    assert np.all(np.diff(mask, axis=1) <= 0)  # real tokens first, then padding
    assert np.all(batch["input_ids"][:, 0] == 2)  # [CLS]
    w = batch["masked_lm_weights"] > 0
    taken = np.take_along_axis(mask, batch["masked_lm_positions"], 1)
    assert np.all(taken[w] == 1) and np.all(batch["masked_lm_ids"][~w] == 0)


@pytest.mark.parametrize("builder", ["nsp", "sop", "sso"])
def test_sentence_objective_balance(corpus, builder):
  # Long rows so chunks hold several sentences: a one-sentence chunk forces a random B (as in BERT).
  cfg = _cfg(corpus, example_builder=builder, num_shards=2, shuffle_buffer=80, max_seq_length=256)
  batches = _batches(cfg, 40)
  labels = np.concatenate([b["next_sentence_labels"] for b in batches])
  if builder == "sop":
    assert abs(labels.mean() - 0.5) < 0.06, labels.mean()
  elif builder == "sso":  # next, previous, random: a third each (a lone sentence is cut, as in SOP)
    assert np.all(np.abs(np.bincount(labels, minlength=3) / len(labels) - 1 / 3) < 0.06), np.bincount(labels)
  else:  # BERT's algorithm puts unused sentences back after a random B; they often form a lone
    assert 0.45 < labels.mean() < 0.65, labels.mean()  # one-sentence chunk, which forces random
  segments = np.concatenate([b["segment_ids"] for b in batches])
  assert np.all(segments.max(1) == 1)  # every row holds a pair


def test_packed_documents_never_attend_to_each_other(tmp_path):
  short_docs = data_fixtures.write_corpus(str(tmp_path), num_docs=200, sentences_per_doc=2)
  cfg = _cfg(short_docs, packing=True, example_builder="doc_sentences", max_seq_length=128, shuffle_buffer=40)
  for b in _batches(cfg, 4):
    doc, pos, ids, mask = b["document_ids"], b["position_ids"], b["input_ids"], b["input_mask"]
    assert np.all((doc > 0) == (mask > 0))
    attend = (doc[:, :, None] == doc[:, None, :]) & (doc[:, :, None] > 0)  # the mask a model builds
    for r in range(len(doc)):
      for d in range(1, doc[r].max() + 1):
        span = np.flatnonzero(doc[r] == d)
        assert np.array_equal(span, np.arange(span[0], span[-1] + 1))  # contiguous
        assert np.array_equal(pos[r, span], np.arange(len(span)))
        assert ids[r, span[0]] == 2 and ids[r, span[-1]] == 3  # own [CLS] ... [SEP]
        assert attend[r, span].sum() == len(span) ** 2
    assert (doc.max(1) > 1).any()  # several documents share rows


def test_global_batches_do_not_depend_on_host_count(corpus):
  cfg = _cfg(corpus)
  one, two, four = (_batches(cfg, 3, p) for p in (1, 2, 4))
  for a, b, c in zip(one, two, four):
    for k in a:
      assert np.array_equal(a[k], b[k]) and np.array_equal(a[k], c[k]), k


def _shard_documents(source, shard, num_shards, holdout=None):
  stats = corpora.Stats()
  ctx = shards.Context(source, False, None, None, None, {}, (0,), num_shards, holdout, 10**9, 64, stats)
  docs, _ = shards.ShardStream(ctx, shard).read_block([0, 0, 0, 0])
  return [tuple(d) for d in docs]


@pytest.mark.parametrize("num_files", [8, 2])  # by file, and by document hash when files are few
def test_host_shards_disjoint_and_covering(tmp_path, num_files):
  glob = data_fixtures.write_corpus(str(tmp_path), num_docs=50, num_files=num_files)
  source = corpora.TextSource(corpora.list_files(glob), "sentence_per_line", corpora.Stats())
  everything = _shard_documents(source, 0, 1)
  shards = [_shard_documents(source, s, 4) for s in range(4)]
  assert sorted(d for s in shards for d in s) == sorted(everything) and len(everything) == 50
  assert all(shards)
  train = [_shard_documents(source, s, 4, (0.2, False)) for s in range(4)]
  held = [_shard_documents(source, s, 4, (0.2, True)) for s in range(4)]
  assert sorted(d for s in train + held for d in s) == sorted(everything)
  assert not set(d for s in train for d in s) & set(d for s in held for d in s)


def test_resume_yields_the_same_batches(corpus, tmp_path):
  cfg = _cfg(corpus, masking="whole_word")
  reference = _batches(cfg, 12)
  first = make_pretrain_input(cfg, global_batch_size=BATCH, process_index=0, process_count=1)
  for _ in range(5):
    next(first)
  first.save(str(tmp_path))
  # resumed on two hosts: each reads its shards from the file the single host wrote
  resumed = [make_pretrain_input(cfg, global_batch_size=BATCH, process_index=i, process_count=2)
             for i in range(2)]
  for r in resumed:
    r.restore(str(tmp_path))
  for want in reference[5:]:
    got = [next(r) for r in resumed]
    for k in want:
      assert np.array_equal(want[k], np.concatenate([g[k] for g in got])), k


def test_eval_split_is_held_out_and_differs(corpus):
  train = _batches(_cfg(corpus), 1)[0]
  evaluation = _batches(_cfg(corpus, eval_fraction=0.3), 1, split="eval")[0]
  assert not np.array_equal(train["input_ids"], evaluation["input_ids"])


def test_prepared_records_give_the_same_batches(corpus, tmp_path):
  vocab = data_fixtures.embedded_paths()[1]
  metadata = prepare.prepare(corpus, str(tmp_path), vocab, num_workers=1)
  assert metadata["documents"] == 80 and metadata["files"] == 8
  # No hash hold-out: document identities include file names, which differ between the two.
  raw = _batches(_cfg(corpus, eval_fraction=0.0), 2)
  prepared = _batches(_cfg("", prepared=str(tmp_path / "*.tfrecord"), eval_fraction=0.0), 2)
  for a, b in zip(raw, prepared):
    for k in a:
      assert np.array_equal(a[k], b[k]), k
  with pytest.raises(DataError, match="tokenized with"):
    _batches(_cfg("", prepared=str(tmp_path / "*.tfrecord"), lower_case=False), 1)


def test_bad_input_is_a_data_error_or_counted_skip(corpus, tmp_path):
  with pytest.raises(DataError, match="matches no file"):
    _batches(_cfg(str(tmp_path / "missing*.txt")), 1)
  empty = tmp_path / "empty.txt"
  empty.write_text("")
  with pytest.raises(DataError, match="no examples"):
    _batches(_cfg(str(empty)), 1)
  with pytest.raises(DataError, match="max_position_embeddings=32"):
    _batches(_cfg(corpus), 1, max_position_embeddings=32)
  with pytest.raises(DataError, match="model.vocab_size=100"):
    _batches(_cfg(corpus), 1, model_vocab_size=100)
  with pytest.raises(DataError, match="num_shards"):
    _batches(_cfg(corpus), 1, batch=6)
  with pytest.raises(DataError, match="packing"):
    _batches(_cfg(corpus, packing=True), 1)
  mixed = tmp_path / "mixed"
  mixed.mkdir()
  (mixed / "binary.txt").write_bytes(bytes(range(256)) * 50)
  (mixed / "bad.txt").write_bytes(b"\xff\xfe broken line\n" + open(corpus.replace("*", "part0"), "rb").read())
  data = make_pretrain_input(_cfg(str(mixed / "*.txt"), num_shards=1), global_batch_size=4,
                             process_index=0, process_count=1)
  next(data)
  assert data.stats["skipped_files"] == 1 and data.stats["skipped_lines"] >= 1


def test_tfds_corpus_with_mock_data():
  import tensorflow_datasets as tfds
  cfg = common.data_config(tfds_name="imdb_reviews", tfds_feature="text", vocab=data_fixtures.embedded_paths()[1],
                           max_seq_length=64, max_predictions_per_seq=10, num_shards=2, shuffle_buffer=8)
  with tfds.testing.mock_data(num_examples=40):
    data = make_pretrain_input(cfg, global_batch_size=4, process_index=0, process_count=1)
    try:
      batch = [next(data) for _ in range(2)][1]
    finally:  # a reader thread left running would see tfds' file-system mocks come and go
      data.close()
  assert batch["input_ids"].shape == (4, 64) and batch["masked_lm_weights"].sum() > 0


def test_document_identity_ignores_the_directory():
  """Shards and the eval hold-out hash (file name, index): moving a corpus keeps both (data README)."""
  from bert_jax.data_pipelines import corpora
  assert corpora.document_hash("/data/wiki/part-3.txt", 7) == corpora.document_hash("gs://b/x/part-3.txt", 7)
  assert corpora.document_hash("part-3.txt", 7) != corpora.document_hash("part-3.txt", 8)
  assert corpora.document_hash("part-3.txt", 7) != corpora.document_hash("part-4.txt", 7)


def _epochs(cfg, n):
  """Rows of the first n epochs of shard 0, each as [(ids, mask counter)], and each epoch's masked ids."""
  ctx = shards.make_context(cfg, "train", None, None)
  stream = shards.ShardStream(ctx, 0)
  epochs = [[] for _ in range(n)]
  for row, counter in stream:
    if stream.state["cursor"][0] >= n:
      break
    epochs[stream.state["cursor"][0]].append((tuple(row.ids), counter))
  featurize = features.Featurizer(ctx.masking, ctx.seeds, ctx.spec, ctx.max_seq_length)
  masked = []
  for rows in epochs:
    stacked = shards._stack([Row(list(ids), [0] * len(ids)) for ids, _ in rows], [c for _, c in rows],
                            [0] * len(rows), ctx.max_seq_length)
    masked.append(featurize(stacked)["input_ids"])
  return epochs, masked


def test_static_masking_repeats_rows_and_masks_with_the_dupe_period(tmp_path):
  """#16 item 7: epoch e replays epoch e % dupe_factor (the original data creation's duplicates)."""
  glob = data_fixtures.write_corpus(str(tmp_path), num_docs=12, num_files=2)
  static, static_masks = _epochs(_cfg(glob, num_shards=1, masking_mode="static", dupe_factor=2), 3)
  assert static[0] == static[2] and np.array_equal(static_masks[0], static_masks[2])
  assert static[0] != static[1]
  dynamic, _ = _epochs(_cfg(glob, num_shards=1), 3)
  assert [ids for ids, _ in dynamic[0]] != [ids for ids, _ in dynamic[2]]  # rows rebuilt every epoch


def _record_file(path, documents):
  """A prepared-records file of `documents` (lists of sentences of ids); returns each record's byte size."""
  t = tf()
  payloads = [prepare.document_record(t, document) for document in documents]
  with t.io.TFRecordWriter(str(path)) as writer:
    for payload in payloads:
      writer.write(payload)
  return [16 + len(p) for p in payloads]  # u64 length, u32 crc, payload, u32 crc


def test_a_truncated_record_file_is_named_with_its_bytes_and_the_rest_skipped(tmp_path, caplog):
  documents = [[[5 + d, 6 + d], [7 + d]] for d in range(6)]
  sizes = _record_file(tmp_path / "part.tfrecord", documents)
  start = sum(sizes[:4])  # the file now ends 12 + 3 bytes into the fifth record
  (tmp_path / "part.tfrecord").write_bytes((tmp_path / "part.tfrecord").read_bytes()[:start + 15])
  stats = corpora.Stats()
  source = corpora.RecordSource([str(tmp_path / "part.tfrecord")], stats)
  for _ in range(2):  # a second epoch reads the same four documents and warns no more
    assert [d for d, _, _ in source.read(str(tmp_path / "part.tfrecord"), 0, 0)] == documents[:4]
  assert [r.getMessage() for r in caplog.records] == [
      f"{tmp_path / 'part.tfrecord'} is truncated: its record at byte {start:,} needs {sizes[4]:,} bytes, the "
      "file holds 15 more (a copy or a write that was cut short); this run reads the 4 documents before that "
      "record and skips the rest of the file (counted in stats as truncated_files); write it again with "
      "`bert-jax data prepare` to train on all of it"]
  assert stats["truncated_files"] == 1


def test_keras_is_hidden_only_while_tensorflow_starts(monkeypatch):
  """tftools.tf() imports TensorFlow without Keras (~40% of its import): keras can't be imported or found then,
  and can afterwards; a process that imported keras already is left as it is."""
  import importlib.util  # pylint: disable=import-outside-toplevel
  import sys  # pylint: disable=import-outside-toplevel
  from bert_jax.data_pipelines import tftools  # pylint: disable=import-outside-toplevel
  for name in [m for m in sys.modules if m == "keras" or m.startswith("keras.")]:
    monkeypatch.delitem(sys.modules, name)  # put back after the test
  finders = list(sys.meta_path)
  with tftools._without_keras():  # pylint: disable=protected-access
    with pytest.raises(ImportError):
      import keras  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
    with pytest.raises(ValueError):  # how TensorFlow looks for keras._tf_keras and keras.api
      importlib.util.find_spec("keras._tf_keras.keras")
    assert "keras" not in sys.modules
  assert sys.meta_path == finders
  assert importlib.util.find_spec("keras") is not None
  monkeypatch.setitem(sys.modules, "keras", None)  # imported already (here: marked absent)
  with tftools._without_keras():  # pylint: disable=protected-access
    assert sys.meta_path == finders


def test_featurizers_of_one_masking_configuration_share_one_traced_function(corpus):
  """Each run's Featurizers were traced anew (~0.5 s each); the traced function is kept per configuration,
  keyed on everything it reads: the same features as a fresh trace, and another seed or vocabulary gets its own."""
  import dataclasses  # pylint: disable=import-outside-toplevel
  ctx = shards.make_context(_cfg(corpus), "train", None, None)
  stream = shards.ShardStream(ctx, 0)
  rows = [(list(row.ids), counter) for (row, counter), _ in zip(stream, range(8))]
  stacked = shards._stack([Row(ids, [0] * len(ids)) for ids, _ in rows], [c for _, c in rows], [0] * len(rows),
                          ctx.max_seq_length)  # pylint: disable=protected-access
  args = (ctx.spec, ctx.max_seq_length)
  first, second = (features.Featurizer(ctx.masking, ctx.seeds, *args) for _ in range(2))
  assert first._fn is second._fn  # pylint: disable=protected-access
  fresh = features._traced_featurize(ctx.masking, ctx.seeds, *args)  # pylint: disable=protected-access
  steps = features.rates_at(ctx.masking, np.zeros(len(rows), np.int64))
  want = fresh(*(stacked[name] for name in features.ROW_FIELDS), steps)
  got = second(stacked)
  for name, value in want.items():
    assert np.array_equal(np.asarray(value), got[name]), name
  reseeded = features.Featurizer(ctx.masking, (ctx.seeds[0] + 1, ctx.seeds[1]), *args)
  assert not np.array_equal(reseeded(stacked)["input_ids"], got["input_ids"])
  special = ctx.masking.special.copy()
  special[-1] = not special[-1]
  other_vocab = features.Featurizer(dataclasses.replace(ctx.masking, special=special), ctx.seeds, *args)
  assert len({id(f._fn) for f in (first, reseeded, other_vocab)}) == 3  # pylint: disable=protected-access
