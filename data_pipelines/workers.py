"""Where rows get built: a prefetch thread in this process, or worker processes (`data.num_workers`).

Worker processes each run a contiguous group of this host's shards (rebuilding the context from the
picklable config), mask their rows (a row's mask depends on its own key only: masking.py) and write
their piece of every batch into a ring of slots in shared memory, sending only its key and their
shards' positions through a pipe; the main process only copies the pieces out in shard order. So the
whole text input (tokenizing, building rows, masking) runs on as many cores as there are workers.
Shards are independent streams, so the batches are the same for any number of workers. A builder with its own
rows (T5's span corruption: span_stream.py) hands WorkerPool its own `make_pieces`.
"""
from __future__ import annotations

import atexit
import itertools
import math
import multiprocessing
import os
import queue
import signal
import threading
import traceback

import ml_collections
import numpy as np

from bert_jax.data_pipelines.errors import DataError
from bert_jax.data_pipelines.features import Featurizer, feature_shapes
from bert_jax.data_pipelines.shards import make_context, shard_batches

# How far ahead a worker builds. A batch needs every worker's piece, and a worker's work is lumpy: reading
# and tokenizing a shuffle block of documents costs ~350 ms against ~1 ms for a piece's rows (embedded corpus,
# seq 128), so with 2 pieces of slack the other workers wait out each block and the workers take turns
# instead of running side by side. They get up to _QUEUE_BYTES of pieces ahead, 2 to 32 of them.
_QUEUE_BYTES = 64 * 2 ** 20
_QUEUE_BATCHES = (2, 32)
_ALIGN = 64  # bytes; each feature of a slot starts on a cache line
# Tokens a worker masks per TensorFlow call. A call costs ~1.5 ms of CPU beside its rows (~0.025 ms a row at seq
# 128: running the graph's few hundred small ops), so two workers masking half a batch each would spend 12-15%
# more CPU per token than one worker masking all of it (seq 128, batch 256, token masking). A worker with a
# small piece masks the pieces of up to _CHUNK_BATCHES consecutive batches in one call instead; a row's mask
# depends on its own key only (masking.py), so the batches are the same.
_FEATURIZE_TOKENS = 2 ** 15
_CHUNK_BATCHES = 8


def usable_cores() -> int:
  """The cores this process may run on (its affinity where the OS has one, as under `taskset`; macOS has none)."""
  return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def worker_count(data_cfg) -> int:
  """Worker processes for `data.num_workers` (-1: one per usable core; 0: none, rows built in this process)."""
  if data_cfg.num_workers < -1:
    raise DataError(f"data.num_workers={data_cfg.num_workers}; use 0 (build rows in this process), -1 (one "
                    "worker process per core this process may use) "
                    "or a positive number of worker processes")
  return usable_cores() if data_cfg.num_workers == -1 else data_cfg.num_workers


