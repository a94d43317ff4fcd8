"""WordPiece (BERT `vocab.txt`) and SentencePiece (`*.model`) tokenizers, from Python and inside tf.data.

The WordPiece path reproduces google-research/bert `tokenization.py` exactly (cleaning, CJK splitting,
accent stripping when lower-casing, punctuation splitting, greedy longest-match-first, and a word longer
than `max_chars_per_word` characters as [UNK]: Google's 200 by default, HF's 100 for HF parity). ASCII
lines take an equivalent regex fast path; other lines run the original character loop, which also
keeps each word's character span in the text (`basic_tokenize_spans`, for SQuAD's answer spans).

The SentencePiece path is ALBERT's (google-research/albert `tokenization.py`): `preprocess_text`
(whitespace collapsed; when lower-casing, NFKD with combining marks dropped, then lower case), then
the model's pieces, with `encode_pieces`' re-split of a piece ending in a digit and a comma ("1990,"
-> "1990" ","). `quotes_to_double` also turns `` and '' into ", as transformers' AlbertTokenizer
and XLNet's preprocess_text do; google-research/albert leaves them. The special ids are read by role
(the model's pad and unk ids, [CLS] [SEP] [MASK] by name), so ALBERT's `<pad>`/`<unk>` layout loads
as well as bert_jax's `[PAD]`/`[UNK]`.

XLNet's SentencePiece (kind xlnet_spm) is transformers' XLNetTokenizer: remove_space, `` and '' to ",
keep_accents=False (NFKD with marks dropped, whether or not it lower-cases), cased by default, its special
tokens by XLNet's names (<cls> <sep> <mask> <pad> <unk>), and the pieces that end in a digit and a comma
scored down by 100 (transformers' XLNetConverter; its slow tokenizer re-split them instead, as ALBERT's
does). Its inputs are laid out as a <sep> b <sep> <cls>, padded on the left (`Layout`, XLNET_LAYOUT).

CamemBERT's and XLM-R's SentencePiece, in fairseq's id layout and with transformers' pre-tokenization,
are fairseq_spm.py's (kinds camembert_spm, xlmr_spm; `load_tokenizer(path, kind=...)`); a Hugging Face
tokenizer.json of any kind (byte-level BPE, Unigram, WordPiece: ModernBERT's) is hf_tokenizer.py's (kind
tokenizer_json), through the `tokenizers` library. `load_tokenizer` finds each kind in the registry, tokenizer_kinds.py.
"""
from __future__ import annotations

import base64
import json
import re
import unicodedata

import numpy as np

from bert_jax.data_pipelines import deberta_spm, fairseq_spm, hf_tokenizer, t5_spm, tokenizer_kinds
from bert_jax.data_pipelines.errors import DataError
from bert_jax.data_pipelines.tftools import open_binary, tf, tf_module
from bert_jax.data_pipelines.tokenizer_base import (  # noqa: F401  (the kinds' layouts, read from here)
    BERT_LAYOUT, XLNET_LAYOUT, Layout, layout_of)
from bert_jax.data_pipelines.tokenizer_base import TokenizerBase as _Tokenizer

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
_REQUIRED = ("[PAD]", "[CLS]", "[SEP]", "[MASK]")
GOOGLE_MAX_CHARS_PER_WORD = 200  # google-research/bert WordpieceTokenizer.max_input_chars_per_word
HF_MAX_CHARS_PER_WORD = 100  # transformers' BertTokenizer and tokenizers' WordPiece
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


def _lower_strip_accents(token: str, where: list[int]) -> tuple[str, list[int]]:
  """BERT's lower() and accent stripping of one whitespace token, each output character with its source.

  The token is lowered whole (a word-final sigma lowers to the final form), decomposed whole (NFD),
  and stripped of Mn marks, as the original; per-character lengths give the sources, since neither
  step depends on neighbours for its length.
  """
  if token.isascii():
    return token.lower(), where
  lowered = token.lower()
  where = [w for c, w in zip(token, where) for _ in c.lower()]
  text = "".join(c for c in unicodedata.normalize("NFD", lowered) if unicodedata.category(c) != "Mn")
  where = [w for c, w in zip(lowered, where) for d in unicodedata.normalize("NFD", c)
           if unicodedata.category(d) != "Mn"]
  return text, where


