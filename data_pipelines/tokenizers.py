"""WordPiece (BERT `vocab.txt`) and SentencePiece (`*.model`) tokenizers, from Python and inside tf.data.

The WordPiece path reproduces google-research/bert `tokenization.py` exactly (cleaning, CJK splitting,
accent stripping when lower-casing, punctuation splitting, greedy longest-match-first). ASCII lines
take an equivalent regex fast path; other lines run the original character loop.
"""
from __future__ import annotations

import os
import re
import unicodedata

import numpy as np

from data_pipelines.errors import DataError
from data_pipelines.tftools import open_binary, tf

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
_REQUIRED = ("[PAD]", "[CLS]", "[SEP]", "[MASK]")
_MAX_CHARS_PER_WORD = 100
_ASCII_CONTROL = {c: None for c in [*range(0, 9), 11, 12, *range(14, 32), 127]}
_ASCII_PUNCT = r"!-/:-@\[-`{-~"
_ASCII_WORDS = re.compile(rf"[^\s{_ASCII_PUNCT}]+|[{_ASCII_PUNCT}]")
_WORD_CACHE_LIMIT = 1 << 20


def _is_whitespace(char):
  return char in " \t\n\r" or unicodedata.category(char) == "Zs"


def _is_control(char):
  return char not in "\t\n\r" and unicodedata.category(char) in ("Cc", "Cf")


def _is_punctuation(char):
  cp = ord(char)
  if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
    return True
  return unicodedata.category(char).startswith("P")


def _is_cjk(cp):
  return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF
          or 0x2A700 <= cp <= 0x2B73F or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF
          or 0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F)


def _basic_tokenize_unicode(text: str, lower_case: bool) -> list[str]:
  """The original BasicTokenizer, character by character."""
  chars = []
  for char in text:
    cp = ord(char)
    if cp == 0 or cp == 0xFFFD or _is_control(char):
      continue
    if _is_whitespace(char):
      chars.append(" ")
    elif _is_cjk(cp):
      chars.extend((" ", char, " "))
    else:
      chars.append(char)
  words = []
  for token in "".join(chars).split():
    if lower_case:
      token = unicodedata.normalize("NFD", token.lower())
      token = "".join(c for c in token if unicodedata.category(c) != "Mn")
    current = []
    for char in token:
      if _is_punctuation(char):
        if current:
          words.append("".join(current))
          current = []
        words.append(char)
      else:
        current.append(char)
    if current:
      words.append("".join(current))
  return words


def basic_tokenize(text: str, lower_case: bool) -> list[str]:
  """Whitespace/punctuation/CJK split as BERT's BasicTokenizer; ASCII text through an equal regex."""
  if text.isascii():
    text = text.translate(_ASCII_CONTROL)
    return _ASCII_WORDS.findall(text.lower() if lower_case else text)
  return _basic_tokenize_unicode(text, lower_case)


def _read_lines(path: str) -> list[str]:
  try:
    with open_binary(path) as f:
      return [line.decode("utf-8").rstrip("\r\n") for line in f]
  except (OSError, UnicodeDecodeError) as e:
    raise DataError(f"cannot read vocabulary {path}: {e}; pass a UTF-8 vocab.txt or a *.model "
                    "(--config.data.vocab=...)") from None


def _check_specials(path, special_ids):
  missing = [t for t in _REQUIRED if special_ids.get(t) is None]
  if missing:
    raise DataError(f"vocabulary {path} lacks {', '.join(missing)}; add them (BERT vocab.txt lists "
                    "[PAD] [UNK] [CLS] [SEP] [MASK]) or train one with `bert-jax vocab`")


class _Tokenizer:
  """Shared surface: vocab list, special ids, id lookups, word-continuation table for masking."""
  vocab: list[str]
  special_ids: dict
  kind: str
  path: str

  @property
  def files(self) -> dict[str, str]:
    """{file name: path}: what a checkpoint must carry to rebuild this tokenizer."""
    return {os.path.basename(self.path): self.path}

  @property
  def vocab_size(self) -> int:
    return len(self.vocab)

  def id_to_token(self, i: int) -> str:
    return self.vocab[i]

  def decode_tokens(self, ids) -> list[str]:
    return [self.vocab[int(i)] for i in ids]

  def special_mask(self) -> np.ndarray:
    """bool[vocab]: ids that are never masked nor drawn as random replacements."""
    mask = np.zeros(self.vocab_size, bool)
    mask[[i for i in self.special_ids.values() if i is not None]] = True
    return mask


