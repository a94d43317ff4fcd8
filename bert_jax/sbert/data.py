"""The sentence-pair files a bi-encoder trains and is evaluated on: UTF-8, one example per line,
tab-separated. A malformed line stops the run with one line naming the file and the line number.

  scored pairs    sentence1<TAB>sentence2<TAB>score (STS: `bert-jax embed-eval --sts`, the cosine loss); a
                  first line whose score is not a number is a header
  labelled pairs  premise<TAB>hypothesis<TAB>label (NLI: the softmax loss); the label one of the given
                  names; a first line whose label is not one of them is a header
  text pairs      anchor<TAB>positive[<TAB>hard negative] (the multiple-negatives ranking loss); every
                  line the same number of fields, no header
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
from etils import epath

from bert_jax.errors import UserError


@dataclasses.dataclass
class Pairs:
  """columns: the two lists of sentences; target: their float32 scores."""
  columns: list[list[str]]
  target: np.ndarray

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


def _after_header(path: str, rows: list) -> list:
  if len(rows) == 1:
    raise UserError(f"{path}: only a header line, no examples")
  return rows[1:]


def _fields(path: str, rows, counts: tuple[int, ...], form: str) -> None:
  for n, fields in rows:
    if len(fields) not in counts:
      raise UserError(f"{path}, line {n}: {len(fields)} tab-separated fields; expected {form}")


def _is_number(text: str) -> bool:
  """A finite number ("nan" and "inf" are not scores)."""
  try:
    return math.isfinite(float(text))
  except ValueError:
    return False


def read_scored_pairs(path: str, scale: float = 1.0) -> Pairs:
  """sentence1<TAB>sentence2<TAB>score; scores divided by `scale` (5 for STS-B's 0..5)."""
  rows = _rows(path)
  if len(rows[0][1]) == 3 and not _is_number(rows[0][1][2]):
    rows = _after_header(path, rows)
  _fields(path, rows, (3,), "sentence1<TAB>sentence2<TAB>score")
  bad = [n for n, fields in rows if not _is_number(fields[2])]
  if bad:
    raise UserError(f"{path}, line {bad[0]}: the score {dict(rows)[bad[0]][2]!r} is not a number")
  return Pairs([[f[0] for _, f in rows], [f[1] for _, f in rows]],
               np.asarray([float(f[2]) / scale for _, f in rows], np.float32))


def read_labelled_pairs(path: str, labels: tuple[str, ...]) -> Pairs:
  """premise<TAB>hypothesis<TAB>label; target: int32 indices into `labels`."""
  rows = _rows(path)
  if len(rows[0][1]) == 3 and rows[0][1][2] not in labels:
    rows = _after_header(path, rows)
  _fields(path, rows, (3,), "premise<TAB>hypothesis<TAB>label")
  index = {name: i for i, name in enumerate(labels)}
  bad = [(n, f[2]) for n, f in rows if f[2] not in index]
  if bad:
    raise UserError(f"{path}, line {bad[0][0]}: the label {bad[0][1]!r} is not one of {list(labels)}")
  return Pairs([[f[0] for _, f in rows], [f[1] for _, f in rows]],
               np.asarray([index[f[2]] for _, f in rows], np.int32))


def read_text_pairs(path: str) -> Pairs:
  """anchor<TAB>positive[<TAB>negative]: columns [anchors, positives(, negatives)]; target empty."""
  rows = _rows(path)
  _fields(path, rows, (len(rows[0][1]),) if len(rows[0][1]) in (2, 3) else (2, 3),
          "anchor<TAB>positive or anchor<TAB>positive<TAB>negative on every line")
  return Pairs([[f[i] for _, f in rows] for i in range(len(rows[0][1]))], np.zeros(0, np.float32))
