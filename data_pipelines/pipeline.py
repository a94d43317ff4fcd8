"""The pretraining input: corpus -> documents -> shuffle blocks -> rows -> masked, padded batches.

Output contract (one dict per `next()`; B = global_batch_size // process_count rows, this host's
contiguous share of the global batch; T = data.max_seq_length; P = data.max_predictions_per_seq):
FEATURES below, plus PACKING_FEATURES when `data.packing` and SPAN_FEATURES when `data.masking == "span"`.

Host-count independence: the documents are split into `data.num_shards` virtual shards (by file when
there are at least that many files, else by a hash of each document's identity). Every shard is a
deterministic stream that contributes `global_batch // num_shards` consecutive rows to each global
batch; host h builds shards [h * S/H, (h+1) * S/H) and concatenates them. So the global batch depends
on the seed and the step only. Each shard reads `data.shuffle_buffer` documents at a time (a block),
builds its rows with a generator seeded by (seeds, shard, block position) and shuffles them; each
row's mask is drawn from a generator seeded by (seeds, shard, row index), fresh for every row ever
produced. The saved position of a shard is (block position, rows already taken from the block, row
index): restoring re-reads one block and is exact.

Parallelism: with `data.num_workers` = 0 this host's shards run in one Python generator on a prefetch
thread (two batches ahead), so example building uses about one core. With N > 0, N spawned worker processes each run a
contiguous group of the shards (rebuilding the context from the picklable config) and send their
piece of every batch, with their shards' positions, through a bounded queue; the main process joins
the pieces in shard order. Shards are independent streams, so the batches are the same for any N.
"""
from __future__ import annotations

import atexit
import dataclasses
import itertools
import json
import multiprocessing
import os
import queue
import signal
import threading
import traceback

import ml_collections
import numpy as np

from data_pipelines import corpora, embedded
from data_pipelines.errors import DataError
from data_pipelines.examples import BuilderConfig, Row, build_rows
from data_pipelines.masking import MaskingConfig, mask_tokens
from data_pipelines.tftools import tf
from data_pipelines.tokenizers import load_tokenizer

# name: (dtype, shape, meaning)
FEATURES = {
    "input_ids": ("int32", ("B", "T"), "[CLS] A [SEP] (B [SEP]) with masked positions replaced; 0 ([PAD]) after"),
    "input_mask": ("int32", ("B", "T"), "1 on real tokens, 0 on padding"),
    "segment_ids": ("int32", ("B", "T"), "token type: 0 for [CLS] A [SEP], 1 for B [SEP], 0 on padding"),
    "masked_lm_positions": ("int32", ("B", "P"), "positions of the predictions, ascending; 0 on unused slots"),
    "masked_lm_ids": ("int32", ("B", "P"), "original token ids at those positions; 0 on unused slots"),
    "masked_lm_weights": ("float32", ("B", "P"), "1.0 for a real prediction, 0.0 for an unused slot"),
    "next_sentence_labels": ("int32", ("B",), "NSP: 1 = random B, 0 = actual next; SOP: 1 = swapped; "
                             "0 without a sentence objective"),
}
PACKING_FEATURES = {
    "document_ids": ("int32", ("B", "T"), "1..k for the k documents packed in the row, 0 on padding; "
                     "attend only where equal and non-zero"),
    "position_ids": ("int32", ("B", "T"), "position inside its own document, from 0; 0 on padding"),
}
SPAN_FEATURES = {
    "masked_lm_span_left": ("int32", ("B", "P"), "position of the token just before the prediction's span"),
    "masked_lm_span_right": ("int32", ("B", "P"), "position of the token just after the prediction's span"),
    "masked_lm_span_offset": ("int32", ("B", "P"), "0-based index of the prediction inside its span"),
}
_STATE_FILE = "data_state.process{:05d}.json"
_MASK_STREAM = 1  # separates the mask generator's seed from the block generator's
_QUEUE_BATCHES = 2  # pieces a worker builds ahead, as the in-process prefetch thread does
_POLL_SECONDS = 0.1  # how often a blocked queue call checks that the other side is still there
_JOIN_SECONDS = 1.0  # grace before close() kills a worker still busy building a block


def feature_spec(data_cfg) -> dict:
  """The contract for this config: name -> (dtype, shape, meaning)."""
  spec = dict(FEATURES)
  if data_cfg.packing:
    spec.update(PACKING_FEATURES)
  if data_cfg.masking == "span":
    spec.update(SPAN_FEATURES)
  return spec


