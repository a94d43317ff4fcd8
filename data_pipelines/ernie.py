"""ERNIE 2.0's rows (Sun et al. 2019, "ERNIE 2.0: A Continual Pre-training Framework for Language
Understanding"): the labels of its word-aware and structure-aware tasks, computed from the text when the
rows are built (data.example_builder="ernie"), so the model reads only the inputs.

Word-aware (every real token but [CLS]/[SEP]; -1 elsewhere):
- capitalisation (`capital_labels`): 1 when the token's word starts with a capital letter. The text is
  encoded word by word (whitespace words, where WordPiece and the basic tokenizer cut anyway) and each
  id carries its word's capital in bit CAPITAL_BIT; the builder takes the bit off, so the ids the model
  reads are those of the lower-cased text of an uncased vocabulary.
- token-document relation (`token_doc_labels`): 1 when the token (its id) appears in the sentences of its
  document that are not in the row ("other segments of the original document").
Structure-aware (one label per row, -1 where the row is not of that kind): a row is, at random
(data.ernie_reorder_share of them), one of
- sentence reordering (`reorder_labels`): one or two runs of consecutive sentences cut into k = 1, 2
  or 3 pieces (at sentence boundaries when there are k sentences, else inside them), shown in a random
  order as [CLS] p1 [SEP] p2 [SEP] ... ; the label is the order's index among the sum_k k! = 9
  permutations of REORDER_CLASSES (the identity of 1 piece is class 0);
- sentence distance (`distance_labels`): a pair [CLS] A [SEP] B [SEP] of runs, B the run after A (0), a
  run of A's document not next to it (1), or one from another document (2), 1/3 each; a run whose document
  cannot give the distance drawn makes a reordering row instead, so the three stay about balanced.
A run is at most half a pair's tokens and a third of its document's (`_segments`), so short documents give
all three distances too.
Knowledge masking's tags (knowledge.py) ride on the ids unchanged. The semantic-aware tasks read labelled
files instead: `read_labelled`.
"""
from __future__ import annotations

import collections
import itertools

import numpy as np

from bert_jax.data_pipelines.errors import DataError
from bert_jax.data_pipelines.examples import Row, _truncate_pair
from bert_jax.data_pipelines.knowledge import ID_MASK
from bert_jax.data_pipelines.tftools import open_binary

CAPITAL_BIT = 29  # above knowledge's tags (bits 24..26)
_CAPITAL = 1 << CAPITAL_BIT
REORDER_CLASSES = tuple(p for k in (1, 2, 3) for p in itertools.permutations(range(k)))  # 9 orders
DISTANCE_CLASSES = 3  # adjacent, same document not adjacent, another document
ROW_LABELS = ("capital_labels", "token_doc_labels")  # per token; -1 where no label
SEQUENCE_LABELS = ("reorder_labels", "distance_labels")  # per row; -1 where no label


def cased(encode):
  """`encode(text)` for an uncased tokenizer, each id marked (bit CAPITAL_BIT) when its whitespace word
  starts with a capital letter."""
  def encode_cased(text: str) -> list[int]:
    ids = []
    for word in text.split():
      mark = _CAPITAL if word[0].isupper() else 0
      ids.extend(i | mark for i in encode(word))
    return ids
  return encode_cased


class CasedEncoder:
  """Documents (lists of sentence strings) -> lists of ids with the capital bit (`cased`)."""

  def __init__(self, encode):
    self.encode = cased(encode)

  def documents(self, docs: list[list[str]]) -> list[list[list[int]]]:
    return [[self.encode(s) for s in doc] for doc in docs]


def reorder_label(order) -> int:
  """The class of showing pieces p_0..p_{k-1} in the order p_order[0], p_order[1], ..."""
  return REORDER_CLASSES.index(tuple(int(i) for i in order))


def _plain(i: int) -> int:
  return i & ID_MASK


