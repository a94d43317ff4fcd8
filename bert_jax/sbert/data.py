"""The bi-encoder's data files and their tokenized rows.

Files are UTF-8, one example per line, fields separated by tabs:
  scored pairs    sentence1<TAB>sentence2<TAB>score      the cosine objective and STS evaluation; a first
                                                         line whose score is not a number is a header
  labelled pairs  premise<TAB>hypothesis<TAB>label       the softmax objective (NLI); a first line whose
                                                         label is "label" is a header
  pairs           anchor<TAB>positive[<TAB>negative]     the ranking objective; every line has the same
                                                         number of fields, no header
A malformed line stops the run with one line naming the file and the line number.

Rows (the feature contract the objective reads; N rows, T data.max_seq_length, all int32 unless noted):
  a_input_ids, a_attention_mask [N, T]      the first sentence (anchor, premise): [CLS] tokens [SEP]
  b_input_ids, b_attention_mask [N, T]      the second (positive, hypothesis)
  n_input_ids, n_attention_mask [N, T]      the hard negative, where the pairs file has a third column
  label int32[N] (labelled pairs) or score float32[N] (scored pairs)
"""
from __future__ import annotations

import dataclasses

import numpy as np
from etils import epath

from bert_jax.errors import UserError
from bert_jax.finetune import features as feats

SIDES = ("a", "b", "n")


@dataclasses.dataclass
class Pairs:
  """columns: 2 or 3 lists of sentences (the sides, in SIDES order); target: float32 scores, int32 label
  ids or None; labels: the label names by id (labelled pairs)."""
  columns: list[list[str]]
  target: np.ndarray | None = None
  labels: tuple[str, ...] = ()

  def __len__(self) -> int:
    return len(self.columns[0])


def _rows(path: str) -> list[tuple[int, list[str]]]:
  """(line number, fields) of each non-empty line."""
  file = epath.Path(path)
  if not file.is_file():
    raise UserError(f"{path}: no such file")
  try:
    text = file.read_text(encoding="utf-8")
  except UnicodeDecodeError as e:
    raise UserError(f"{path}: not UTF-8 text ({e})") from None
  rows = [(n, line.removesuffix("\r").split("\t")) for n, line in enumerate(text.split("\n"), 1)]
  rows = [(n, fields) for n, fields in rows if fields != [""]]
  if not rows:
    raise UserError(f"{path}: no examples")
  return rows


def _fields(path: str, rows, counts: tuple[int, ...], form: str) -> None:
  for n, fields in rows:
    if len(fields) not in counts:
      raise UserError(f"{path}, line {n}: {len(fields)} tab-separated fields; expected {form}")


def _is_number(text: str) -> bool:
  try:
    float(text)
    return True
  except ValueError:
    return False


def read_scored_pairs(path: str, scale: float = 1.0) -> Pairs:
  """sentence1<TAB>sentence2<TAB>score; scores divided by `scale` (5 for STS-B's 0..5)."""
  rows = _rows(path)
  if len(rows[0][1]) == 3 and not _is_number(rows[0][1][2]):
    rows = rows[1:]
  _fields(path, rows, (3,), "sentence1<TAB>sentence2<TAB>score")
  bad = [n for n, fields in rows if not _is_number(fields[2])]
  if bad:
    raise UserError(f"{path}, line {bad[0]}: the score {dict(rows)[bad[0]][2]!r} is not a number")
  return Pairs([[f[0] for _, f in rows], [f[1] for _, f in rows]],
               np.asarray([float(f[2]) / scale for _, f in rows], np.float32))


def read_labelled_pairs(path: str, labels: tuple[str, ...] = ()) -> Pairs:
  """premise<TAB>hypothesis<TAB>label; `labels` names the classes by id (default: the file's, sorted)."""
  rows = _rows(path)
  if rows[0][1][2:3] == ["label"]:
    rows = rows[1:]
  _fields(path, rows, (3,), "premise<TAB>hypothesis<TAB>label")
  labels = tuple(labels) or tuple(sorted({f[2] for _, f in rows}))
  ids = {name: i for i, name in enumerate(labels)}
  unknown = [(n, f[2]) for n, f in rows if f[2] not in ids]
  if unknown:
    raise UserError(f"{path}, line {unknown[0][0]}: label {unknown[0][1]!r} is not one of {list(labels)}")
  return Pairs([[f[0] for _, f in rows], [f[1] for _, f in rows]],
               np.asarray([ids[f[2]] for _, f in rows], np.int32), labels)


def read_pairs(path: str) -> Pairs:
  """anchor<TAB>positive[<TAB>negative], the same number of fields on every line."""
  rows = _rows(path)
  width = len(rows[0][1])
  _fields(path, rows, (width,) if width in (2, 3) else (2, 3), "anchor<TAB>positive or anchor<TAB>positive<TAB>negative "
          "(the same on every line)")
  return Pairs([[f[i] for _, f in rows] for i in range(width)])


def tokenize(tokenizer, sentences: list[str], max_len: int, side: str) -> dict[str, np.ndarray]:
  """{side}_input_ids, {side}_attention_mask int32[N, max_len]: [CLS] tokens [SEP], cut and padded."""
  rows = [feats.encode_pair(tokenizer, tokenizer.encode(s), None, max_len) for s in sentences]
  return {f"{side}_{name}": np.stack([r[name] for r in rows]) for name in ("input_ids", "attention_mask")}


def featurize(pairs: Pairs, tokenizer, max_len: int, target: str | None) -> dict[str, np.ndarray]:
  """The rows of `pairs` (module docstring); `target` names the target's feature ("label", "score")."""
  out = {}
  for side, column in zip(SIDES, pairs.columns):
    out.update(tokenize(tokenizer, column, max_len, side))
  if target is not None:
    out[target] = pairs.target
  return out