@dataclasses.dataclass
class _Context:
  """Everything the shard streams share."""
  source: object
  tokenized: bool  # the source yields token ids already (prepared records)
  tokenizer: object
  builder: BuilderConfig
  masking: MaskingConfig
  spec: dict
  seeds: tuple
  num_shards: int
  holdout: tuple | None  # (fraction, keep_held_out) for the eval_fraction split, else None
  block_documents: int
  max_seq_length: int
  stats: corpora.Stats


def _pad(values, length, dtype=np.int32):
  out = np.zeros(length, dtype)
  out[:len(values)] = values
  return out


def _features(row: Row, masked, ctx: _Context) -> dict:
  """One padded example following the contract (without the batch axis)."""
  t, p = ctx.max_seq_length, ctx.masking.max_predictions
  k = len(masked.positions)
  f = {
      "input_ids": _pad(masked.input_ids, t),
      "input_mask": _pad(np.ones(len(row.ids)), t),
      "segment_ids": _pad(row.segment_ids, t),
      "masked_lm_positions": _pad(masked.positions, p),
      "masked_lm_ids": _pad(masked.labels, p),
      "masked_lm_weights": _pad(np.ones(k), p, np.float32),
      "next_sentence_labels": np.int32(row.label),
  }
  if "document_ids" in ctx.spec:
    doc = np.asarray(row.document_ids)
    starts = np.flatnonzero(np.diff(doc, prepend=0))
    f["document_ids"] = _pad(doc, t)
    f["position_ids"] = _pad(np.arange(len(doc)) - np.repeat(starts, np.diff(np.append(starts, len(doc)))), t)
  if "masked_lm_span_left" in ctx.spec:
    f["masked_lm_span_left"] = _pad(masked.span_left, p)
    f["masked_lm_span_right"] = _pad(masked.span_right, p)
    f["masked_lm_span_offset"] = _pad(masked.span_offset, p)
  return f


class _ShardStream:
  """One virtual shard: a deterministic, resumable stream of masked examples."""

  def __init__(self, ctx: _Context, shard: int, state: dict | None = None):
    self.ctx, self.shard = ctx, shard
    units = ctx.source.units
    self.by_unit = len(units) >= ctx.num_shards
    self.units = units[shard::ctx.num_shards] if self.by_unit else list(units)
    # state: cursor = [epoch, unit position, offset, document index] of the current block's start.
    self.state = state or {"cursor": [0, 0, 0, 0], "skip": 0, "index": 0}

  def _keep(self, unit, index) -> bool:
    h = corpora.document_hash(unit, index)
    if self.ctx.holdout is not None:
      fraction, held_out = self.ctx.holdout
      if ((h & 0xFFFFFFFF) / 2 ** 32 < fraction) != held_out:
        return False
    return self.by_unit or (h >> 32) % self.ctx.num_shards == self.shard

  def _read_block(self, cursor):
    """(documents, cursor after them): up to block_documents documents from `cursor`, within one epoch."""
    epoch, position, offset, index = cursor
    order = np.random.default_rng([*self.ctx.seeds, self.shard, epoch]).permutation(len(self.units))
    docs = []
    while position < len(self.units) and len(docs) < self.ctx.block_documents:
      unit = self.units[order[position]]
      for doc, offset, index in self.ctx.source.read(unit, offset, index):
        if self._keep(unit, index - 1):
          docs.append(doc)
          if len(docs) == self.ctx.block_documents:
            break
      else:
        position, offset, index = position + 1, 0, 0
    if position == len(self.units):
      return docs, [epoch + 1, 0, 0, 0]
    return docs, [epoch, position, offset, index]

  def _rows(self, cursor):
    docs, next_cursor = self._read_block(cursor)
    if not self.ctx.tokenized:
      encode = self.ctx.tokenizer.encode
      docs = [[encode(s) for s in doc] for doc in docs]
    rng = np.random.default_rng([*self.ctx.seeds, self.shard, *cursor])
    rows = build_rows(self.ctx.builder, docs, rng, self.ctx.stats)
    return [rows[i] for i in rng.permutation(len(rows))], next_cursor

  def __iter__(self):
    cursor, skip, index = self.state["cursor"], self.state["skip"], self.state["index"]
    empty_since = None
    while True:
      rows, next_cursor = self._rows(cursor)
      if rows:
        empty_since = None
      elif empty_since is None:
        empty_since = cursor
      elif next_cursor[0] > empty_since[0] + 1:
        raise DataError(f"shard {self.shard} of {self.ctx.num_shards} produced no examples in a whole "
                        f"epoch (stats: {dict(self.ctx.stats)}): the corpus is empty, binary, or its "
                        "documents are too short; check data.corpus or lower data.num_shards")
      for row in rows[skip:]:
        rng = np.random.default_rng([*self.ctx.seeds, self.shard, index, _MASK_STREAM])
        masked = mask_tokens(np.asarray(row.ids, np.int32), self.ctx.masking, rng)
        skip, index = skip + 1, index + 1
        self.state = {"cursor": cursor, "skip": skip, "index": index}
        yield _features(row, masked, self.ctx)
      cursor, skip = next_cursor, 0
      self.state = {"cursor": cursor, "skip": 0, "index": index}