class _Document:
  """A document's sentences and its token counts, to ask which ids occur outside some of its sentences."""

  def __init__(self, sentences):
    self.sentences = sentences
    self.counts = collections.Counter(_plain(i) for s in sentences for i in s)

  def outside(self, used) -> collections.Counter:
    """Token counts of the sentences not in `used` (sentence indices)."""
    inside = collections.Counter(_plain(i) for k in used for i in self.sentences[k])
    return self.counts - inside


def _token_labels(piece, outside) -> tuple[list[int], list[int], list[int]]:
  """(ids without the capital bit, capital labels, token-document labels) of one piece."""
  return ([i & ~_CAPITAL for i in piece], [(i >> CAPITAL_BIT) & 1 for i in piece],
          [int(outside[_plain(i)] > 0) for i in piece])


def _assemble(cfg, pieces, reorder: int, distance: int) -> Row:
  """[CLS] piece [SEP] piece [SEP] ...: pieces are (ids, outside counts, segment id)."""
  ids, segments, capital, token_doc = [cfg.cls_id], [0], [-1], [-1]
  for piece, outside, segment in pieces:
    plain, cap, rel = _token_labels(piece, outside)
    ids += [*plain, cfg.sep_id]
    segments += [segment] * (len(piece) + 1)
    capital += [*cap, -1]
    token_doc += [*rel, -1]
  return Row(ids, segments, 0, extras={"capital_labels": capital, "token_doc_labels": token_doc,
                                       "reorder_labels": reorder, "distance_labels": distance})


