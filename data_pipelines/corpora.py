"""Corpus readers: every source is a list of *units* (files or tfds sub-splits) read as a stream of documents.

A document is a list of sentences: strings for raw text, lists of token ids for prepared records.
Each reader starts at a saved position (byte offset or record index, plus the document index inside
the unit) and yields `(document, next_offset, next_index)`, so a resumed iterator can seek straight to
the block it was in. Nothing holds a whole file in memory: text is read line by line.
"""
from __future__ import annotations

import collections
import hashlib
import logging
import posixpath
import re
import struct
from typing import Iterator

from bert_jax.data_pipelines.errors import DataError
from bert_jax.data_pipelines.knowledge import join_ids
from bert_jax.data_pipelines.tftools import glob, isdir, open_binary, tf, tf_module

SENTENCE_PER_LINE = "sentence_per_line"
DOCUMENT_PER_LINE = "document_per_line"
_LINE_CHUNK_BYTES = 1 << 20
_MAX_LINE_BYTES = 64 << 20  # a longer "line" is a file without newlines, not a document
_BINARY_PROBE_BYTES = 4096
# A sentence ends at . ! ? (optionally closed by quotes/brackets) followed by space and a capital/digit/quote.
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])")

Stats = collections.Counter  # skipped_lines, overlong_lines, skipped_files, truncated_files, short_documents, ...


def split_sentences(text: str) -> list[str]:
  """Paragraphs (newlines) then sentence ends; deterministic and dependency free."""
  sentences = []
  for paragraph in text.splitlines():
    sentences.extend(s.strip() for s in _SENTENCE_END.split(paragraph) if s.strip())
  return sentences


def list_files(patterns: str, field: str = "data.corpus") -> list[str]:
  """Comma-separated globs (local or gs://) -> sorted unique files; a pattern matching nothing is an error."""
  files = set()
  for pattern in (p.strip() for p in patterns.split(",")):
    if not pattern:
      continue
    matched = glob(pattern)
    if not matched:
      raise DataError(f"{field}: {pattern!r} matches no file; check the path or glob")
    files.update(m for m in matched if not isdir(m))
  if not files:
    raise DataError(f"{field}: no files in {patterns!r}; pass a glob of text files")
  return sorted(files)


def document_hash(unit: str, index: int) -> int:
  """A stable 64-bit hash of a document's identity (file name and index), for host sharding and the
  eval hold-out. The directory is left out: the same corpus gives the same shards and the same
  held-out documents wherever it lies (another machine, a bucket, a resumed run after a move)."""
  name = posixpath.basename(str(unit).rstrip("/"))  # tfds units are split objects
  return int.from_bytes(hashlib.blake2b(f"{name}\0{index}".encode(), digest_size=8).digest(), "little")


def _looks_binary(path: str) -> bool:
  with open_binary(path) as f:
    return b"\0" in f.read(_BINARY_PROBE_BYTES)


def _read_line(f) -> tuple[bytes | None, int]:
  """(the next line, or None if it is longer than _MAX_LINE_BYTES; bytes consumed). A long line is read
  in chunks and dropped as soon as it passes the limit, so a file without newlines never fills memory."""
  chunks, size = [], 0
  while True:
    chunk = f.readline(_LINE_CHUNK_BYTES)
    size += len(chunk)
    if size <= _MAX_LINE_BYTES:
      chunks.append(chunk)
    if not chunk or chunk.endswith(b"\n"):
      return (b"".join(chunks) if size <= _MAX_LINE_BYTES else None), size


def _lines(path: str, offset: int, stats: Stats) -> Iterator[tuple[str | None, int]]:
  """(decoded line or None for a skipped one, byte offset after it); lines that are not UTF-8 text and
  lines over _MAX_LINE_BYTES are counted skips (skipped_lines, overlong_lines)."""
  with open_binary(path) as f:
    f.seek(offset)
    while True:
      raw, size = _read_line(f)
      if not size:
        return
      offset += size
      if raw is None:
        if not stats["overlong_lines"]:
          logging.warning("%s: skipping lines over %d MiB (counted in stats)", path, _MAX_LINE_BYTES >> 20)
        stats["overlong_lines"] += 1
        yield None, offset
        continue
      try:
        if b"\0" in raw:
          raise UnicodeDecodeError("utf-8", raw[:1], 0, 1, "NUL byte")
        yield raw.decode("utf-8").strip(), offset
      except UnicodeDecodeError:
        if not stats["skipped_lines"]:
          logging.warning("%s: skipping lines that are not UTF-8 text (counted in stats)", path)
        stats["skipped_lines"] += 1
        yield None, offset


class TextSource:
  """Plain text files: one sentence per line with blank lines between documents, or one document per line."""

  def __init__(self, files: list[str], corpus_format: str, stats: Stats):
    if corpus_format not in (SENTENCE_PER_LINE, DOCUMENT_PER_LINE):
      raise DataError(f"data.corpus_format={corpus_format!r}; use {SENTENCE_PER_LINE!r} or "
                      f"{DOCUMENT_PER_LINE!r}")
    self.units, self.format, self.stats = files, corpus_format, stats
    self._binary = {}

  def _skip_binary(self, path: str) -> bool:
    if path not in self._binary:
      self._binary[path] = _looks_binary(path)
      if self._binary[path]:
        logging.warning("%s: binary file (NUL bytes), skipped", path)
        self.stats["skipped_files"] += 1
    return self._binary[path]

  def read(self, unit: str, offset: int, index: int):
    if self._skip_binary(unit):
      return
    if self.format == DOCUMENT_PER_LINE:
      for line, offset in _lines(unit, offset, self.stats):
        if line:
          yield split_sentences(line), offset, index + 1
          index += 1
      return
    sentences = []
    for line, next_offset in _lines(unit, offset, self.stats):
      if line:
        sentences.append(line)
      elif line is not None and sentences:
        yield sentences, next_offset, index + 1
        index, sentences = index + 1, []
    if sentences:
      yield sentences, next_offset, index + 1


