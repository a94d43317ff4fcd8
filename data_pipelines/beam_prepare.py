"""`bert-jax data prepare --runner R`: both formats as an Apache Beam pipeline, writing the very shards the
in-process path writes (prepare.py, prepare_rows.py), byte for byte, on any runner and worker count.

    units (files, or tfds sub-splits) -> Reshuffle -> read: documents keyed by (content hash, unit, index)
      -> Reshuffle -> tokenize -+-> documents: grouped by unit, put back in input order -> one shard per file
                                +-> rows: grouped by virtual shard -> the shard's ShardStream over them
                                    (MemorySource) -> masked rows -> one shard per virtual shard
    the shards' counts (a side input, so after every shard) -> metadata.json

Why the same bytes: a document's tokens depend on its text only; a shard's documents are put back in
input order before anything is built from them; the rows' pairing and NSP draws come from (seed, shard,
epoch, the block's position in the input) and the masks from (seed, shard, row counter) (shards.py,
features.py): positions in the input, never the order in which workers ran. The reads and the
tokenization spread over all workers (the second Reshuffle breaks fusion, so a corpus of a few large
files still tokenizes in parallel); rows are built per virtual shard, so `data.num_shards` bounds that
step's parallelism and a shard's tokenized documents must fit one worker's memory. A retried bundle
rewrites its shard through `.tmp` with the same bytes.
"""
from __future__ import annotations

import bisect
import collections
import dataclasses
import hashlib
import os

from ml_collections import ConfigDict

from bert_jax.data_pipelines import beam_runner, corpora, embedded, prepare, prepare_rows
from bert_jax.data_pipelines.shards import make_context
from bert_jax.data_pipelines.tftools import tf
from bert_jax.data_pipelines.tokenizers import load_tokenizer

beam = beam_runner.import_beam()
# A document between the steps is a tuple (unit position, index after it in its unit, offset after it in its
# unit, identity hash (corpora.document_hash), sentences: strings, token id lists after `tokenize`).


@dataclasses.dataclass(frozen=True)
class TextCorpus:
  """Text files and the vocabulary to tokenize them with (the documents format, the tfds builder)."""
  files: tuple
  corpus_format: str
  vocab: str
  lower_case: bool

  def open(self):
    """(reader, tokenizer) in a worker."""
    source = corpora.TextSource(list(self.files), self.corpus_format, corpora.Stats())
    return source, load_tokenizer(self.vocab, self.lower_case)


@dataclasses.dataclass(frozen=True)
class ConfigCorpus:
  """A config's corpus (text, prepared records or tfds) as its data section reads it (the rows format)."""
  data_cfg: dict
  split: str

  def open(self):
    """(reader, tokenizer, or None when the reader yields token ids already) in a worker."""
    ctx = make_context(ConfigDict(self.data_cfg), self.split, None, None)
    return ctx.source, None if ctx.tokenized else ctx.tokenizer


class _ReadUnit(beam.DoFn):
  """A unit position -> its documents, keyed by (content hash, unit, index); its skip counts to `stats`."""

  def __init__(self, corpus):
    self._corpus, self._source = corpus, None

  def setup(self):
    self._source, _ = self._corpus.open()

  def process(self, position: int):
    unit = self._source.units[position]
    for sentences, offset, index in corpora.read_unit(self._source, unit):
      content = hashlib.blake2b(repr(sentences).encode(), digest_size=8).hexdigest()
      yield (content, position, index), (position, index, offset, corpora.document_hash(unit, index - 1), sentences)
    yield beam.pvalue.TaggedOutput("stats", dict(self._source.stats))
    self._source.stats.clear()


class _Tokenize(beam.DoFn):
  """A keyed document -> the document with its sentences as token ids (as they are when the reader gives ids)."""

  def __init__(self, corpus):
    self._corpus, self._tokenizer = corpus, None

  def setup(self):
    _, self._tokenizer = self._corpus.open()

  def process(self, keyed):
    _, (position, index, offset, identity, sentences) = keyed
    if self._tokenizer is not None:
      sentences = [self._tokenizer.encode(s) for s in sentences]
    yield position, index, offset, identity, sentences