def chunk_batches(piece_tokens: int, slots: int) -> int:
  """Consecutive batches whose pieces of `piece_tokens` (rows x seq) a worker masks in one call."""
  return max(1, min(-(-_FEATURIZE_TOKENS // max(1, piece_tokens)), _CHUNK_BATCHES, slots))


def queue_depth(piece_bytes: int) -> int:
  """Pieces of `piece_bytes` a worker may build ahead: _QUEUE_BYTES' worth, within _QUEUE_BATCHES."""
  low, high = _QUEUE_BATCHES
  return max(low, min(high, _QUEUE_BYTES // max(1, piece_bytes)))


_TF_THREAD_VARIABLES = ("TF_NUM_INTEROP_THREADS", "TF_NUM_INTRAOP_THREADS")
_POLL_SECONDS = 0.1  # how often a blocked call checks that the other side is still there
_JOIN_SECONDS = 1.0  # grace before close() kills a worker still busy building a block


class Slots:
  """One worker's pieces in shared memory: `count` slots of one piece each (every feature of its rows).

  The worker writes its n-th piece into slot n % count once `free` lets it, and sends only the piece's key
  and shard positions; the main process copies slot n % count into the batch and releases it. A piece so
  crosses processes in one copy in and one out: no pickling, no pipe full of arrays, and no queue feeder
  thread (whose GIL hand-offs against the worker's main thread cost CPU once the processes run side by side).
  """

  def __init__(self, mp, shapes: dict):
    """`shapes`: name -> (dtype, shape) of a piece (features.feature_shapes); as many slots as queue_depth."""
    self._layout, offset = [], 0
    for name, (dtype, shape) in shapes.items():
      self._layout.append((name, np.dtype(dtype), tuple(shape), offset))
      offset += -(-np.dtype(dtype).itemsize * math.prod(shape) // _ALIGN) * _ALIGN
    self.piece_bytes, self.count = offset, queue_depth(offset)
    self._buffer = mp.RawArray("B", offset * self.count)
    self.free = mp.Semaphore(self.count)

  def views(self, slot: int) -> dict:
    """name -> the array in slot `slot` (a view of the shared memory)."""
    flat, base = np.frombuffer(self._buffer, np.uint8), slot * self.piece_bytes
    return {name: flat[base + offset:base + offset + dtype.itemsize * math.prod(shape)].view(dtype).reshape(shape)
            for name, dtype, shape, offset in self._layout}

  def write(self, slot: int, piece: dict) -> None:
    views = self.views(slot)
    if piece.keys() != views.keys():
      raise RuntimeError(f"a piece has features {sorted(piece)}; the slots hold {sorted(views)}")
    for name, view in views.items():
      if (piece[name].dtype, piece[name].shape) != (view.dtype, view.shape):
        raise RuntimeError(f"feature {name}: {piece[name].dtype}{list(piece[name].shape)} does not fit its slot "
                           f"{view.dtype}{list(view.shape)} (features.feature_shapes)")
      view[...] = piece[name]


def _acquire(semaphore, stop) -> bool:
  """Blocks until `semaphore` is acquired; False when the main process asked to stop or is gone."""
  parent = multiprocessing.parent_process()
  while not stop.is_set() and parent.is_alive():
    if semaphore.acquire(timeout=_POLL_SECONDS):
      return True
  return False


def _chunks(batches, size: int):
  """(list of `size` consecutive items of `batches`, None), ...; if building one fails, the items built before
  the failure and the error, last."""
  while True:
    chunk, error = [], None
    try:
      chunk.extend(itertools.islice(batches, size))
    except Exception as e:  # pylint: disable=broad-except  # raised by the caller after the pieces built before it
      error = e
    yield chunk, error
    if error is not None or len(chunk) < size:
      return


def masked_pieces(context_args: dict, shards: list, states: dict, rows_per_shard: int, first: int, slot_count: int):
  """The masked-LM builders' pieces: (key, masked piece, shard states, stats) of every batch of `shards`; if
  building fails, the pieces built before the failure, then the error."""
  ctx = make_context(ml_collections.ConfigDict(context_args["data_cfg"]),
                     **{k: v for k, v in context_args.items() if k != "data_cfg"})
  featurize = Featurizer(ctx.masking, ctx.seeds, ctx.spec, ctx.max_seq_length)
  rows = rows_per_shard * len(shards)
  size = chunk_batches(rows * ctx.max_seq_length, slot_count)
  for chunk, error in _chunks(shard_batches(ctx, shards, states, rows_per_shard, first), size):
    pieces = [piece for _, piece, _ in chunk]
    masked = featurize(pieces[0] if len(pieces) == 1 else
                       {name: np.concatenate([p[name] for p in pieces]) for name in pieces[0]}) if pieces else {}
    for i, (key, _, shard_states) in enumerate(chunk):
      piece = {name: value[i * rows:(i + 1) * rows] for name, value in masked.items()}
      yield key, piece, shard_states, dict(ctx.stats)
    if error is not None:
      raise error


def _worker_messages(make_pieces, context_args: dict, shards: list, states: dict, rows_per_shard: int,
                     slots: Slots, stop, first: int = 0):
  """(key, states, stats) for every batch, its piece (from `make_pieces`, as masked_pieces) written to the next
  slot; if building fails, the error as the last message. Ends when stopped."""
  try:
    for key, piece, shard_states, stats in make_pieces(context_args, shards, states, rows_per_shard, first,
                                                       slots.count):
      if not _acquire(slots.free, stop):
        return
      slots.write(key % slots.count, piece)
      yield key, shard_states, stats
  except DataError as e:
    yield e
  except Exception:  # pylint: disable=broad-except  # any failure must reach the caller, with its trace
    yield RuntimeError(f"data worker for shards {shards} failed:\n{traceback.format_exc()}")


def _worker(make_pieces, context_args: dict, shards: list, states: dict, rows_per_shard: int, slots: Slots, out,
            stop, tf_threads: int, first: int = 0):
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
  for message in _worker_messages(make_pieces, context_args, shards, states, rows_per_shard, slots, stop,
                                  first):
    try:
      out.send(message)  # small, and at most slots.count + 1 of them unread: never blocks for long
    except (BrokenPipeError, ConnectionResetError):  # the main process is gone
      return


class WorkerPool:
  """Worker processes, one per contiguous group of shards, each sending its piece of every batch."""

  def __init__(self, context_args: dict, groups: list, states: dict, rows_per_shard: int, first: int = 0,
               make_pieces=masked_pieces):
    """first: the run's step of the next batch (data.mask_rate_schedule); make_pieces: a module-level function
    (a worker imports it by name) giving a group's pieces, laid out as features.feature_shapes."""
    mp = multiprocessing.get_context("spawn")  # forking a process that runs TF threads can deadlock
    self._stop = mp.Event()
    data_cfg = ml_collections.ConfigDict(context_args["data_cfg"])
    self._slots = [Slots(mp, feature_shapes(data_cfg, len(g) * rows_per_shard)) for g in groups]
    pipes = [mp.Pipe(duplex=False) for _ in groups]
    self._pipes = [reader for reader, _ in pipes]
    tf_threads = max(1, usable_cores() // len(groups))
    self._processes = [
        mp.Process(target=_worker, daemon=True, name=f"data-worker-{g[0]}-{g[-1]}",
                   args=(make_pieces, context_args, g, {s: states[s] for s in g}, rows_per_shard, slots, writer,
                         self._stop, tf_threads, first))
        for g, slots, (_, writer) in zip(groups, self._slots, pipes)]
    for p in self._processes:
      p.start()
    for _, writer in pipes:
      writer.close()  # the worker holds its own end now: a dead worker reads as EOF here
    self._taken = 0
    self.stats = [{} for _ in groups]
    self._closed = False
    # Registered after multiprocessing's own exit hook, so it runs first: workers ignore SIGTERM,
    # which that hook would send them before waiting for them forever.
    atexit.register(self.close)

  def _get(self, i: int):
    process, pipe = self._processes[i], self._pipes[i]
    try:
      while not pipe.poll(_POLL_SECONDS):
        if not process.is_alive() and not pipe.poll():
          raise EOFError
      message = pipe.recv()
    except EOFError:
      process.join(_JOIN_SECONDS)
      raise RuntimeError(f"{process.name} exited (code {process.exitcode}) "
                         "without a batch or an error; was it killed (out of memory)?") from None
    if isinstance(message, Exception):
      raise message
    return message

  def next(self) -> tuple[dict, dict]:
    """(this host's masked batch, its shards' states after it): the workers' pieces in shard order."""
    messages = [self._get(i) for i in range(len(self._processes))]
    if {key for key, *_ in messages} != {self._taken}:
      raise RuntimeError(f"data workers are out of step: batch keys {[key for key, *_ in messages]}, "
                         f"expected {self._taken}")
    states = {}
    for i, (_, shard_states, stats) in enumerate(messages):
      states.update(shard_states)
      self.stats[i] = stats
    pieces = [slots.views(self._taken % slots.count) for slots in self._slots]
    batch = {name: np.concatenate([piece[name] for piece in pieces]) for name in pieces[0]}  # copies them out
    for slots in self._slots:
      slots.free.release()
    self._taken += 1
    return batch, states

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
    for pipe in self._pipes:
      pipe.close()
    self._slots = []  # frees the shared memory


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