def _shard_batches(ctx: _Context, shards, states: dict, rows_per_shard: int):
  """(key, rows of `shards` stacked per feature, their states after those rows) for batch 0, 1, ..."""
  streams = [_ShardStream(ctx, s, states[s]) for s in shards]
  iterators = [iter(s) for s in streams]
  for key in itertools.count():
    rows = [next(it) for it in iterators for _ in range(rows_per_shard)]
    yield key, {name: np.stack([r[name] for r in rows]) for name in ctx.spec}, {s.shard: s.state for s in streams}


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
  """(key, piece, states, stats) for every batch; if building fails, the error as the last message."""
  try:
    ctx = _context(ml_collections.ConfigDict(context_args["data_cfg"]),
                   **{k: v for k, v in context_args.items() if k != "data_cfg"})
    for key, piece, shard_states in _shard_batches(ctx, shards, states, rows_per_shard):
      yield key, piece, shard_states, dict(ctx.stats)
  except DataError as e:
    yield e
  except Exception:  # pylint: disable=broad-except  # any failure must reach the caller, with its trace
    yield RuntimeError(f"data worker for shards {shards} failed:\n{traceback.format_exc()}")


def _worker(context_args: dict, shards: list, states: dict, rows_per_shard: int, out, stop):
  """A worker process's main: sends its messages until stopped, or until the last one (an error)."""
  # Ctrl-C and preemption signals reach the whole process group; the main process owns the shutdown
  # (the trainer keeps reading batches after SIGTERM until the agreed stop step).
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  signal.signal(signal.SIGTERM, signal.SIG_IGN)
  for message in _worker_messages(context_args, shards, states, rows_per_shard):
    if not _put(out, message, stop):
      out.cancel_join_thread()  # nobody will read what is still buffered: exit without flushing it
      return