def _segments(cfg, doc: _Document) -> list[list[int]]:
  """The document's sentences in runs of consecutive sentence indices, each of at most half a pair's tokens
  and of a third of the document's (a long sentence alone), so that a document of three sentences or more
  has three runs: an adjacent and a distant one for each."""
  budget = max(1, min((cfg.max_seq_length - 3) // 2, sum(len(s) for s in doc.sentences) // 3))
  runs, run, length = [], [], 0
  for k, sentence in enumerate(doc.sentences):
    if run and length + len(sentence) > budget:
      runs.append(run)
      run, length = [], 0
    run.append(k)
    length += len(sentence)
  return runs + [run] if run else runs


def _reorder_row(cfg, doc: _Document, used: list[int], rng) -> Row | None:
  budget = cfg.max_seq_length - 4  # [CLS] and up to three [SEP]
  sentences = [list(doc.sentences[k]) for k in used]
  tokens = sum(len(s) for s in sentences)
  k = int(rng.integers(1, 4))
  if len(sentences) >= k:  # cut at k - 1 of the sentence boundaries
    cuts = sorted(rng.choice(np.arange(1, len(sentences)), k - 1, replace=False)) if k > 1 else []
    bounds = [0, *cuts, len(sentences)]
    pieces = [[i for s in sentences[a:b] for i in s] for a, b in zip(bounds, bounds[1:])]
  elif tokens >= k:
    flat = [i for s in sentences for i in s]
    cuts = sorted(rng.choice(np.arange(1, tokens), k - 1, replace=False))
    bounds = [0, *cuts, tokens]
    pieces = [flat[a:b] for a, b in zip(bounds, bounds[1:])]
  else:
    return None
  while sum(len(p) for p in pieces) > budget:  # trim the longest piece's end
    longest = max(pieces, key=len)
    if len(longest) == 1:
      return None
    longest.pop()
  order = rng.permutation(k)
  outside = doc.outside(used)
  return _assemble(cfg, [(pieces[j], outside, 0) for j in order], reorder_label(order), -1)


def _distance_row(cfg, docs, d: int, runs: list[list[int]], i: int, rng) -> Row | None:
  far = [j for j in range(len(runs)) if abs(j - i) > 1]
  label = int(rng.integers(DISTANCE_CLASSES))
  if not (i + 1 < len(runs), bool(far), len(docs) > 1)[label]:
    return _reorder_row(cfg, docs[d], runs[i], rng)  # not this run's distance: the classes stay balanced
  doc = docs[d]
  if label == 0:
    j, other, other_runs = i + 1, d, runs
  elif label == 1:
    j, other, other_runs = int(rng.choice(far)), d, runs
  else:
    other = int(rng.choice([e for e in range(len(docs)) if e != d]))
    other_runs = _segments(cfg, docs[other])
    j = int(rng.integers(len(other_runs)))
  a = [t for k in runs[i] for t in doc.sentences[k]]
  b = [t for k in other_runs[j] for t in docs[other].sentences[k]]
  _truncate_pair(a, b, cfg.max_seq_length - 3, rng)
  if not a or not b:
    return None
  if other == d:
    out_a = out_b = doc.outside(runs[i] + runs[j])
  else:
    out_a, out_b = doc.outside(runs[i]), docs[other].outside(other_runs[j])
  return _assemble(cfg, [(a, out_a, 0), (b, out_b, 1)], -1, label)


def build_rows(cfg, docs, rng: np.random.Generator, stats, reorder_share: float) -> list[Row]:
  """All ERNIE rows of one block of tokenized documents (ids with the capital bit), in block order."""
  docs = [_Document(d) for d in ([s for s in doc if s] for doc in docs) if d]
  rows = []
  for d, doc in enumerate(docs):
    runs = _segments(cfg, doc)
    i = 0
    while i < len(runs):
      if rng.random() < reorder_share:
        used = runs[i] + (runs[i + 1] if i + 1 < len(runs) else [])
        row, i = _reorder_row(cfg, doc, used, rng), i + 2
      else:
        row, i = _distance_row(cfg, docs, d, runs, i, rng), i + 1
      if row is None:
        stats["short_documents"] += 1
      else:
        rows.append(row)
  return rows


def read_labelled(path: str, encode, cls_id: int, sep_id: int, max_seq_length: int, num_classes: int
                  ) -> dict[str, np.ndarray]:
  """A labelled task's file: one example a line, `text<TAB>label` or `text_a<TAB>text_b<TAB>label` (label an
  integer in 0..num_classes-1) -> padded arrays input_ids, input_mask, segment_ids int32[N, T], labels int32[N]."""
  try:
    with open_binary(path) as f:
      lines = [line for line in f.read().decode("utf-8").splitlines() if line.strip()]
  except (OSError, UnicodeDecodeError) as e:
    raise DataError(f"labelled task file {path!r} cannot be read ({getattr(e, 'strerror', None) or e})") from None
  n = len(lines)
  if not n:
    raise DataError(f"labelled task file {path!r} has no examples")
  out = {k: np.zeros((n, max_seq_length), np.int32) for k in ("input_ids", "input_mask", "segment_ids")}
  labels = np.zeros((n,), np.int32)
  for r, line in enumerate(lines):
    fields = line.split("\t")
    if len(fields) not in (2, 3) or not fields[-1].strip().lstrip("-").isdigit():
      raise DataError(f"{path}:{r + 1}: expected `text<TAB>label` or `text_a<TAB>text_b<TAB>label`, got {line[:80]!r}")
    labels[r] = int(fields[-1])
    if not 0 <= labels[r] < num_classes:
      raise DataError(f"{path}:{r + 1}: label {labels[r]} is not in 0..{num_classes - 1}")
    a = encode(fields[0])
    b = encode(fields[1]) if len(fields) == 3 else []
    if b:
      _truncate_pair(a, b, max_seq_length - 3, np.random.default_rng(r))
      ids, segs = [cls_id, *a, sep_id, *b, sep_id], [0] * (len(a) + 2) + [1] * (len(b) + 1)
    else:
      a = a[:max_seq_length - 2]
      ids, segs = [cls_id, *a, sep_id], [0] * (len(a) + 2)
    out["input_ids"][r, :len(ids)] = ids
    out["input_mask"][r, :len(ids)] = 1
    out["segment_ids"][r, :len(ids)] = segs
  return {**out, "labels": labels}