def read_unit(source, unit):
  """Every document of `unit` from its start, with an unreadable file as one DataError naming it."""
  try:
    yield from source.read(unit, 0, 0)
  except OSError as e:
    raise DataError(f"{unit}: cannot be read ({e.strerror or e}); check the file exists and is readable, "
                    "or leave it out of the corpus") from None
  except tf().errors.OpError as e:
    raise DataError(f"{unit}: cannot be read ({e.message.splitlines()[0]}); leave it out of the corpus") from None


def _tfrecords(path: str, offset: int) -> Iterator[tuple[bytes, int]]:
  """(payload, offset after it) from a TFRecord file, seekable (format: u64 len, u32 crc, data, u32 crc).
  A file that ends inside a record raises Truncated after the whole records before it."""
  with open_binary(path) as f:
    f.seek(offset)
    while True:
      header = f.read(12)
      if not header:
        return
      length = struct.unpack("<Q", header[:8])[0] if len(header) == 12 else None
      payload = f.read(length) if length is not None else b""
      footer = f.read(4)
      if length is None or len(payload) < length or len(footer) < 4:
        raise Truncated(path, offset, 16 + (length or 0), len(header) + len(payload) + len(footer))
      offset += 16 + length
      yield payload, offset


class Truncated(Exception):
  """A record file ends inside a record: at byte `offset`, `expected` bytes needed, `found` left."""

  def __init__(self, path: str, offset: int, expected: int, found: int):
    super().__init__(path, offset, expected, found)
    self.path, self.offset, self.expected, self.found = path, offset, expected, found

  def describe(self) -> str:
    return (f"{self.path} is truncated: its record at byte {self.offset:,} needs {self.expected:,} bytes, "
            f"the file holds {self.found:,} more (a copy or a write that was cut short)")


def find_truncation(path: str) -> Truncated | None:
  """Where the record file at `path` is cut short, by walking its records' lengths; None when whole."""
  try:
    for _ in _tfrecords(path, 0):
      pass
  except Truncated as e:
    return e
  return None


class RecordSource:
  """Records written by `bert-jax data prepare`: one tf.train.Example per document (ids + sentence lengths, and
  `units`, the knowledge tags, when prepared with --knowledge)."""

  def __init__(self, files: list[str], stats: Stats, tagged: bool = False):
    self.units, self.stats, self.tagged = files, stats, tagged  # tagged: ids carry `units` (knowledge.py)
    self._truncated: set[str] = set()

  def read(self, unit: str, offset: int, index: int):
    example_cls = tf().train.Example
    try:
      for payload, offset in _tfrecords(unit, offset):
        features = example_cls.FromString(payload).features.feature
        ids = features["ids"].int64_list.value
        if self.tagged and "units" in features:
          ids = join_ids(ids, features["units"].int64_list.value)
        sentences, start = [], 0
        for length in features["lengths"].int64_list.value:
          sentences.append(list(ids[start:start + length]))
          start += length
        yield sentences, offset, index + 1
        index += 1
    except Truncated as e:
      if unit not in self._truncated:  # once per file, not once per epoch
        self._truncated.add(unit)
        self.stats["truncated_files"] += 1
        logging.warning("%s; this run reads the %d documents before that record and skips the rest of the file "
                        "(counted in stats as truncated_files); write it again with `bert-jax data prepare` to "
                        "train on all of it", e.describe(), index)


class TfdsSource:
  """A tfds text dataset, split into `num_units` even sub-splits; each record's text feature is one document."""

  def __init__(self, name: str, split: str, feature: str, data_dir: str, num_units: int, stats: Stats):
    tfds = tf_module("tensorflow_datasets")
    self._tfds, self.feature, self.stats = tfds, feature, stats
    try:
      self._builder = tfds.builder(name, data_dir=data_dir or None)
      self.units = tfds.even_splits(split, n=num_units)
    except Exception as e:  # tfds raises many types for unknown names / unprepared data
      raise DataError(f"data.tfds_name={name!r}: {e}; prepare it with `tfds build {name}` "
                      "and set data.tfds_data_dir") from None
    if feature not in self._builder.info.features:
      raise DataError(f"data.tfds_feature={feature!r} is not a feature of {name}; it has "
                      f"{sorted(self._builder.info.features)}")

  def read(self, unit: str, offset: int, index: int):
    ds = self._builder.as_dataset(split=unit, shuffle_files=False).skip(offset)
    for record in self._tfds.as_numpy(ds):
      offset, index = offset + 1, index + 1
      text = record[self.feature]
      try:
        text = text.decode("utf-8") if isinstance(text, bytes) else str(text)
      except UnicodeDecodeError:
        self.stats["skipped_lines"] += 1
        continue
      yield split_sentences(text), offset, index