def read_documents(pipeline, corpus, num_units: int):
  """(units: the unit positions, documents: tokenized document tuples, stats: each unit's skip counts)."""
  units = pipeline | "units" >> beam.Create(list(range(num_units)))
  read = (units | "spread units" >> beam.Reshuffle()
          | "read" >> beam.ParDo(_ReadUnit(corpus)).with_outputs("stats", main="documents"))
  # keyed by (content hash, unit, index): unique, spread evenly by the hash, and a retried read gives the same keys
  documents = (read.documents | "spread documents" >> beam.transforms.util.ReshufflePerKey()
               | "tokenize" >> beam.ParDo(_Tokenize(corpus)))
  return units, documents, read.stats


def _with_every(key_name: str, keys, keyed):
  """keyed (key, value) grouped by key, with a group for every key in `keys`, even one with no value."""
  return ({key_name: keys | f"{key_name} keys" >> beam.Map(lambda k: (k, k)), "documents": keyed}
          | f"group by {key_name}" >> beam.CoGroupByKey())


class _WriteDocuments(beam.DoFn):
  """(unit, its documents) -> the unit's shard of document records, in input order; yields its count."""

  def __init__(self, output_dir: str, num_files: int):
    self._output_dir, self._num_files = output_dir, num_files

  def process(self, grouped):
    position, groups = grouped
    documents = sorted(groups["documents"])
    t = tf()
    records = (prepare.document_record(t, ids) for ids in (prepare.document_ids(doc) for _, doc in documents) if ids)
    yield prepare.write_records(os.path.join(self._output_dir, prepare.shard_name(position, self._num_files)), records)


def _finish_documents(_, corpus: str, text: TextCorpus, output_dir: str, counts, stats) -> None:
  total = collections.Counter()
  for unit_stats in stats:
    total.update(unit_stats)
  prepare.write_metadata(output_dir, prepare.documents_metadata(
      corpus, text.vocab, text.lower_case, sum(counts), len(text.files), total))


def documents_graph(pipeline, corpus: str, text: TextCorpus, output_dir: str) -> None:
  """The documents format's steps on `pipeline`: `text`'s files -> shards and metadata.json in output_dir."""
  units, documents, stats = read_documents(pipeline, text, len(text.files))
  by_unit = documents | "key by unit" >> beam.Map(lambda d: (d[0], (d[1], d[4])))
  counts = _with_every("unit", units, by_unit) | "write" >> beam.ParDo(_WriteDocuments(output_dir, len(text.files)))
  _ = (pipeline | "finish" >> beam.Create([None])
       | "metadata" >> beam.Map(_finish_documents, corpus, text, output_dir, counts=beam.pvalue.AsList(counts),
                                stats=beam.pvalue.AsList(stats)))


def prepare_documents(corpus: str, output_dir: str, args: list[str], vocab: str = "", lower_case: bool = True,
                      corpus_format: str = corpora.SENTENCE_PER_LINE, overwrite: bool = False) -> dict:
  """prepare.prepare on Beam (runner and options in `args`: beam_runner.pipeline_args); returns the metadata."""
  files = prepare.corpus_files(corpus)
  text = TextCorpus(tuple(files), corpus_format, vocab or embedded.ensure_embedded()[1], lower_case)
  beam_runner.check_reachable(args, {"--corpus": files, "--vocab": [text.vocab], "--output": [output_dir]})
  text.open()  # a bad vocabulary or corpus format: one line before any job starts
  prepare.claim_output(output_dir, overwrite)
  with prepare.discarding_on_failure(output_dir):
    beam_runner.run(args, lambda p: documents_graph(p, corpus, text, output_dir), f"--corpus {corpus or '(embedded)'}")
  return prepare.read_metadata(output_dir)