def _whitespace_tokens(text: str):
  """(token, source index of each character): the original's _clean_text (drops NUL, U+FFFD, Cc and Cf),
  CJK split and whitespace_tokenize (str.split, so U+2028 separates too)."""
  chars, where = [], []
  for i, char in enumerate(text):
    cp = ord(char)
    if cp == 0 or cp == 0xFFFD or _is_control(char):
      continue
    cjk = _is_cjk(cp)
    if cjk or _is_whitespace(char) or char.isspace():
      if chars:
        yield "".join(chars), where
        chars, where = [], []
      if cjk:
        yield char, [i]
    else:
      chars.append(char)
      where.append(i)
  if chars:
    yield "".join(chars), where


def basic_tokenize_spans(text: str, lower_case: bool) -> list[tuple[str, int, int]]:
  """(word, start, end) per word of BERT's BasicTokenizer: text[start:end] is the non-empty span the
  word came from (characters the tokenizer deletes, inside a word, stay inside its span)."""
  if text.isascii() and text.translate(_ASCII_CONTROL) == text:  # nothing deleted: spans are match spans
    lowered = text.lower() if lower_case else text
    return [(m.group(), m.start(), m.end()) for m in _ASCII_WORDS.finditer(lowered)]
  words = []
  for token, where in _whitespace_tokens(text):
    if lower_case:
      token, where = _lower_strip_accents(token, where)
    start = 0
    for i, char in enumerate(token):
      if _is_punctuation(char):
        if i > start:
          words.append((token[start:i], where[start], where[i - 1] + 1))
        words.append((char, where[i], where[i] + 1))
        start = i + 1
    if start < len(token):
      words.append((token[start:], where[start], where[-1] + 1))
  return words


def basic_tokenize(text: str, lower_case: bool) -> list[str]:
  """Whitespace/punctuation/CJK split as BERT's BasicTokenizer; ASCII text through an equal regex."""
  if text.isascii():
    text = text.translate(_ASCII_CONTROL)
    return _ASCII_WORDS.findall(text.lower() if lower_case else text)
  return [word for word, _, _ in basic_tokenize_spans(text, lower_case)]


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


class WordPieceTokenizer(_Tokenizer):
  """BERT WordPiece over a `vocab.txt` (one token per line, id = line number).

  max_chars_per_word: longer words become [UNK]; Google's 200 (GOOGLE_MAX_CHARS_PER_WORD) or, for
  parity with transformers/tokenizers, HF_MAX_CHARS_PER_WORD = 100.
  """
  kind = "wordpiece"

  def __init__(self, path: str, lower_case: bool = True, max_chars_per_word: int = GOOGLE_MAX_CHARS_PER_WORD):
    if max_chars_per_word < 1:
      raise DataError(f"max_chars_per_word={max_chars_per_word} must be at least 1 (Google: 200, HF: 100)")
    self.path, self.lower_case, self.max_chars_per_word = path, lower_case, max_chars_per_word
    self.vocab = _read_lines(path)
    self._ids = {token: i for i, token in enumerate(self.vocab)}
    self.special_ids = {t: self._ids.get(t) for t in SPECIAL_TOKENS}
    _check_specials(path, self.special_ids)
    self._unk = self.special_ids["[UNK]"]
    if self._unk is None:
      raise DataError(f"vocabulary {path} lacks [UNK]; WordPiece needs it for unknown words")
    self._cache: dict[str, list[int]] = {}

  def _wordpiece(self, word: str) -> list[int]:
    if len(word) > self.max_chars_per_word:
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
    """tf.string[batch] -> int32 RaggedTensor[batch, (tokens)], with tensorflow-text ops (usable in tf.data).

    tensorflow-text limits words in bytes, not characters: its byte limit is set out of reach, and a
    word over max_chars_per_word characters is swapped for the literal "[UNK]" (a vocab entry that the
    basic tokenizer could never produce, since it splits off brackets) before the WordPiece lookup.
    """
    t, tf_text = tf(), tf_module("tensorflow_text")
    if not hasattr(self, "_tf_tokenizer"):
      table = t.lookup.StaticVocabularyTable(
          t.lookup.KeyValueTensorInitializer(self.vocab, t.range(self.vocab_size, dtype=t.int64)),
          num_oov_buckets=1)
      basic = tf_module("tensorflow_text.python.ops.bert_tokenizer").BasicTokenizer(lower_case=self.lower_case)
      self._tf_tokenizer = basic, tf_text.WordpieceTokenizer(
          table, max_bytes_per_word=4 * self.max_chars_per_word, unknown_token="[UNK]", token_out_type=t.int64)
    basic, wordpiece = self._tf_tokenizer
    words = basic.tokenize(strings)
    too_long = t.strings.length(words.flat_values, unit="UTF8_CHAR") > self.max_chars_per_word
    words = words.with_flat_values(t.where(too_long, "[UNK]", words.flat_values))
    return t.cast(wordpiece.tokenize(words).merge_dims(1, 2), t.int32)


