"""Where rows get built: a prefetch thread in this process, or worker processes (`data.num_workers`).

Worker processes each run a contiguous group of this host's shards (rebuilding the context from the
picklable config), mask their rows (a row's mask depends on its own key only: masking.py) and send
their piece of every batch, with their shards' positions, through a bounded queue; the main process
only joins the pieces in shard order. So the whole text input (tokenizing, building rows, masking)
runs on as many cores as there are workers. Shards are independent streams, so the batches are the
same for any number of workers.
"""
from __future__ import annotations

import atexit
import multiprocessing
import os
import queue
import signal
import threading
import traceback

import ml_collections
import numpy as np

from bert_jax.data_pipelines.errors import DataError
from bert_jax.data_pipelines.features import Featurizer
from bert_jax.data_pipelines.shards import make_context, shard_batches

# How far ahead a worker builds. A batch needs every worker's piece, and a worker's work is lumpy: reading
# and tokenizing a shuffle block of documents costs ~350 ms against ~1 ms for a piece's rows (embedded corpus,
# seq 128), so with 2 pieces of slack the other workers wait out each block and the workers take turns
# instead of running side by side. They get up to _QUEUE_BYTES of pieces ahead, 2 to 32 of them.
_QUEUE_BYTES = 64 * 2 ** 20
_QUEUE_BATCHES = (2, 32)
_BYTES_PER_TOKEN = 40  # a masked row's features: ~10 int32 values per position


