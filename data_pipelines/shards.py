"""Virtual shards: deterministic, resumable streams of unmasked rows, and the context they share.

The documents are split into `data.num_shards` virtual shards (by file when there are at least that
many files, else by a hash of each document's identity). A shard reads `data.shuffle_buffer` documents
at a time (a block), builds its rows with a generator seeded by (seeds, shard, block position) and
shuffles them. Each row carries a mask counter, (epoch, rows before it in the epoch), from which
features.py draws its mask: fresh every epoch with dynamic masking; with static masking epoch e
replays epoch e % dupe_factor, rows and masks alike (the original data creation's duplicates).
A shard's saved position is (block position, rows taken from the block, rows taken in the epoch).
"""
from __future__ import annotations

import dataclasses
import itertools
import json

import numpy as np
from etils import epath

from bert_jax import workdir
from bert_jax.data_pipelines import corpora, embedded, ernie, fairseq_spm, hf_tokenizer, knowledge, tokenizer_kinds
from bert_jax.data_pipelines.errors import DataError
from bert_jax.data_pipelines.examples import BuilderConfig, build_rows
from bert_jax.data_pipelines.features import feature_spec
from bert_jax.data_pipelines.masking import MaskingConfig, predictions_per_seq
from bert_jax.data_pipelines.tokenizers import kind_of_file, load_tokenizer

MASKING_MODES = ("dynamic", "static")
MASK_TOKENS = ("[MASK]", "[UNK]")
COUNTER_EPOCH_SHIFT = 40  # a row's mask counter = epoch << 40 | row in the epoch
STATE_FILE = "data_state.process{:05d}.json"  # one file of input positions per process


def write_state(directory: epath.PathLike, process_index: int, state: dict) -> None:
  """Writes one process's input positions into `directory` (local or gs://, through etils.epath)."""
  workdir.write_text(epath.Path(directory) / STATE_FILE.format(process_index), json.dumps(state))


def read_states(directory: epath.PathLike) -> list[tuple[epath.Path, dict]]:
  """(path, positions) of every process's file in `directory`, whatever the process count that wrote them."""
  return [(path, json.loads(path.read_text()))
          for path in sorted(epath.Path(directory).glob(STATE_FILE.replace("{:05d}", "*")))]


@dataclasses.dataclass
class Context:
  """Everything the shard streams share; `make_context` builds it from the config (also in workers)."""
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
  dupe_factor: int | None = None  # static masking: epochs repeat with this period
  encoder: object = None  # knowledge masking on text: knowledge.TaggedEncoder (ids carry the annotator's tags)
  reorder_share: float = 0.0  # data.example_builder="ernie": the share of sentence-reordering rows (ernie.py)


class ShardStream:
  """One virtual shard: a deterministic, resumable stream of (row, mask counter)."""

  def __init__(self, ctx: Context, shard: int, state: dict | None = None):
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

  def _epoch(self, epoch: int) -> int:
    """The epoch whose rows and masks `epoch` uses: itself, or its static duplicate."""
    return epoch % self.ctx.dupe_factor if self.ctx.dupe_factor else epoch

  def read_block(self, cursor):
    """(documents, cursor after them): up to block_documents documents from `cursor`, within one epoch."""
    epoch, position, offset, index = cursor
    order = np.random.default_rng([*self.ctx.seeds, self.shard, self._epoch(epoch)]).permutation(len(self.units))
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
    docs, next_cursor = self.read_block(cursor)
    if self.ctx.encoder is not None:
      docs = self.ctx.encoder.documents(docs)
    elif not self.ctx.tokenized:
      encode = self.ctx.tokenizer.encode
      docs = [[encode(s) for s in doc] for doc in docs]
    rng = np.random.default_rng([*self.ctx.seeds, self.shard, self._epoch(cursor[0]), *cursor[1:]])
    if self.ctx.builder.kind == "ernie":
      rows = ernie.build_rows(self.ctx.builder, docs, rng, self.ctx.stats, self.ctx.reorder_share)
    else:
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
      counter_base = self._epoch(cursor[0]) << COUNTER_EPOCH_SHIFT
      for row in rows[skip:]:
        counter = counter_base + index
        skip, index = skip + 1, index + 1
        self.state = {"cursor": cursor, "skip": skip, "index": index}
        yield row, counter
      if next_cursor[0] != cursor[0]:
        index = 0
      cursor, skip = next_cursor, 0
      self.state = {"cursor": cursor, "skip": 0, "index": index}