def albert_preprocess(text: str, lower_case: bool, quotes_to_double: bool = False) -> str:
  """google-research/albert's preprocess_text: whitespace collapsed; when lower-casing, NFKD with
  combining marks dropped, then lower case. quotes_to_double: `` and '' to " first (transformers)."""
  text = " ".join(text.split())
  if quotes_to_double:
    text = text.replace("``", '"').replace("''", '"')
  if lower_case:
    text = "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c)).lower()
  return text


def _is_mark(char: str) -> bool:
  return unicodedata.category(char).startswith("M")


def xlnet_preprocess(text: str, lower_case: bool) -> str:
  """transformers' XLNetTokenizer's normalizer before the model's own: `` and '' to ", NFKD and the marks
  (Unicode category M, as tokenizers' StripAccents) dropped, lower case when asked; whitespace collapsed."""
  text = " ".join(text.split()).replace("``", '"').replace("''", '"')
  text = "".join(c for c in unicodedata.normalize("NFKD", text) if not _is_mark(c))
  return text.lower() if lower_case else text


def _regex_class(predicate) -> str:
  """An RE2 character class of the code points where `predicate(char)` holds (as ranges)."""
  ranges, start = [], None
  for cp in range(0x110001):
    inside = cp <= 0x10FFFF and predicate(chr(cp))
    if inside and start is None:
      start = cp
    elif not inside and start is not None:
      ranges.append(f"\\x{{{start:x}}}-\\x{{{cp - 1:x}}}")
      start = None
  return "[" + "".join(ranges) + "]"