class WordPieceTokenizer(_Tokenizer):
  """BERT WordPiece over a `vocab.txt` (one token per line, id = line number)."""
  kind = "wordpiece"

  def __init__(self, path: str, lower_case: bool = True):
    self.path, self.lower_case = path, lower_case
    self.vocab = _read_lines(path)
    self._ids = {token: i for i, token in enumerate(self.vocab)}
    self.special_ids = {t: self._ids.get(t) for t in SPECIAL_TOKENS}
    _check_specials(path, self.special_ids)
    self._unk = self.special_ids["[UNK]"]
    if self._unk is None:
      raise DataError(f"vocabulary {path} lacks [UNK]; WordPiece needs it for unknown words")
    self._cache: dict[str, list[int]] = {}

  def _wordpiece(self, word: str) -> list[int]:
    if len(word) > _MAX_CHARS_PER_WORD:
      return [self._unk]
    pieces, start = [], 0
    while start < len(word):
      end = len(word)
      while start < end:
        piece = word[start:end] if start == 0 else "##" + word[start:end]
        if piece in self._ids:
          pieces.append(self._ids[piece])
          break
        end -= 1
      else:
        return [self._unk]
      start = end
    return pieces

  def encode(self, text: str) -> list[int]:
    """Token ids without [CLS]/[SEP]."""
    cache = self._cache
    if len(cache) > _WORD_CACHE_LIMIT:
      cache.clear()
    ids = []
    for word in basic_tokenize(text, self.lower_case):
      pieces = cache.get(word)
      if pieces is None:
        pieces = cache[word] = self._wordpiece(word)
      ids.extend(pieces)
    return ids

  def continuation_mask(self) -> np.ndarray:
    """bool[vocab]: pieces that continue the previous word (`##x`)."""
    return np.array([t.startswith("##") for t in self.vocab], bool)

  def tokenize_tf(self, strings):
    """tf.string[batch] -> int32 RaggedTensor[batch, (tokens)], with tensorflow-text ops (usable in tf.data)."""
    import tensorflow_text as tf_text  # pylint: disable=import-outside-toplevel
    t = tf()
    if not hasattr(self, "_tf_tokenizer"):
      table = t.lookup.StaticVocabularyTable(
          t.lookup.KeyValueTensorInitializer(self.vocab, t.range(self.vocab_size, dtype=t.int64)),
          num_oov_buckets=1)
      self._tf_tokenizer = tf_text.BertTokenizer(
          table, lower_case=self.lower_case, unknown_token="[UNK]", token_out_type=t.int64)
    return t.cast(self._tf_tokenizer.tokenize(strings).merge_dims(1, 2), t.int32)


class SentencePieceTokenizer(_Tokenizer):
  """SentencePiece (unigram or BPE) model; text is lower-cased first when `lower_case` (ALBERT style)."""
  kind = "sentencepiece"

  def __init__(self, path: str, lower_case: bool = True):
    import sentencepiece as spm  # pylint: disable=import-outside-toplevel
    self.path, self.lower_case = path, lower_case
    try:
      with open_binary(path) as f:
        self._proto = f.read()
      self._sp = spm.SentencePieceProcessor(model_proto=self._proto)
    except (OSError, RuntimeError) as e:
      raise DataError(f"cannot load SentencePiece model {path}: {e}; pass a *.model written by "
                      "spm_train or `bert-jax vocab --type sentencepiece`") from None
    self.vocab = [self._sp.id_to_piece(i) for i in range(self._sp.get_piece_size())]
    ids = {t: i for i, t in enumerate(self.vocab)}
    self.special_ids = {t: ids.get(t) for t in SPECIAL_TOKENS}
    if self.special_ids["[UNK]"] is None:
      self.special_ids["[UNK]"] = self._sp.unk_id()
    _check_specials(path, self.special_ids)

  def encode(self, text: str) -> list[int]:
    return self._sp.encode(text.lower() if self.lower_case else text)

  def decode(self, ids) -> str:
    return self._sp.decode([int(i) for i in ids])

  def continuation_mask(self) -> np.ndarray:
    """bool[vocab]: pieces without the word-start marker continue the previous word."""
    mask = np.array([not t.startswith("\u2581") for t in self.vocab], bool)
    return mask & ~self.special_mask()

  def tokenize_tf(self, strings):
    """tf.string[batch] -> int32 RaggedTensor[batch, (tokens)] with tensorflow-text's SentencepieceTokenizer."""
    import tensorflow_text as tf_text  # pylint: disable=import-outside-toplevel
    t = tf()
    if not hasattr(self, "_tf_tokenizer"):
      self._tf_tokenizer = tf_text.SentencepieceTokenizer(model=self._proto, out_type=t.int32)
    if self.lower_case:
      strings = t.strings.lower(strings, encoding="utf-8")
    return self._tf_tokenizer.tokenize(strings)


def load_tokenizer(path: str, lower_case: bool = True):
  """WordPiece for a `vocab.txt` (any name not ending in .model), SentencePiece for `*.model`."""
  if path.endswith(".model"):
    return SentencePieceTokenizer(path, lower_case)
  return WordPieceTokenizer(path, lower_case)
