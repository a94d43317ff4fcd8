"""Byte-level BPE (GPT-2 / RoBERTa `vocab.json` + `merges.txt`), with the data_pipelines tokenizer surface.

Text is split by GPT-2's pattern, each piece's UTF-8 bytes are mapped to printable characters, and
merges are applied lowest rank first. The pattern's \\p{L} / \\p{N} classes are built from
unicodedata, so the standard `re` module suffices.
"""
from __future__ import annotations

import functools
import json
import re
import sys
import unicodedata

from etils import epath

from bert_jax.errors import UserError

# bert_jax's special-token roles -> RoBERTa's tokens, so code that builds [CLS] a [SEP] finds them.
_ROLES = {"[PAD]": "<pad>", "[UNK]": "<unk>", "[CLS]": "<s>", "[SEP]": "</s>", "[MASK]": "<mask>"}


@functools.lru_cache(maxsize=None)
def _category_class(prefix: str) -> str:
  """A regex character class of every code point whose Unicode category starts with `prefix`."""
  ranges, start = [], None
  for cp in range(sys.maxunicode + 2):
    inside = cp <= sys.maxunicode and unicodedata.category(chr(cp)).startswith(prefix)
    if inside and start is None:
      start = cp
    elif not inside and start is not None:
      ranges.append(re.escape(chr(start)) + (f"-{re.escape(chr(cp - 1))}" if cp - 1 > start else ""))
      start = None
  return "".join(ranges)


@functools.lru_cache(maxsize=None)
def _pattern() -> re.Pattern:
  letters, numbers = _category_class("L"), _category_class("N")
  return re.compile(rf"'s|'t|'re|'ve|'m|'ll|'d| ?[{letters}]+| ?[{numbers}]+"
                    rf"| ?[^\s{letters}{numbers}]+|\s+(?!\S)|\s+")


def _byte_chars() -> list[str]:
  """GPT-2's byte -> printable character table (printable bytes map to themselves)."""
  printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
  chars, extra = {}, 0
  for b in range(256):
    if b in printable:
      chars[b] = chr(b)
    else:
      chars[b] = chr(256 + extra)
      extra += 1
  return [chars[b] for b in range(256)]


class ByteLevelBPETokenizer:
  """RoBERTa's tokenizer: encode(text) -> ids (no <s>/</s>), vocab, special_ids, id_to_token."""

  lower_case = False
  kind = "bpe"

  def __init__(self, vocab_path: str, merges_path: str):
    try:
      ids = json.loads(epath.Path(vocab_path).read_text(encoding="utf-8"))  # local or in a bucket
      lines = [line for line in epath.Path(merges_path).read_text(encoding="utf-8").splitlines()
               if line.strip() and not line.startswith("#version")]
    except (OSError, ValueError) as e:
      raise UserError(f"cannot read byte-level BPE files {vocab_path}, {merges_path}: {e}") from None
    self.path, self._ids = vocab_path, ids
    self.files = {"vocab.json": vocab_path, "merges.txt": merges_path}
    self.vocab = [""] * (max(ids.values()) + 1)
    for token, i in ids.items():
      self.vocab[i] = token
    self._ranks = {tuple(line.split(" ")): rank for rank, line in enumerate(lines)}
    self._bytes = _byte_chars()
    self._decoder = {c: b for b, c in enumerate(self._bytes)}
    self.special_ids = {role: ids.get(token) for role, token in _ROLES.items()}
    self._cache: dict[str, list[int]] = {}

  @property
  def vocab_size(self) -> int:
    return len(self.vocab)

  def id_to_token(self, i: int) -> str:
    return self.vocab[i]

  def _merge(self, word: str) -> list[str]:
    parts = list(word)
    while len(parts) > 1:
      pairs = [(self._ranks.get(pair, float("inf")), i) for i, pair in enumerate(zip(parts, parts[1:]))]
      rank, _ = min(pairs)
      if rank == float("inf"):
        break
      first, second = next(parts[i:i + 2] for r, i in pairs if r == rank)
      merged, i = [], 0
      while i < len(parts):
        if i + 1 < len(parts) and parts[i] == first and parts[i + 1] == second:
          merged.append(first + second)
          i += 2
        else:
          merged.append(parts[i])
          i += 1
      parts = merged
    return parts

  def _word_ids(self, word: str) -> list[int]:
    unk = self.special_ids["[UNK]"]
    return [self._ids.get(piece, unk) for piece in self._merge(word)]

  def encode(self, text: str) -> list[int]:
    ids = []
    for piece in _pattern().findall(text):
      word = "".join(self._bytes[b] for b in piece.encode("utf-8"))
      if word not in self._cache:
        self._cache[word] = self._word_ids(word)
      ids.extend(self._cache[word])
    return ids

  def decode(self, ids) -> str:
    chars = "".join(self.vocab[int(i)] for i in ids)
    return bytes(self._decoder[c] for c in chars if c in self._decoder).decode("utf-8", errors="replace")