class SentencePieceTokenizer(_Tokenizer):
  """SentencePiece (unigram or BPE) model, with ALBERT's preprocessing and digit-comma re-split.

  quotes_to_double: also `` and '' to " (transformers' AlbertTokenizer); google-research/albert
  leaves them.
  """
  kind = "sentencepiece"
  names = {role: role for role in SPECIAL_TOKENS}  # each special role's piece in the model

  def __init__(self, path: str, lower_case: bool = True, quotes_to_double: bool = False, proto: bytes | None = None):
    """proto: the model itself, where `path` is not one (XLNet's tokenizer.json)."""
    import sentencepiece as spm  # pylint: disable=import-outside-toplevel
    self.path, self.lower_case, self.quotes_to_double = path, lower_case, quotes_to_double
    try:
      if proto is None:
        with open_binary(path) as f:
          proto = f.read()
      self._proto = proto
      self._sp = spm.SentencePieceProcessor(model_proto=self._proto)
    except (OSError, RuntimeError) as e:
      raise DataError(f"cannot load SentencePiece model {path}: {e}; pass a *.model written by "
                      "spm_train or `bert-jax vocab --type sentencepiece`") from None
    self.vocab = [self._sp.id_to_piece(i) for i in range(self._sp.get_piece_size())]
    ids = {t: i for i, t in enumerate(self.vocab)}
    self.special_ids = {t: ids.get(self.names[t], ids.get(t)) for t in SPECIAL_TOKENS}
    # By role: ALBERT's models name them <pad> and <unk>, bert_jax's [PAD] and [UNK].
    if self._sp.pad_id() >= 0:
      self.special_ids["[PAD]"] = self._sp.pad_id()
    self.special_ids["[UNK]"] = self._sp.unk_id()
    _check_specials(path, self.special_ids)
    self._resplit = self._digit_comma_resplits()

  def _digit_comma_resplits(self) -> dict[int, list[int]]:
    """{id: ids} for pieces ending in a digit and a comma, as ALBERT's encode_pieces re-splits them.

    The re-split depends on the piece alone, so it is a table over the vocabulary; a re-split piece
    that lost its word-start marker may be out of the vocabulary and then is [UNK], as there.
    """
    table = {}
    for i, piece in enumerate(self.vocab):
      if len(piece) > 1 and piece[-1] == "," and piece[-2].isdigit() and not self._sp.is_control(i):
        pieces = self._sp.encode(piece[:-1].replace("\u2581", ""), out_type=str)
        if piece[0] != "\u2581" and pieces[0][0] == "\u2581":
          pieces = pieces[1:] if len(pieces[0]) == 1 else [pieces[0][1:], *pieces[1:]]
        table[i] = [self._sp.piece_to_id(p) for p in [*pieces, ","]]
    return table

  def encode(self, text: str) -> list[int]:
    ids = self._sp.encode(albert_preprocess(text, self.lower_case, self.quotes_to_double))
    return [j for i in ids for j in self._resplit.get(i, (i,))] if self._resplit else ids

  def decode(self, ids) -> str:
    return self._sp.decode([int(i) for i in ids])

  def continuation_mask(self) -> np.ndarray:
    """bool[vocab]: pieces without the word-start marker continue the previous word."""
    mask = np.array([not t.startswith("\u2581") for t in self.vocab], bool)
    return mask & ~self.special_mask()

  def _preprocess_tf(self, strings):
    """albert_preprocess in TF ops (Python's str.split whitespace, NFKD and combining classes)."""
    t, tf_text = tf(), tf_module("tensorflow_text")
    if not hasattr(self, "_tf_classes"):
      self._tf_classes = _regex_class(str.isspace), _regex_class(unicodedata.combining)
    space, combining = self._tf_classes
    strings = t.strings.regex_replace(strings, f"{space}+", " ")
    strings = t.strings.regex_replace(strings, "^ | $", "")
    if self.quotes_to_double:
      strings = t.strings.regex_replace(strings, "``|''", '"')
    if self.lower_case:
      strings = t.strings.regex_replace(tf_text.normalize_utf8(strings, "NFKD"), combining, "")
      strings = t.strings.lower(strings, encoding="utf-8")
    return strings

  def tokenize_tf(self, strings):
    """tf.string[batch] -> int32 RaggedTensor[batch, (tokens)] with tensorflow-text's SentencepieceTokenizer.

    Equal to `encode` where TF's (ICU's) Unicode tables agree with Python's.
    """
    t, tf_text = tf(), tf_module("tensorflow_text")
    if not hasattr(self, "_tf_tokenizer"):
      rows = [self._resplit.get(i, [i]) for i in range(self.vocab_size)]
      self._tf_tokenizer = (tf_text.SentencepieceTokenizer(model=self._proto, out_type=t.int32),
                            t.ragged.constant(rows, dtype=t.int32))
    sp, resplit = self._tf_tokenizer
    ids = sp.tokenize(self._preprocess_tf(strings))
    return t.gather(resplit, ids).merge_dims(1, 2)


def _digit_comma(piece: str) -> bool:
  return len(piece) > 1 and piece[-1] == "," and piece[-2].isdigit()