def queue_depth(rows: int, seq_length: int) -> int:
  """Pieces of `rows` rows a worker may build ahead: _QUEUE_BYTES' worth, within _QUEUE_BATCHES."""
  low, high = _QUEUE_BATCHES
  return max(low, min(high, _QUEUE_BYTES // max(1, rows * seq_length * _BYTES_PER_TOKEN)))
_TF_THREAD_VARIABLES = ("TF_NUM_INTEROP_THREADS", "TF_NUM_INTRAOP_THREADS")
_POLL_SECONDS = 0.1  # how often a blocked queue call checks that the other side is still there
_JOIN_SECONDS = 1.0  # grace before close() kills a worker still busy building a block


def _put(out, message, stop) -> bool:
  """Blocks while the queue is full; False when the main process asked to stop or is gone."""
  parent = multiprocessing.parent_process()
  while not stop.is_set() and parent.is_alive():
    try:
      out.put(message, timeout=_POLL_SECONDS)
      return True
    except queue.Full:
      pass
  return False


def _worker_messages(context_args: dict, shards: list, states: dict, rows_per_shard: int):
  """(key, masked piece, states, stats) for every batch; if building fails, the error as the last message."""
  try:
    ctx = make_context(ml_collections.ConfigDict(context_args["data_cfg"]),
                       **{k: v for k, v in context_args.items() if k != "data_cfg"})
    featurize = Featurizer(ctx.masking, ctx.seeds, ctx.spec, ctx.max_seq_length)
    for key, piece, shard_states in shard_batches(ctx, shards, states, rows_per_shard):
      yield key, featurize(piece), shard_states, dict(ctx.stats)
  except DataError as e:
    yield e
  except Exception:  # pylint: disable=broad-except  # any failure must reach the caller, with its trace
    yield RuntimeError(f"data worker for shards {shards} failed:\n{traceback.format_exc()}")


def _worker(context_args: dict, shards: list, states: dict, rows_per_shard: int, out, stop, tf_threads: int):
  """A worker process's main: sends its messages until stopped, or until the last one (an error)."""
  # Before TensorFlow starts here: its thread pools would each get a thread per core this process may use,
  # but the workers share those cores, and an idle pool thread spins before it sleeps. Unless the environment
  # sets them, a worker's pools get its share of the cores (with one worker per core: one thread each).
  for name in _TF_THREAD_VARIABLES:
    os.environ.setdefault(name, str(tf_threads))
  # Ctrl-C and preemption signals reach the whole process group; the main process owns the shutdown
  # (the trainer keeps reading batches after SIGTERM until the agreed stop step).
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  signal.signal(signal.SIGTERM, signal.SIG_IGN)
  for message in _worker_messages(context_args, shards, states, rows_per_shard):
    if not _put(out, message, stop):
      out.cancel_join_thread()  # nobody will read what is still buffered: exit without flushing it
      return


class WorkerPool:
  """Worker processes, one per contiguous group of shards, each sending its piece of every batch."""

  def __init__(self, context_args: dict, groups: list, states: dict, rows_per_shard: int):
    mp = multiprocessing.get_context("spawn")  # forking a process that runs TF threads can deadlock
    self._stop = mp.Event()
    seq_length = context_args["data_cfg"]["max_seq_length"]
    self._queues = [mp.Queue(queue_depth(len(g) * rows_per_shard, seq_length)) for g in groups]
    tf_threads = max(1, len(os.sched_getaffinity(0)) // len(groups))
    self._processes = [
        mp.Process(target=_worker, daemon=True, name=f"data-worker-{g[0]}-{g[-1]}",
                   args=(context_args, g, {s: states[s] for s in g}, rows_per_shard, q, self._stop,
                         tf_threads))
        for g, q in zip(groups, self._queues)]
    for p in self._processes:
      p.start()
    self.stats = [{} for _ in groups]
    self._closed = False
    # Registered after multiprocessing's own exit hook, so it runs first: workers ignore SIGTERM,
    # which that hook would send them before waiting for them forever.
    atexit.register(self.close)

  def _get(self, i: int):
    while True:
      try:
        message = self._queues[i].get(timeout=_POLL_SECONDS)
      except queue.Empty:
        if not self._processes[i].is_alive() and self._queues[i].empty():
          raise RuntimeError(f"{self._processes[i].name} exited (code {self._processes[i].exitcode}) "
                             "without a batch or an error; was it killed (out of memory)?") from None
        continue
      if isinstance(message, Exception):
        raise message
      return message

  def next(self) -> tuple[dict, dict]:
    """(this host's masked batch, its shards' states after it): the workers' pieces in shard order."""
    pieces = [self._get(i) for i in range(len(self._processes))]
    if len({key for key, *_ in pieces}) != 1:
      raise RuntimeError(f"data workers are out of step: batch keys {[key for key, *_ in pieces]}")
    states = {}
    for i, (_, _, shard_states, stats) in enumerate(pieces):
      states.update(shard_states)
      self.stats[i] = stats
    return {name: np.concatenate([piece[name] for _, piece, _, _ in pieces]) for name in pieces[0][1]}, states

  def close(self) -> None:
    if self._closed:  # at exit: once from the atexit hook, again from PretrainInput.__del__
      return
    self._closed = True
    atexit.unregister(self.close)
    self._stop.set()
    for p in self._processes:
      p.join(_JOIN_SECONDS)
    for p in self._processes:
      if p.is_alive():
        p.kill()  # still building a block; it holds nothing but open input files
        p.join()
    for q in self._queues:
      q.close()


class Prefetcher:
  """Runs a batch generator in a background thread, `depth` batches ahead; `close` stops it at once.

  The batches carry the shard states they end at, so the consumer records exactly what it consumed.
  (tf.data's from_generator did this job first: destroying its iterator while its thread was inside
  the Python generator deadlocked on the GIL, which hung processes at exit.)
  """

  def __init__(self, make_batches, depth: int = 2):
    self._queue = queue.Queue(maxsize=depth)
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, args=(make_batches,), daemon=True)
    self._thread.start()

  def _put(self, item) -> bool:
    while not self._stop.is_set():
      try:
        self._queue.put(item, timeout=0.1)
        return True
      except queue.Full:
        continue
    return False

  def _run(self, make_batches):
    try:
      for item in make_batches():
        if not self._put(("batch", item)):
          return
      self._put(("end", None))
    except BaseException as e:  # pylint: disable=broad-except  # re-raised in the consumer
      self._put(("error", e))

  def next(self):
    kind, value = self._queue.get()
    if kind == "error":
      raise value
    if kind == "end":
      raise StopIteration
    return value

  def close(self) -> None:
    self._stop.set()
    if threading.current_thread() is not self._thread:
      self._thread.join()