class MemorySource:
  """One virtual shard's documents, read and tokenized upstream, served through the corpus readers'
  interface (corpora.py): by unit, from a saved position, each with the position after it. The shard's
  ShardStream over it reads what it would read from the files (its other documents are not here, and it
  would have skipped them)."""

  def __init__(self, units, documents):
    self.units, self.stats = units, corpora.Stats()
    by_unit = collections.defaultdict(list)
    for position, index, offset, _, sentences in documents:
      by_unit[position].append((offset, index, sentences))
    self._documents = {str(units[position]): sorted(docs) for position, docs in by_unit.items()}

  def read(self, unit, offset: int, index: int):
    del index  # a saved position's offset is that of a document here, and offsets rise within a unit
    documents = self._documents.get(str(unit), [])
    for next_offset, next_index, sentences in documents[bisect.bisect_right(documents, offset, key=lambda d: d[0]):]:
      yield sentences, next_offset, next_index


class _WriteRows(beam.DoFn):
  """(virtual shard, its documents) -> the shard's rows file; yields (file name, rows)."""

  def __init__(self, corpus: ConfigCorpus, epochs: int, output_dir: str):
    self._corpus, self._epochs, self._output_dir, self._ctx = corpus, epochs, output_dir, None

  def setup(self):
    self._ctx = make_context(ConfigDict(self._corpus.data_cfg), self._corpus.split, None, None)

  def process(self, grouped):
    shard, groups = grouped
    source = MemorySource(self._ctx.source.units, groups["documents"])
    ctx = dataclasses.replace(self._ctx, source=source, tokenized=True, stats=source.stats)
    name = prepare.shard_name(shard, ctx.num_shards)
    yield name, prepare_rows.write_shard(ctx, shard, self._epochs, os.path.join(self._output_dir, name))


def _shard_of(document: tuple, num_shards: int, by_unit: bool) -> int:
  """The virtual shard a document belongs to, as ShardStream assigns it (shards.py)."""
  return document[0] % num_shards if by_unit else (document[3] >> 32) % num_shards


def _finish_rows(_, corpus: ConfigCorpus, epochs: int, output_dir: str, counts) -> None:
  data_cfg = ConfigDict(corpus.data_cfg)
  prepare.write_metadata(output_dir, prepare_rows.rows_metadata(data_cfg, corpus.split, epochs, dict(counts)))


def rows_graph(pipeline, corpus: ConfigCorpus, num_units: int, epochs: int, output_dir: str) -> None:
  """The rows format's steps on `pipeline`: the config's corpus (`num_units` units) -> shards and metadata.json."""
  num_shards = corpus.data_cfg["num_shards"]
  by_unit = num_units >= num_shards
  _, documents, _ = read_documents(pipeline, corpus, num_units)
  by_shard = documents | "key by shard" >> beam.Map(lambda d: (_shard_of(d, num_shards, by_unit), d))
  shards = pipeline | "shards" >> beam.Create(list(range(num_shards)))
  counts = _with_every("shard", shards, by_shard) | "write" >> beam.ParDo(_WriteRows(corpus, epochs, output_dir))
  _ = (pipeline | "finish" >> beam.Create([None])
       | "metadata" >> beam.Map(_finish_rows, corpus, epochs, output_dir, counts=beam.pvalue.AsList(counts)))


def prepare_rows_on_beam(config, output_dir: str, args: list[str], epochs: int = 1, split: str = "train",
                         overwrite: bool = False) -> dict:
  """prepare_rows.prepare_rows on Beam (runner and options in `args`); returns the metadata."""
  data_cfg = config.data
  prepare_rows.check_request(data_cfg, epochs)
  ctx = make_context(data_cfg, split, None, None)  # bad vocabulary, corpus or builder: one line, before the job
  units = [str(u) for u in ctx.source.units]
  beam_runner.check_reachable(args, {"data.corpus": units if not data_cfg.tfds_name else [],
                                     "data.vocab": [embedded.default_vocab(data_cfg)],
                                     "--output": [output_dir]})
  prepare.claim_output(output_dir, overwrite)
  corpus = ConfigCorpus(data_cfg.to_dict(), split)
  with prepare.discarding_on_failure(output_dir):
    beam_runner.run(args, lambda p: rows_graph(p, corpus, len(units), epochs, output_dir),
                    f"data.corpus ({units[0]}{', ...' if len(units) > 1 else ''})")
  return prepare.read_metadata(output_dir)