class _WorkerPool:
  """Worker processes, one per contiguous group of shards, each sending its piece of every batch."""

  def __init__(self, context_args: dict, groups: list, states: dict, rows_per_shard: int):
    mp = multiprocessing.get_context("spawn")  # forking a process that runs TF threads can deadlock
    self._stop = mp.Event()
    self._queues = [mp.Queue(_QUEUE_BATCHES) for _ in groups]
    self._processes = [
        mp.Process(target=_worker, daemon=True, name=f"data-worker-{g[0]}-{g[-1]}",
                   args=(context_args, g, {s: states[s] for s in g}, rows_per_shard, q, self._stop))
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
    """(this host's batch, its shards' states after it): the workers' pieces in shard order."""
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


class _Prefetcher:
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


class PretrainInput:
  """Iterable of this host's rows of each global batch; `save`/`restore` its position; `close` its workers."""

  def __init__(self, ctx: _Context, shards: range, rows_per_shard: int, process_index: int,
               num_workers: int, context_args: dict):
    self._ctx, self.tokenizer, self._shards = ctx, ctx.tokenizer, shards
    self._rows_per_shard, self._process_index = rows_per_shard, process_index
    self._states = {s: None for s in shards}
    self._prefetcher = None
    # context_args rebuild ctx in a worker: picklable, unlike the tokenizer and the source
    groups = np.array_split(np.array(shards), min(num_workers, len(shards))) if num_workers else []
    self._groups = [[int(s) for s in g] for g in groups]
    self._context_args, self._pool = context_args, None
    self._closed_worker_stats = corpora.Stats()

  @property
  def stats(self) -> dict:
    """Counted skips: skipped_lines (not UTF-8), skipped_files (binary), short_documents."""
    total = self._ctx.stats + self._closed_worker_stats
    for worker_stats in (self._pool.stats if self._pool else []):
      total.update(worker_stats)
    return dict(total)

  @property
  def spec(self) -> dict:
    return self._ctx.spec

  def __iter__(self):
    return self

  def __next__(self) -> dict:
    if self._groups:
      return self._next_from_workers()
    if self._prefetcher is None:
      self._prefetcher = _Prefetcher(
          lambda: _shard_batches(self._ctx, self._shards, self._states, self._rows_per_shard))
    _, batch, states = self._prefetcher.next()
    self._states.update(states)
    return batch

  def _next_from_workers(self) -> dict:
    if self._pool is None:
      self._pool = _WorkerPool(self._context_args, self._groups, self._states, self._rows_per_shard)
    try:
      batch, states = self._pool.next()
    except BaseException:
      self.close()  # a worker failed or we were interrupted: the next call restarts from the consumed position
      raise
    self._states.update(states)
    return batch

  def close(self) -> None:
    """Stops the worker processes (if any); the next `next()` starts again from the consumed position."""
    if self._pool is not None:
      for worker_stats in self._pool.stats:
        self._closed_worker_stats.update(worker_stats)
      self._pool.close()
      self._pool = None
    if self._prefetcher is not None:
      self._prefetcher.close()
      self._prefetcher = None

  def __del__(self):
    self.close()

  def save(self, directory: str) -> None:
    """Writes this process's shard positions to `directory` (one file per process)."""
    gfile = tf().io.gfile
    gfile.makedirs(directory)
    state = {"num_shards": self._ctx.num_shards, "rows_per_shard": self._rows_per_shard,
             "shards": {str(s): self._states[s] for s in self._shards}}
    with gfile.GFile(os.path.join(directory, _STATE_FILE.format(self._process_index)), "w") as f:
      f.write(json.dumps(state))

  def restore(self, directory: str) -> None:
    """Reads the positions of this host's shards from the files every process wrote (any host count)."""
    gfile = tf().io.gfile
    paths = gfile.glob(os.path.join(directory, _STATE_FILE.replace("{:05d}", "*")))
    found = {}
    for path in paths:
      with gfile.GFile(path) as f:
        state = json.loads(f.read())
      if (state["num_shards"], state["rows_per_shard"]) != (self._ctx.num_shards, self._rows_per_shard):
        raise DataError(f"{path}: saved with num_shards={state['num_shards']} and "
                        f"{state['rows_per_shard']} rows per shard; this run has {self._ctx.num_shards} "
                        f"and {self._rows_per_shard}; keep data.num_shards and the batch size to resume")
      found.update({int(k): v for k, v in state["shards"].items()})
    missing = [s for s in self._shards if s not in found]
    if missing:
      raise DataError(f"{directory}: no saved input position for shards {missing}; "
                      "was the checkpoint written by a run with the same data config?")
    self.close()
    self._states = {s: found[s] for s in self._shards}


def _check_layout(global_batch_size, process_index, process_count, num_shards):
  if not 0 <= process_index < process_count:
    raise DataError(f"process_index={process_index} is outside 0..{process_count - 1}")
  if num_shards < 1 or num_shards % process_count:
    raise DataError(f"data.num_shards={num_shards} must be a positive multiple of the process count "
                    f"({process_count}); set --config.data.num_shards to e.g. {process_count * 8}")
  if global_batch_size % num_shards:
    raise DataError(f"the global batch size {global_batch_size} is not a multiple of data.num_shards="
                    f"{num_shards}; each shard gives the same number of rows, so change one of them")


def _check_model_fit(data_cfg, tokenizer, max_position_embeddings, model_vocab_size):
  if max_position_embeddings is not None and data_cfg.max_seq_length > max_position_embeddings:
    raise DataError(f"data.max_seq_length={data_cfg.max_seq_length} exceeds the model's "
                    f"max_position_embeddings={max_position_embeddings}; lower data.max_seq_length")
  if model_vocab_size is not None and tokenizer.vocab_size > model_vocab_size:
    raise DataError(f"vocabulary {data_cfg.vocab or '(embedded)'} has {tokenizer.vocab_size} entries, more "
                    f"than model.vocab_size={model_vocab_size}; raise model.vocab_size or use a smaller vocab")
  if not 0 < data_cfg.max_predictions_per_seq <= data_cfg.max_seq_length:
    raise DataError(f"data.max_predictions_per_seq={data_cfg.max_predictions_per_seq} must be in "
                    f"1..max_seq_length ({data_cfg.max_seq_length})")


def _tokenizer(data_cfg):
  vocab = data_cfg.vocab or embedded.ensure_embedded()[1]
  kind = "sentencepiece" if vocab.endswith(".model") else "wordpiece"
  if data_cfg.tokenizer != kind:
    raise DataError(f"data.tokenizer={data_cfg.tokenizer!r} but data.vocab={vocab!r} is a {kind} "
                    "vocabulary (*.model is SentencePiece, anything else a WordPiece vocab.txt)")
  return load_tokenizer(vocab, data_cfg.lower_case)


def _source(data_cfg, split, num_shards, stats):
  """(source, tokenized, holdout) for the split."""
  if split == "eval" and data_cfg.eval_corpus:
    files = corpora.list_files(data_cfg.eval_corpus, "data.eval_corpus")
    return corpora.TextSource(files, data_cfg.corpus_format, stats), False, None
  if split == "eval" and not 0 < data_cfg.eval_fraction < 1:
    raise DataError(f"split='eval' needs data.eval_corpus or 0 < data.eval_fraction < 1 "
                    f"(it is {data_cfg.eval_fraction})")
  holdout = None
  if not data_cfg.eval_corpus and data_cfg.eval_fraction > 0:
    holdout = (data_cfg.eval_fraction, split == "eval")
  if data_cfg.prepared:
    from data_pipelines import prepare  # pylint: disable=import-outside-toplevel
    files = corpora.list_files(data_cfg.prepared, "data.prepared")
    prepare.check_prepared(files, data_cfg)
    return corpora.RecordSource(files, stats), True, holdout
  if data_cfg.tfds_name:
    source = corpora.TfdsSource(data_cfg.tfds_name, data_cfg.tfds_split, data_cfg.tfds_feature,
                                data_cfg.tfds_data_dir, num_shards, stats)
    return source, False, holdout
  files = corpora.list_files(data_cfg.corpus) if data_cfg.corpus else [embedded.ensure_embedded()[0]]
  return corpora.TextSource(files, data_cfg.corpus_format, stats), False, holdout


def _context(data_cfg, split: str, seed: int, max_position_embeddings: int | None,
             model_vocab_size: int | None) -> _Context:
  """The shard streams' shared context; built this way in the main process and in every worker."""
  tokenizer = _tokenizer(data_cfg)
  _check_model_fit(data_cfg, tokenizer, max_position_embeddings, model_vocab_size)
  special = tokenizer.special_ids
  builder = BuilderConfig(data_cfg.example_builder, data_cfg.max_seq_length, special["[CLS]"],
                          special["[SEP]"], data_cfg.short_seq_prob, data_cfg.packing)
  masking = MaskingConfig(data_cfg.masking, data_cfg.mask_rate, data_cfg.max_predictions_per_seq,
                          special["[MASK]"], tokenizer.special_mask(), tokenizer.continuation_mask())
  if data_cfg.shuffle_buffer < 1:
    raise DataError(f"data.shuffle_buffer={data_cfg.shuffle_buffer}; use a positive number of documents")
  stats = corpora.Stats()
  source, tokenized, holdout = _source(data_cfg, split, data_cfg.num_shards, stats)
  return _Context(source, tokenized, tokenizer, builder, masking, feature_spec(data_cfg),
                  (data_cfg.seed, seed, 0 if split == "train" else 1), data_cfg.num_shards, holdout,
                  data_cfg.shuffle_buffer, data_cfg.max_seq_length, stats)


def make_pretrain_input(data_cfg, *, global_batch_size: int, process_index: int, process_count: int,
                        seed: int, split: str = "train", max_position_embeddings: int | None = None,
                        model_vocab_size: int | None = None) -> PretrainInput:
  """This host's share of the pretraining (or held-out eval) stream; see the module docstring."""
  if split not in ("train", "eval"):
    raise DataError(f"split={split!r}; use 'train' or 'eval'")
  num_shards = data_cfg.num_shards
  _check_layout(global_batch_size, process_index, process_count, num_shards)
  if data_cfg.num_workers < 0:
    raise DataError(f"data.num_workers={data_cfg.num_workers}; use 0 (build examples in this process) "
                    "or a positive number of worker processes")
  context_args = {"split": split, "seed": seed, "max_position_embeddings": max_position_embeddings,
                  "model_vocab_size": model_vocab_size}
  ctx = _context(data_cfg, **context_args)
  per_host = num_shards // process_count
  shards = range(process_index * per_host, (process_index + 1) * per_host)
  return PretrainInput(ctx, shards, global_batch_size // num_shards, process_index, data_cfg.num_workers,
                       {"data_cfg": data_cfg.to_dict(), **context_args})
