"""data.num_workers: worker processes give the in-process batches, resume exactly, report errors, shut down."""
import multiprocessing
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import data_fixtures
from bert_jax.configs import common
from bert_jax.data_pipelines import workers
from bert_jax.data_pipelines.errors import DataError
from bert_jax.data_pipelines.pipeline import make_pretrain_input
from core_helpers import slow

BATCH = 16


@pytest.fixture(autouse=True)
def _short_queues(monkeypatch):
  # These tests read a few batches; workers building 32 pieces ahead would only compete for the cores.
  monkeypatch.setattr(workers, "_QUEUE_BATCHES", (2, 2))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  return data_fixtures.write_corpus(str(tmp_path_factory.mktemp("corpus")), num_docs=40, num_files=4)


def _cfg(corpus, num_workers, **kw):
  # A small shuffle block, so a few batches cross block boundaries inside each shard.
  return common.data_config(corpus=corpus, vocab=data_fixtures.embedded_paths()[1], max_seq_length=64,
                            max_predictions_per_seq=10, num_shards=4, shuffle_buffer=3,
                            num_workers=num_workers, seed=3, **kw)


def _input(cfg):
  return make_pretrain_input(cfg, global_batch_size=BATCH, process_index=0, process_count=1)


def _assert_same(want, got):
  assert want.keys() == got.keys()
  for k in want:
    assert want[k].dtype == got[k].dtype and np.array_equal(want[k], got[k]), k


# Packed full-sentence rows with trigram shuffling: their optional features (segment ids, positions, the
# shuffle's labels) must also fit the shared-memory slots that features.feature_shapes lays out.
_EVERY_FEATURE = dict(packing=True, example_builder="full_sentences", trigram_shuffle_rate=0.1)