def _stack(rows, counters, shards, width: int) -> dict:
  """Unmasked rows as the padded arrays features.Featurizer takes (features.ROW_FIELDS)."""
  n = len(rows)
  ids, segments, documents = (np.zeros((n, width), np.int32) for _ in range(3))
  for i, row in enumerate(rows):
    ids[i, :len(row.ids)] = row.ids
    segments[i, :len(row.ids)] = row.segment_ids
    if row.document_ids is not None:
      documents[i, :len(row.ids)] = row.document_ids
  out = {"ids": ids, "length": np.array([len(r.ids) for r in rows], np.int32), "segment_ids": segments,
         "label": np.array([r.label for r in rows], np.int32), "document_ids": documents,
         "shard": np.array(shards, np.int64), "counter": np.array(counters, np.int64)}
  if rows and rows[0].extras is not None:  # the ernie builder's labels (ernie.py), -1 on padding
    for name in ernie.ROW_LABELS:
      out[name] = np.full((n, width), -1, np.int32)
      for i, row in enumerate(rows):
        out[name][i, :len(row.ids)] = row.extras[name]
    out.update({name: np.array([r.extras[name] for r in rows], np.int32) for name in ernie.SEQUENCE_LABELS})
    out["task_ids"] = np.zeros((n,), np.int32)
  return out


def shard_batches(ctx: Context, shards, states: dict, rows_per_shard: int, first: int = 0):
  """(key, unmasked rows of `shards` in shard order, their states after those rows) for batch 0, 1, ...; the rows'
  `step` is the batch's in the run, `first` + key (masking.rates_at: data.mask_rate_schedule)."""
  streams = [ShardStream(ctx, s, states[s]) for s in shards]
  iterators = [iter(s) for s in streams]
  for key in itertools.count():
    taken = [(next(it), s.shard) for it, s in zip(iterators, streams) for _ in range(rows_per_shard)]
    rows = [row for (row, _), _ in taken]
    rows = _stack(rows, [counter for (_, counter), _ in taken], [shard for _, shard in taken], ctx.max_seq_length)
    rows["step"] = np.full(len(taken), first + key, np.int64)
    yield key, rows, {s.shard: s.state for s in streams}


def check_layout(global_batch_size, process_index, process_count, num_shards):
  """Each process builds num_shards / process_count whole shards, each the same share of the global batch."""
  if not 0 <= process_index < process_count:
    raise DataError(f"process_index={process_index} is outside 0..{process_count - 1}")
  if num_shards < 1 or num_shards % process_count:
    raise DataError(f"data.num_shards={num_shards} must be a positive multiple of the process count "
                    f"({process_count}); set --config.data.num_shards to e.g. {process_count * 8}")
  if global_batch_size % num_shards:
    raise DataError(f"the global batch size {global_batch_size} is not a multiple of data.num_shards="
                    f"{num_shards}; each shard gives the same number of rows, so change one of them")


def check_model_fit(data_cfg, tokenizer, max_position_embeddings, model_vocab_size):
  if max_position_embeddings is not None and data_cfg.max_seq_length > max_position_embeddings:
    raise DataError(f"data.max_seq_length={data_cfg.max_seq_length} exceeds the model's "
                    f"max_position_embeddings={max_position_embeddings}; lower data.max_seq_length")
  if model_vocab_size is not None and tokenizer.vocab_size > model_vocab_size:
    raise DataError(f"vocabulary {data_cfg.vocab or '(embedded)'} has {tokenizer.vocab_size} entries, more "
                    f"than model.vocab_size={model_vocab_size}; raise model.vocab_size or use a smaller vocab")
  if not 0 < predictions_per_seq(data_cfg) <= data_cfg.max_seq_length:
    raise DataError(f"data.max_predictions_per_seq={predictions_per_seq(data_cfg)} must be in "
                    f"1..max_seq_length ({data_cfg.max_seq_length})")