class XLNetTokenizer(SentencePieceTokenizer):
  """transformers' XLNetTokenizer over XLNet's `spiece.model` or its `tokenizer.json` (what transformers 5
  saves; its Lowercase step says whether it lower-cases); cased unless lower_case; module docstring.

  Special roles by XLNet's names (bert_jax's [CLS]-style names where a model has no <cls>); the model's
  pieces that end in a digit and a comma are scored 100 lower, as transformers' XLNetConverter does (a
  tokenizer.json holds them so scored). A tokenizer.json's text goes through its character map, is split
  on white space and each word, marked with ▁, segmented alone (tokenizers' Metaspace and Unigram).
  """
  kind = "xlnet_spm"
  layout = XLNET_LAYOUT
  names = {"[PAD]": "<pad>", "[UNK]": "<unk>", "[CLS]": "<cls>", "[SEP]": "<sep>", "[MASK]": "<mask>"}

  def __init__(self, path: str, lower_case: bool = False):
    import sentencepiece as spm  # pylint: disable=import-outside-toplevel
    self._words = None
    if path.endswith(".json"):
      try:
        with open_binary(path) as f:
          proto, charsmap, steps = fairseq_spm.unigram_model(json.loads(f.read()))
      except (OSError, ValueError, KeyError, TypeError) as e:
        raise DataError(f"cannot load XLNet tokenizer {path}: {e}; pass its spiece.model or tokenizer.json") from None
      super().__init__(path, "Lowercase" in steps, quotes_to_double=True, proto=proto)
      self._words = fairseq_spm.normalizer(charsmap) if charsmap else False
    else:
      super().__init__(path, lower_case, quotes_to_double=True)
      charsmap = fairseq_spm.read_model(self._proto)[1]
      self._sp = spm.SentencePieceProcessor(model_proto=fairseq_spm.with_scores(
          self._proto, lambda piece, score: score - 100 if _digit_comma(piece) else score))
    self._resplit, self._charsmap = {}, charsmap

  def encode(self, text: str) -> list[int]:
    text = xlnet_preprocess(text, self.lower_case)
    if self._words is None:  # the model's own normalizer, white space as ▁
      return self._sp.encode(text)
    if self._words:
      text = self._words.normalize(text)
    ids = []
    for word in text.split():
      for part in re.split("(?=\u2581)", word if word.startswith("\u2581") else "\u2581" + word):
        if part:
          ids.extend(self._sp.encode(part))
    return ids

  def special_mask(self) -> np.ndarray:
    """bool[vocab]: the special roles and the model's other control symbols (<s> </s> <eop> <eod>)."""
    mask = super().special_mask()
    mask[[i for i in range(self.vocab_size) if self._sp.is_control(i)]] = True
    return mask

  def hf_tokenizer_json(self) -> dict:
    """The tokenizer.json transformers' XLNetTokenizer saves for this model (transformers reads it without
    the sentencepiece library and protobuf, which a spiece.model alone needs)."""
    def added(i):
      return {"id": i, "content": self.vocab[i], "single_word": False, "lstrip": i == self.special_ids["[MASK]"],
              "rstrip": False, "normalized": False, "special": True}
    def token(role, type_id):
      return {"SpecialToken": {"id": self.vocab[self.special_ids[role]], "type_id": type_id}}
    def sequence(name, type_id):
      return {"Sequence": {"id": name, "type_id": type_id}}
    charsmap = self._charsmap
    normalizers = [{"type": "Replace", "pattern": {"String": "``"}, "content": '"'},
                   {"type": "Replace", "pattern": {"String": "''"}, "content": '"'},
                   {"type": "NFKD"}, {"type": "StripAccents"}, *([{"type": "Lowercase"}] if self.lower_case else []),
                   *([{"type": "Precompiled", "precompiled_charsmap": base64.b64encode(charsmap).decode()}]
                     if charsmap else [])]
    metaspace = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True}
    special = [i for i in range(self.vocab_size) if self._sp.is_control(i) or self._sp.is_unknown(i)]
    cls, sep = (self.vocab[self.special_ids[r]] for r in ("[CLS]", "[SEP]"))
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [added(i) for i in special],
        "normalizer": {"type": "Sequence", "normalizers": normalizers},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "WhitespaceSplit"}, metaspace]},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [sequence("A", 0), token("[SEP]", 0), token("[CLS]", 2)],
            "pair": [sequence("A", 0), token("[SEP]", 0), sequence("B", 1), token("[SEP]", 1), token("[CLS]", 2)],
            "special_tokens": {t: {"id": t, "ids": [self.vocab.index(t)], "tokens": [t]} for t in (cls, sep)}},
        "decoder": metaspace,
        "model": {"type": "Unigram", "unk_id": self._sp.unk_id(), "byte_fallback": False,
                  "vocab": [[p, self._sp.get_score(i)] for i, p in enumerate(self.vocab)]}}

  def tokenize_tf(self, strings):
    raise DataError("the xlnet_spm tokenizer has no TF path; tokenize in Python (finetune) or pretrain with "
                    "data.tokenizer=sentencepiece")


# The built-in tokenizer kinds (data_pipelines/tokenizer_kinds.py: data.tokenizer; a family record's `tokenizer`),
# each with its class (here, in fairseq_spm.py or hf_tokenizer.py). "bpe" (RoBERTa's byte-level BPE over
# vocab.json + merges.txt, conversion/bpe.py) is read from checkpoints only.
def _wordpiece_saved(tokenizer) -> dict:
  return {"max_chars_per_word": tokenizer.max_chars_per_word}  # HF's 100 for a converted HF checkpoint