def test_workers_give_the_in_process_batches_and_close_stops_them(corpus):
  # Each worker masks its pieces of 2 consecutive batches in one call (its pieces are small: chunk_batches),
  # which must not change a row's mask.
  assert workers.chunk_batches(2 * (BATCH // 4) * 64, 2) == 2
  reference = _input(_cfg(corpus, 0, masking="span", **_EVERY_FEATURE))
  pool = _input(_cfg(corpus, 3, masking="span", **_EVERY_FEATURE))  # shard groups [0, 1], [2], [3]
  try:
    for _ in range(6):
      _assert_same(next(reference), next(pool))
    children = multiprocessing.active_children()
    assert len(children) == 3
  finally:
    pool.close()
  assert not any(c.is_alive() for c in children)
  assert not set(multiprocessing.active_children()) & set(children)


# labels with the rows: weekly; packed rows' features cross the slots in the default suite, in the test above
@pytest.mark.parametrize("kw", [pytest.param(dict(example_builder="ernie"), marks=slow),
                                pytest.param(_EVERY_FEATURE, marks=slow)])
def test_every_feature_crosses_the_shared_memory_slots(corpus, kw):
  # A worker's piece travels through slots laid out by features.feature_shapes: every optional feature must fit.
  reference, pool = _input(_cfg(corpus, 0, **kw)), _input(_cfg(corpus, 1, **kw))
  try:
    for _ in range(3):
      _assert_same(next(reference), next(pool))
  finally:
    pool.close()


def test_chunk_sizes_and_an_error_after_good_pieces():
  tokens = workers._FEATURIZE_TOKENS
  assert workers.chunk_batches(tokens, 32) == 1 and workers.chunk_batches(2 * tokens, 32) == 1
  assert workers.chunk_batches(tokens // 2, 32) == 2 and workers.chunk_batches(tokens // 2 - 1, 32) == 3
  assert workers.chunk_batches(1, 32) == workers._CHUNK_BATCHES and workers.chunk_batches(1, 2) == 2

  def batches():
    yield from range(5)
    raise DataError("broken")

  chunks = list(workers._chunks(batches(), 2))
  assert [c for c, _ in chunks] == [[0, 1], [2, 3], [4]]  # the pieces built before the error still go out
  assert [e is None for _, e in chunks] == [True, True, False] and str(chunks[-1][1]) == "broken"
  assert [(c, e) for c, e in workers._chunks(iter(range(4)), 2)] == [([0, 1], None), ([2, 3], None), ([], None)]


def test_a_piece_that_does_not_fit_its_slot_is_an_error():
  slots = workers.Slots(multiprocessing.get_context("spawn"), {"ids": ("int32", (2, 3)), "w": ("float32", (2,))})
  assert slots.piece_bytes == 2 * workers._ALIGN and slots.count == workers._QUEUE_BATCHES[1]
  piece = {"ids": np.arange(6, dtype=np.int32).reshape(2, 3), "w": np.array([0.5, 1.0], np.float32)}
  slots.write(1, piece)
  assert np.array_equal(slots.views(1)["ids"], piece["ids"]) and not slots.views(0)["ids"].any()
  with pytest.raises(RuntimeError, match=r"feature ids: int64\[2, 3\] does not fit its slot int32\[2, 3\]"):
    slots.write(0, {**piece, "ids": piece["ids"].astype(np.int64)})
  with pytest.raises(RuntimeError, match="the slots hold"):
    slots.write(0, {"ids": piece["ids"]})


_CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1


@slow  # a property of the pools' sizes, not of the batches (~20 s quiet): weekly
@pytest.mark.skipif(_CORES < 2 or not os.path.isdir("/proc/self/task"),
                    reason="needs 2 cores (one worker's default pool size is the cores) and Linux's /proc")
def test_workers_share_the_cores_between_their_tensorflow_thread_pools(corpus):
  # TensorFlow sizes a process's inter-op pool (threads named tf_Compute) to every core it may use; each worker
  # gets its share instead (the 4 shards of _cfg cap the workers at 4).
  data = _input(_cfg(corpus, _CORES))
  try:
    next(data)
    children = multiprocessing.active_children()
    assert len(children) == min(_CORES, 4)
    for child in children:
      names = [open(f"/proc/{child.pid}/task/{tid}/comm", encoding="utf-8").read().strip()
               for tid in os.listdir(f"/proc/{child.pid}/task")]
      assert names.count("tf_Compute") == _CORES // len(children), (child.name, names)
  finally:
    data.close()


@slow  # an end-to-end chain; its parts are tested in the suite (BERT_JAX_SLOW_TESTS=1)
def test_save_with_workers_restore_with_another_count(corpus, tmp_path):
  reference = _input(_cfg(corpus, 0))
  expected = [next(reference) for _ in range(7)]
  first = _input(_cfg(corpus, 2))
  try:
    for _ in range(3):
      next(first)
    first.save(str(tmp_path))
    next(first)
    first.restore(str(tmp_path))  # restarts its workers from the saved position
    _assert_same(expected[3], next(first))
  finally:
    first.close()
  resumed = _input(_cfg(corpus, 1))
  try:
    resumed.restore(str(tmp_path))
    for want in expected[3:]:
      _assert_same(want, next(resumed))
  finally:
    resumed.close()


def test_worker_error_reaches_the_caller(tmp_path):
  empty = tmp_path / "empty.txt"
  empty.write_text("")
  data = _input(_cfg(str(empty), 1))
  try:
    with pytest.raises(DataError, match=r"shard \d of 4 produced no examples in a whole epoch"):
      next(data)
  finally:
    data.close()


@slow  # a fresh interpreter with two workers (~15 s alone, ~25 s in the suite); close() is tested above
def test_interpreter_exits_cleanly_with_running_workers(corpus):
  # No close(): the workers are blocked on full queues when the interpreter exits.
  script = textwrap.dedent(f"""
      import os, sys
      sys.path[:0] = {[os.path.dirname(__file__), os.getcwd()]!r}
      import test_data_workers as t
      data = t._input(t._cfg({corpus!r}, 2))
      next(data)
      print(*(p.pid for p in __import__("multiprocessing").active_children()))
      """)
  done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr
  assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr
  pids = [int(p) for p in done.stdout.split()]
  assert len(pids) == 2
  for pid in pids:
    with pytest.raises(ProcessLookupError):
      os.kill(pid, 0)


# weekly (~15 and ~19 s quiet): every pretraining test's run closes its in-process prefetch at its end
@pytest.mark.parametrize("how", [pytest.param("exit", marks=slow), pytest.param("close", marks=slow)])
def test_in_process_prefetch_never_blocks_exit_or_close(corpus, how):
  # The prefetch thread is mid-generator (building ahead) when the input is dropped or the interpreter
  # exits; tf.data's from_generator deadlocked on the GIL here.
  script = textwrap.dedent(f"""
      import os, sys
      sys.path[:0] = {[os.path.dirname(__file__), os.getcwd()]!r}
      import test_data_workers as t
      data = t._input(t._cfg({corpus!r}, 0))
      for _ in range(3):
        next(data)
      if {how!r} == "close":
        data.close()
        del data
      print("done")
      """)
  done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
  assert done.returncode == 0 and done.stdout.strip() == "done", done.stderr
  assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr
