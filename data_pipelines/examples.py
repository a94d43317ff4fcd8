"""Example builders: tokenized documents of one shuffle block -> unmasked rows.

A document is a list of sentences, each a list of token ids (no specials). Every builder returns
`Row`s whose `ids` already hold [CLS]/[SEP]; masking and padding come later (masking.py, pipeline.py).
NSP follows google-research/bert create_pretraining_data.py (target length with short_seq_prob,
random B from another document, random-side truncation); the random document comes from the same
block of documents instead of the whole corpus, which is what lets the builder stream. SOP (ALBERT)
swaps the two consecutive segments half the time. SSO (StructBERT's sentence objective) cuts the
segments as NSP does and takes, 1/3 each, B the next segment (label 0), B the previous one (A and B
swapped, label 1) or B from another document (label 2).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from bert_jax.data_pipelines.corpora import Stats
from bert_jax.data_pipelines.errors import DataError

# ernie: ernie.py builds its rows; span_corruption: raw chunks that span_stream.py corrupts and packs
BUILDERS = ("nsp", "sop", "sso", "full_sentences", "doc_sentences", "ernie", "span_corruption")
PAIR_BUILDERS = ("nsp", "sop", "sso", "ernie")
_OPEN_ROWS = 32  # packing looks for room in this many most recent rows (bounds the cost per piece)


@dataclasses.dataclass
class Row:
  ids: list[int]
  segment_ids: list[int]
  label: int = 0  # NSP: 1 = random B; SOP: 1 = swapped; SSO: 1 = B precedes A, 2 = random B; else 0
  document_ids: list[int] | None = None  # packing only: 1..k per packed document
  extras: dict | None = None  # the "ernie" builder's labels (ernie.py): name -> per-token list or int


@dataclasses.dataclass(frozen=True)
class BuilderConfig:
  kind: str
  max_seq_length: int
  cls_id: int
  sep_id: int
  short_seq_prob: float = 0.1
  packing: bool = False

  def __post_init__(self):
    if self.kind not in BUILDERS:
      raise DataError(f"data.example_builder={self.kind!r}; choose one of {BUILDERS}")
    if self.packing and self.kind in PAIR_BUILDERS:
      raise DataError("data.packing=True packs whole documents and has no sentence pairs; use "
                      "data.example_builder=full_sentences or doc_sentences, or packing=False")
    if self.max_seq_length < 8:
      raise DataError(f"data.max_seq_length={self.max_seq_length} is too short; use at least 8")


def _truncate_pair(a, b, max_tokens, rng):
  """Trim the longer side, from the front or back at random, as the original truncate_seq_pair."""
  while len(a) + len(b) > max_tokens:
    longer = a if len(a) > len(b) else b
    if rng.random() < 0.5:
      del longer[0]
    else:
      longer.pop()


def _pair_row(cfg, a, b, label):
  ids = [cfg.cls_id, *a, cfg.sep_id, *b, cfg.sep_id]
  return Row(ids, [0] * (len(a) + 2) + [1] * (len(b) + 1), label)


def _random_b(docs, doc_index, target, rng):
  other = doc_index
  for _ in range(10):
    other = int(rng.integers(len(docs)))
    if other != doc_index:
      break
  doc = docs[other]
  b = []
  for sentence in doc[int(rng.integers(len(doc))):]:
    b.extend(sentence)
    if len(b) >= target:
      break
  return b


def _split_chunk(cfg, chunk, docs, doc_index, target, rng):
  """One (A, B, label) from a chunk of sentences, or None when the chunk cannot make a pair."""
  a_end = int(rng.integers(1, len(chunk))) if len(chunk) >= 2 else 1
  a = [t for s in chunk[:a_end] for t in s]
  if cfg.kind == "nsp":
    if len(chunk) == 1 or rng.random() < 0.5:
      return a, _random_b(docs, doc_index, target - len(a), rng), 1, len(chunk) - a_end
    return a, [t for s in chunk[a_end:] for t in s], 0, 0
  if cfg.kind == "sso" and rng.random() < 1 / 3:
    return a, _random_b(docs, doc_index, target - len(a), rng), 2, len(chunk) - a_end
  if len(chunk) == 1:  # SOP and SSO need two consecutive pieces: cut the lone sentence
    if len(a) < 2:
      return None
    cut = int(rng.integers(1, len(a)))
    a, b = a[:cut], a[cut:]
  else:
    b = [t for s in chunk[a_end:] for t in s]
  if rng.random() < 0.5:
    return b, a, 1, 0
  return a, b, 0, 0


def _pairs_from_document(cfg, docs, doc_index, rng, stats) -> list[Row]:
  doc, max_tokens = docs[doc_index], cfg.max_seq_length - 3
  target = max_tokens
  if rng.random() < cfg.short_seq_prob:
    target = int(rng.integers(2, max_tokens + 1))
  rows, chunk, length, i = [], [], 0, 0
  while i < len(doc):
    chunk.append(doc[i])
    length += len(doc[i])
    if i == len(doc) - 1 or length >= target:
      pair = _split_chunk(cfg, chunk, docs, doc_index, target, rng)
      if pair is None:
        stats["short_documents"] += 1
      else:
        a, b, label, unused = pair
        i -= unused
        _truncate_pair(a, b, max_tokens, rng)
        if a and b:
          rows.append(_pair_row(cfg, a, b, label))
      chunk, length = [], 0
    i += 1
  return rows


def _segments(doc, capacity):
  """Consecutive sentences of one document in pieces of at most `capacity` tokens (long sentences cut)."""
  piece = []
  for sentence in doc:
    for start in range(0, len(sentence), capacity):
      part = sentence[start:start + capacity]
      if len(piece) + len(part) > capacity:
        yield piece
        piece = []
      piece = piece + part
  if piece:
    yield piece


def _single_rows(cfg, docs) -> list[Row]:
  """FULL-SENTENCES (crossing documents, [SEP] between them) or DOC-SENTENCES (one document per row)."""
  capacity = cfg.max_seq_length - 2
  if cfg.kind == "doc_sentences":
    pieces = [p for doc in docs for p in _segments(doc, capacity)]
  else:
    stream = [s for doc in docs for s in (*doc, [cfg.sep_id])][:-1]
    pieces = list(_segments(stream, capacity))
  return [Row([cfg.cls_id, *p, cfg.sep_id], [0] * (len(p) + 2)) for p in pieces]


def _packed_rows(cfg, docs) -> list[Row]:
  """First-fit packing of document pieces, each [CLS] piece [SEP], into rows of max_seq_length."""
  capacity, rows = cfg.max_seq_length, []
  pieces = [p for doc in docs for p in _segments(doc, capacity - 2)]
  for piece in pieces:
    tokens = [cfg.cls_id, *piece, cfg.sep_id]
    for row in rows[-_OPEN_ROWS:]:
      if len(row.ids) + len(tokens) <= capacity:
        break
    else:
      row = Row([], [], 0, [])
      rows.append(row)
    row.ids.extend(tokens)
    row.document_ids.extend([(row.document_ids[-1] if row.document_ids else 0) + 1] * len(tokens))
  for row in rows:
    row.segment_ids = [0] * len(row.ids)
  return rows


def _chunk_rows(cfg, docs) -> list[Row]:
  """T5's reduce_concat_tokens + split_tokens over one block: its documents' tokens end to end (no specials), cut
  every cfg.max_seq_length tokens (the raw length random_spans_helper derives); the block's last piece is shorter."""
  tokens = np.fromiter((t for doc in docs for s in doc for t in s), np.int32)
  n = cfg.max_seq_length
  return [Row(tokens[i:i + n], []) for i in range(0, len(tokens), n)]


def build_rows(cfg: BuilderConfig, docs: list[list[list[int]]], rng: np.random.Generator,
               stats: Stats) -> list[Row]:
  """All rows from one block of tokenized documents, in block order (the caller shuffles)."""
  if cfg.kind == "ernie":
    raise ValueError("data.example_builder='ernie' rows come from data_pipelines/ernie.py:build_rows")
  docs = [d for d in ([s for s in doc if s] for doc in docs) if d]
  if cfg.kind == "span_corruption":
    return _chunk_rows(cfg, docs)
  if cfg.packing:
    return _packed_rows(cfg, docs)
  if cfg.kind not in PAIR_BUILDERS:
    return _single_rows(cfg, docs)
  rows = []
  for i in range(len(docs)):
    rows.extend(_pairs_from_document(cfg, docs, i, rng, stats))
  return rows