def make_tokenizer(data_cfg):
  vocab = embedded.default_vocab(data_cfg)
  if data_cfg.tokenizer in tokenizer_kinds.names() and tokenizer_kinds.get(data_cfg.tokenizer).own_ids:
    # SentencePiece in a family's own id layout (CamemBERT's, XLM-R's, T5's, DeBERTa's)
    return load_tokenizer(vocab, kind=data_cfg.tokenizer)
  kind = kind_of_file(vocab)
  if data_cfg.tokenizer == hf_tokenizer.KIND and kind != hf_tokenizer.KIND:
    raise DataError(f"data.tokenizer={hf_tokenizer.KIND!r} reads a Hugging Face tokenizer.json: set data.vocab to "
                    f"one (data.vocab={vocab!r})")
  if data_cfg.tokenizer != kind:
    make = ("--type sentencepiece --model-type bpe" if data_cfg.tokenizer == "sentencepiece" else "--type wordpiece")
    if kind == "sentencepiece":  # the model may be right and the kind wrong
      raise DataError(f"data.tokenizer={data_cfg.tokenizer!r} but data.vocab={vocab!r} is a SentencePiece model: "
                      "read it with data.tokenizer=sentencepiece (ALBERT's ids), camembert_spm or xlmr_spm (fairseq's "
                      "sentencepiece.bpe.model: CamemBERT's, XLM-R's ids), or give a WordPiece vocab.txt (`bert-jax "
                      "vocab --type wordpiece --corpus 'text/*.txt' --output vocab/`)")
    raise DataError(f"data.tokenizer={data_cfg.tokenizer!r} but data.vocab={vocab!r} is a {kind} vocabulary "
                    f"(*.model is SentencePiece, *.json a Hugging Face tokenizer.json (data.tokenizer="
                    f"{hf_tokenizer.KIND}), anything else a WordPiece vocab.txt): make one with `bert-jax "
                    f"vocab {make} --corpus 'text/*.txt' --output vocab/`, or leave data.vocab empty for the "
                    "embedded corpus's")
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
    from bert_jax.data_pipelines import prepare  # pylint: disable=import-outside-toplevel
    files = corpora.list_files(data_cfg.prepared, "data.prepared")
    prepare.check_prepared(files, data_cfg)
    return corpora.RecordSource(files, stats, tagged=data_cfg.masking == "knowledge"), True, holdout
  if data_cfg.tfds_name:
    source = corpora.TfdsSource(data_cfg.tfds_name, data_cfg.tfds_split, data_cfg.tfds_feature,
                                data_cfg.tfds_data_dir, num_shards, stats)
    return source, False, holdout
  files = corpora.list_files(data_cfg.corpus) if data_cfg.corpus else [embedded.ensure_embedded()[0]]
  return corpora.TextSource(files, data_cfg.corpus_format, stats), False, holdout


def masking_config(data_cfg, tokenizer) -> MaskingConfig:
  if data_cfg.mask_token not in MASK_TOKENS:
    raise DataError(f"data.mask_token={data_cfg.mask_token!r}; choose one of {MASK_TOKENS}")
  if data_cfg.masking_mode not in MASKING_MODES:
    raise DataError(f"data.masking_mode={data_cfg.masking_mode!r}; choose one of {MASKING_MODES}")
  if data_cfg.masking_mode == "static" and data_cfg.dupe_factor < 1:
    raise DataError(f"data.dupe_factor={data_cfg.dupe_factor}; static masking needs at least 1 (BERT used 10)")
  if data_cfg.get("mask_rate_schedule") and (data_cfg.masking_mode == "static" or data_cfg.format != "text"):
    raise DataError(f"data.mask_rate_schedule={tuple(data_cfg.mask_rate_schedule)} changes the rate of masks drawn "
                    "as the run goes: it needs data.masking_mode=dynamic and data.format=text")
  special = tokenizer.special_ids
  k = data_cfg.knowledge
  return MaskingConfig(data_cfg.masking, data_cfg.mask_rate, predictions_per_seq(data_cfg),
                       special[data_cfg.mask_token], tokenizer.special_mask(), tokenizer.continuation_mask(),
                       data_cfg.trigram_shuffle_rate, (k.basic_weight, k.phrase_weight, k.entity_weight),
                       tuple(data_cfg.get("mask_rate_schedule", ())))


def seeds(data_cfg, split: str) -> tuple:
  """The one seed path from config to batch: data.seed and the split."""
  return (data_cfg.seed, 0 if split == "train" else 1)


def make_context(data_cfg, split: str, max_position_embeddings: int | None,
                 model_vocab_size: int | None) -> Context:
  """The shard streams' shared context; built this way in the main process and in every worker."""
  tokenizer = make_tokenizer(data_cfg)
  check_model_fit(data_cfg, tokenizer, max_position_embeddings, model_vocab_size)
  special = tokenizer.special_ids
  builder = BuilderConfig(data_cfg.example_builder, data_cfg.max_seq_length, special["[CLS]"],
                          special["[SEP]"], data_cfg.short_seq_prob, data_cfg.packing)
  masking = masking_config(data_cfg, tokenizer)
  if data_cfg.shuffle_buffer < 1:
    raise DataError(f"data.shuffle_buffer={data_cfg.shuffle_buffer}; use a positive number of documents")
  stats = corpora.Stats()
  source, tokenized, holdout = _source(data_cfg, split, data_cfg.num_shards, stats)
  encoder = None
  if data_cfg.masking == "knowledge" and not tokenized:
    encoder = knowledge.TaggedEncoder(tokenizer, knowledge.make_annotator(data_cfg.knowledge.spacy_model,
                                                                            data_cfg.knowledge.phrases))
  reorder_share = 0.0
  if builder.kind == "ernie":
    encoder, reorder_share = _ernie_encoder(data_cfg, tokenized, encoder, tokenizer)
  return Context(source, tokenized, tokenizer, builder, masking, feature_spec(data_cfg), seeds(data_cfg, split),
                 data_cfg.num_shards, holdout, data_cfg.shuffle_buffer, data_cfg.max_seq_length, stats,
                 data_cfg.dupe_factor if data_cfg.masking_mode == "static" else None, encoder, reorder_share)


