"""The scored-pairs file that STS evaluation reads (`bert-jax embed-eval --sts`): UTF-8, one pair per
line, sentence1<TAB>sentence2<TAB>score; a first line whose score is not a number is a header. A
malformed line stops the run with one line naming the file and the line number.
"""
from __future__ import annotations

import dataclasses

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