def _fairseq(kind: str, hf_class: str) -> tokenizer_kinds.TokenizerKind:
  files = (fairseq_spm.HF_TOKENIZER_FILE, fairseq_spm.HF_MODEL_FILE)
  load = lambda path, lower, chars, quotes: fairseq_spm.FairseqSentencePieceTokenizer(path, kind)  # noqa: E731
  return tokenizer_kinds.TokenizerKind(
      kind, load, file_names=" or ".join(files), hf_class=hf_class, own_ids=True, extend="fairseq",
      hf_json=lambda path, lower: fairseq_spm.hf_tokenizer_json(fairseq_spm.FairseqSentencePieceTokenizer(path, kind)))


for _kind in (
    tokenizer_kinds.TokenizerKind("wordpiece",
                                  lambda path, lower, chars, quotes: WordPieceTokenizer(path, lower, chars),
                                  ("vocab.txt",), hf_class="BertTokenizer", saved=_wordpiece_saved,
                                  hf_word_limit=True, extend="whole_word"),
    tokenizer_kinds.TokenizerKind("sentencepiece",
                                  lambda path, lower, chars, quotes: SentencePieceTokenizer(path, lower, quotes),
                                  ("spiece.model",), "spiece.model (any *.model)", hf_class="AlbertTokenizer",
                                  extend="unigram"),
    tokenizer_kinds.TokenizerKind("bpe", None, ("vocab.json", "merges.txt"), hf_class="RobertaTokenizer", cased=True),
    tokenizer_kinds.TokenizerKind("xlnet_spm", lambda path, lower, chars, quotes: XLNetTokenizer(path, lower),
                                  ("spiece.model",), f"spiece.model or {fairseq_spm.HF_TOKENIZER_FILE}",
                                  hf_class="XLNetTokenizer", own_ids=True,
                                  hf_json=lambda path, lower: XLNetTokenizer(path, lower).hf_tokenizer_json()),
    _fairseq("camembert_spm", "CamembertTokenizer"),
    _fairseq("xlmr_spm", "XLMRobertaTokenizer"),
    tokenizer_kinds.TokenizerKind(hf_tokenizer.KIND,
                                  lambda path, lower, chars, quotes: hf_tokenizer.TokenizerJson(path),
                                  file_names=hf_tokenizer.FILE),
    tokenizer_kinds.TokenizerKind(t5_spm.KIND, lambda path, lower, chars, quotes: t5_spm.T5Tokenizer(path),
                                  ("spiece.model",), hf_class="T5Tokenizer", own_ids=True),
    tokenizer_kinds.TokenizerKind(deberta_spm.KIND, lambda path, lower, chars, quotes: deberta_spm.DebertaTokenizer(path),
                                  (deberta_spm.FILE,), hf_class="DebertaV2Tokenizer", own_ids=True,
                                  hf_json=lambda path, lower: json.loads(deberta_spm.DebertaTokenizer(path).to_json()))):
  tokenizer_kinds.register(_kind)


def kind_of_file(path: str) -> str:
  """The kind a vocabulary file is read as when nothing names one: SentencePiece for `*.model`, a Hugging Face
  tokenizer.json for `*.json`, else a WordPiece vocab.txt."""
  if path.endswith(".model"):
    return "sentencepiece"
  return hf_tokenizer.KIND if path.endswith(".json") else "wordpiece"


def load_tokenizer(path: str, lower_case: bool = True, *, max_chars_per_word: int = GOOGLE_MAX_CHARS_PER_WORD,
                   quotes_to_double: bool = False, kind: str | None = None):
  """The tokenizer of `kind` (tokenizer_kinds.loadable()) over `path`; without a kind, `kind_of_file(path)`'s.

  Google's conventions by default; HF parity: max_chars_per_word=HF_MAX_CHARS_PER_WORD (WordPiece),
  quotes_to_double=True (SentencePiece, transformers' AlbertTokenizer). The fairseq kinds
  (fairseq_spm.py: CamemBERT's and XLM-R's) and tokenizer_json are cased as their files say, whatever
  `lower_case` says.
  """
  record = tokenizer_kinds.get(kind or kind_of_file(path))
  if record.load is None:
    raise DataError(f"tokenizer kind {record.name!r} is not one of {tokenizer_kinds.loadable()}")
  return record.load(path, lower_case, max_chars_per_word, quotes_to_double)
