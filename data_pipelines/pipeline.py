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
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import os
import threading

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


class PretrainInput:
  """Iterable of this host's rows of each global batch; `save`/`restore` its position."""

  def __init__(self, ctx: _Context, tokenizer, shards: range, rows_per_shard: int, process_index: int):
    self._ctx, self.tokenizer, self._shards = ctx, tokenizer, shards
    self._rows_per_shard, self._process_index = rows_per_shard, process_index
    self._states = {s: None for s in shards}
    self._iterator = None
    self._error = None
    self._snapshots, self._lock = {}, threading.Lock()

  @property
  def stats(self) -> dict:
    """Counted skips: skipped_lines (not UTF-8), skipped_files (binary), short_documents."""
    return dict(self._ctx.stats)

  @property
  def spec(self) -> dict:
    return self._ctx.spec

  def _batches(self):
    streams = [_ShardStream(self._ctx, s, self._states[s]) for s in self._shards]
    iterators = [iter(s) for s in streams]
    try:
      for key in itertools.count():
        rows = [next(it) for it in iterators for _ in range(self._rows_per_shard)]
        with self._lock:
          self._snapshots[key] = {s.shard: s.state for s in streams}
        yield key, {name: np.stack([r[name] for r in rows]) for name in self._ctx.spec}
    except DataError as e:
      self._error = e
      raise

  def _dataset(self):
    t = tf()
    b = len(self._shards) * self._rows_per_shard
    shapes = {"B": b, "T": self._ctx.max_seq_length, "P": self._ctx.masking.max_predictions}
    signature = {name: t.TensorSpec([shapes[d] for d in dims], dtype)
                 for name, (dtype, dims, _) in self._ctx.spec.items()}
    ds = t.data.Dataset.from_generator(
        self._batches, output_signature=(t.TensorSpec([], t.int64), signature))
    return ds.prefetch(2)

  def __iter__(self):
    return self

  def __next__(self) -> dict:
    if self._iterator is None:
      self._snapshots.clear()
      self._iterator = self._dataset().as_numpy_iterator()
    try:
      key, batch = next(self._iterator)
    except Exception as e:  # tf wraps generator errors; surface ours as they were raised
      if self._error is not None:
        raise self._error from None
      raise
    with self._lock:
      self._states.update(self._snapshots.pop(key))
      for old in [k for k in self._snapshots if k < key]:
        del self._snapshots[old]
    return batch

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
    self._states = {s: found[s] for s in self._shards}
    self._iterator = None


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


def make_pretrain_input(data_cfg, *, global_batch_size: int, process_index: int, process_count: int,
                        seed: int, split: str = "train", max_position_embeddings: int | None = None,
                        model_vocab_size: int | None = None) -> PretrainInput:
  """This host's share of the pretraining (or held-out eval) stream; see the module docstring."""
  if split not in ("train", "eval"):
    raise DataError(f"split={split!r}; use 'train' or 'eval'")
  num_shards = data_cfg.num_shards
  _check_layout(global_batch_size, process_index, process_count, num_shards)
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
  source, tokenized, holdout = _source(data_cfg, split, num_shards, stats)
  ctx = _Context(source, tokenized, tokenizer, builder, masking, feature_spec(data_cfg),
                 (data_cfg.seed, seed, 0 if split == "train" else 1), num_shards, holdout,
                 data_cfg.shuffle_buffer, data_cfg.max_seq_length, stats)
  per_host = num_shards // process_count
  shards = range(process_index * per_host, (process_index + 1) * per_host)
  return PretrainInput(ctx, tokenizer, shards, global_batch_size // num_shards, process_index)