def _ernie_encoder(data_cfg, tokenized: bool, encoder, tokenizer):
  """(encoder, share of reordering rows) of the ernie builder: its capitalisation labels come from the raw text."""
  if tokenized:
    raise DataError("data.example_builder='ernie' reads capitalisation from the raw text: train on data.corpus "
                    "(or the embedded corpus), not data.prepared records")
  share = data_cfg.get("ernie_reorder_share", 0.5)
  if not 0 <= share <= 1:
    raise DataError(f"data.ernie_reorder_share={share}: the share of sentence-reordering rows must be in [0, 1]")
  if encoder is None:
    return ernie.CasedEncoder(tokenizer.encode), share
  encoder.encode = ernie.cased(encoder.encode)  # knowledge masking's tags and the capital bit together
  return encoder, share


class ShardedInput:
  """What a host's input over its virtual shards shares (pipeline.PretrainInput, span_stream.SpanCorruptionInput):
  each shard's position (`_states`), saved and restored as one JSON file per process; the shard groups of
  data.num_workers' processes; the counted skips, a closed stage's too; `close`, which stops the running stage
  (`_stage`: `.close()`, and its workers' `.stats` where it has workers) so that the next batch starts again from
  the consumed position. A subclass starts its stage (`_source`: the object whose `next()` gives a batch and
  the shards' states, started where none runs), says what its saved position holds besides the shards'
  (`_position`), checks a saved one (`_check_position`) and words the error for shards without one (`_missing`)."""

  def __init__(self, ctx: Context, shards: range, rows_per_shard: int, process_index: int, num_workers: int,
               context_args: dict | None):
    self._ctx, self.tokenizer, self._shards = ctx, ctx.tokenizer, shards
    self._rows_per_shard, self._process_index = rows_per_shard, process_index
    self._states = {s: None for s in shards}
    groups = np.array_split(np.array(shards), min(num_workers, len(shards))) if num_workers else []
    self._groups = [[int(s) for s in g] for g in groups]
    self._context_args = context_args  # what rebuilds ctx in a worker: picklable, unlike the tokenizer and the source
    self._stage = None
    self._closed_worker_stats = corpora.Stats()

  @property
  def stats(self) -> dict:
    """Counted skips: skipped_lines (not UTF-8), skipped_files (binary), short_documents."""
    total = self._ctx.stats + self._closed_worker_stats
    for worker_stats in getattr(self._stage, "stats", []):
      total.update(worker_stats)
    return dict(total)

  def __iter__(self):
    return self

  def __next__(self) -> dict:
    source = self._source()
    try:
      batch, states = source.next()
    except BaseException:
      self.close()  # a stage failed or we were interrupted: the next call restarts from the consumed position
      raise
    self._states.update(states)
    return batch

  def close(self) -> None:
    """Stops the stage (threads, worker processes); the next `next()` starts again from the consumed position."""
    if self._stage is not None:
      for worker_stats in getattr(self._stage, "stats", []):
        self._closed_worker_stats.update(worker_stats)
      self._stage.close()
      self._stage = None

  def __del__(self):
    self.close()

  def save(self, directory: str) -> None:
    """Writes this process's shard positions to `directory` (one file per process)."""
    write_state(directory, self._process_index,
                {**self._position(), "shards": {str(s): self._states[s] for s in self._shards}})

  def restore(self, directory: str) -> dict:
    """Reads the positions of this host's shards from the files every process wrote (any host count); returns the
    last file's state (the fields of `_position`)."""
    found, state = {}, {}
    for path, state in read_states(directory):
      self._check_position(path, state)
      found.update({int(k): v for k, v in state["shards"].items()})
    missing = [s for s in self._shards if s not in found]
    if missing:
      raise DataError(self._missing(directory, missing))
    self.close()
    self._states = {s: found[s] for s in self._shards}
    return state
