"""SentencePiece vocabularies laid out as fairseq's dictionaries: CamemBERT's and XLM-RoBERTa's tokenizers.

fairseq put its own special symbols before the SentencePiece model's pieces, so the ids Hugging Face
(and the released checkpoints) use are not the model's:

  camembert_spm  `<s>NOTUSED` `<pad>` `</s>NOTUSED` `<unk>` `<unk>NOTUSED`, then the model's pieces from
                 its id 1 on (`<s>` = 5, `</s>` = 6 for a model with unk/bos/eos = 0/1/2), `<mask>` last
  xlmr_spm       `<s>` `<pad>` `</s>` `<unk>`, then the model's pieces from its id 3 on (one id up), `<mask>` last

A Hugging Face folder holds `sentencepiece.bpe.model` and/or `tokenizer.json`; transformers reads
tokenizer.json when it is there, so this does too, and otherwise lays the model out as transformers'
converters do. Either way encoding is what transformers' tokenizer does: text split on added tokens
(`<mask>` eating the spaces before it), the normalizer (the model's precompiled character map, nmt_nfkc
for spm_train's models, applied per grapheme cluster as tokenizers' Precompiled does; none at all in a
tokenizer.json without one), words split on Unicode white
space, each word marked with `▁` (Metaspace), and each word's best Unigram segmentation, without byte
fallback (transformers' two classes turn it off). No lower-casing and no ALBERT preprocessing. The Unigram
search runs in the sentencepiece library, over a model rebuilt (in protobuf's wire format, written here)
with transformers' ids.
"""
from __future__ import annotations

import base64
import functools
import json
import re
import struct
import unicodedata

import numpy as np

from bert_jax.data_pipelines.errors import DataError
from bert_jax.data_pipelines.tftools import open_binary
from bert_jax.data_pipelines.tokenizer_base import TokenizerBase

KINDS = ("camembert_spm", "xlmr_spm")
HF_MODEL_FILE = "sentencepiece.bpe.model"  # what a Hugging Face folder calls the SentencePiece model
HF_TOKENIZER_FILE = "tokenizer.json"
_META = "\u2581"
# Unicode White_Space (Rust's char::is_whitespace, which tokenizers' WhitespaceSplit splits on).
_SPACE_CLASS = "[\t-\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]"
_WHITE_SPACE = re.compile(_SPACE_CLASS + "+")
# SentencePiece piece types (sentencepiece_model.proto)
_NORMAL, _UNKNOWN, _CONTROL = 1, 2, 3
# bert_jax's special-token roles -> the fairseq symbols
_ROLES = {"[PAD]": "<pad>", "[UNK]": "<unk>", "[CLS]": "<s>", "[SEP]": "</s>", "[MASK]": "<mask>"}


# --- protobuf wire format (ModelProto), enough to read a model's pieces and character map and write one -----

def _varint(data: bytes, pos: int) -> tuple[int, int]:
  value, shift = 0, 0
  while True:
    byte = data[pos]
    pos += 1
    value |= (byte & 0x7F) << shift
    shift += 7
    if byte < 0x80:
      return value, pos


def _fields(data: bytes):
  """(field number, wire type, value) of one message: ints for varints, bytes otherwise."""
  pos = 0
  while pos < len(data):
    key, pos = _varint(data, pos)
    number, wire = key >> 3, key & 7
    if wire == 0:
      value, pos = _varint(data, pos)
    elif wire == 1:
      value, pos = data[pos:pos + 8], pos + 8
    elif wire == 2:
      size, pos = _varint(data, pos)
      value, pos = data[pos:pos + size], pos + size
    elif wire == 5:
      value, pos = data[pos:pos + 4], pos + 4
    else:
      raise ValueError(f"unsupported protobuf wire type {wire}")
    yield number, wire, value


def _put_varint(value: int) -> bytes:
  value &= (1 << 64) - 1  # negative int32s take ten bytes
  out = bytearray()
  while True:
    byte = value & 0x7F
    value >>= 7
    if value:
      out.append(byte | 0x80)
    else:
      out.append(byte)
      return bytes(out)


def _put(number: int, value) -> bytes:
  if isinstance(value, bool) or isinstance(value, int):
    return _put_varint(number << 3) + _put_varint(int(value))
  if isinstance(value, float):
    return _put_varint(number << 3 | 5) + struct.pack("<f", value)
  if isinstance(value, str):
    value = value.encode("utf-8")
  return _put_varint(number << 3 | 2) + _put_varint(len(value)) + value


def read_model(proto: bytes) -> tuple[list[tuple[str, float, int]], bytes, bool]:
  """A SentencePiece ModelProto's pieces (piece, score, type), precompiled character map, byte fallback."""
  pieces, charsmap, byte_fallback = [], b"", False
  for number, _, value in _fields(proto):
    if number == 1:
      piece, score, kind = "", 0.0, _NORMAL
      for n, _, v in _fields(value):
        if n == 1:
          piece = v.decode("utf-8")
        elif n == 2:
          score = struct.unpack("<f", v)[0]
        elif n == 3:
          kind = v
      pieces.append((piece, score, kind))
    elif number == 2:
      byte_fallback = any(n == 35 and v for n, _, v in _fields(value))
    elif number == 3:
      charsmap = next((v for n, _, v in _fields(value) if n == 2), b"")
  return pieces, charsmap, byte_fallback


def write_model(pieces: list[tuple[str, float, int]], charsmap: bytes = b"", byte_fallback: bool = False,
                unk_id: int = 0) -> bytes:
  """A Unigram ModelProto with these pieces, and a normalizer that is `charsmap` alone (no dummy prefix, no
  white-space folding or escaping: the caller splits words and marks them)."""
  out = bytearray()
  for piece, score, kind in pieces:
    body = _put(1, piece) + _put(2, float(score)) + _put(3, kind)
    out += _put(1, body)
  trainer = (_put(3, 1) + _put(4, len(pieces)) + _put(35, byte_fallback) + _put(40, unk_id) + _put(41, -1)
             + _put(42, -1) + _put(43, -1))
  out += _put(2, trainer)
  normalizer = (_put(1, "nmt_nfkc" if charsmap else "identity") + (_put(2, charsmap) if charsmap else b"")
                + _put(3, False) + _put(4, False) + _put(5, False))
  out += _put(3, normalizer)
  return bytes(out)


def model_type(proto: bytes) -> int:
  """The trainer spec's model type: 1 unigram (the default), 2 BPE, 3 word, 4 char."""
  spec = next((v for n, _, v in _fields(proto) if n == 2), b"")
  return next((v for n, _, v in _fields(spec) if n == 3), 1)


def with_scores(proto: bytes, rescore) -> bytes:
  """`proto` (a ModelProto) with each piece's score replaced by rescore(piece, score); every other field kept."""
  out = bytearray()
  for number, wire, value in _fields(proto):
    if number != 1:
      out += _put_varint(number << 3 | wire) + (_put_varint(value) if wire == 0 else
                                                 _put_varint(len(value)) + value if wire == 2 else value)
      continue
    fields = list(_fields(value))
    piece = next((v.decode("utf-8") for n, _, v in fields if n == 1), "")
    score = next((struct.unpack("<f", v)[0] for n, _, v in fields if n == 2), 0.0)
    body = _put(1, piece) + _put(2, float(rescore(piece, score)))
    body += b"".join(_put(n, v) for n, _, v in fields if n not in (1, 2))
    out += _put(1, body)
  return bytes(out)


def with_pieces(proto: bytes, pieces: list[tuple[str, float]]) -> bytes:
  """`proto` (a ModelProto) with normal pieces (piece, score) appended after its own: repeated fields
  concatenate in wire order, so every other field, and every old piece's id, stays as it was."""
  return proto + b"".join(_put(1, _put(1, piece) + _put(2, float(score)) + _put(3, _NORMAL))
                          for piece, score in pieces)


# --- the Precompiled normalizer, as tokenizers applies it ---------------------------------------------------

class _Charsmap:
  """The Precompiled normalizer of tokenizers (transformers' tokenizers of SentencePiece models) over a
  model's precompiled character map: a darts-clone double-array trie of byte strings and their
  replacements. As tokenizers does, a grapheme cluster of under 6 bytes is replaced whole by the
  replacement of its *first* (shortest) prefix in the map, when it has one; other clusters, and those,
  character by character."""
  def __init__(self, data: bytes):
    size = struct.unpack("<I", data[:4])[0]
    self.array = struct.unpack(f"<{size // 4}I", data[4:4 + size])
    self.blob = data[4 + size:]
    self.cache = {}

  def prefix_first(self, key: bytes) -> int | None:
    """The replacement's offset of the shortest prefix of `key` in the trie (darts-clone's layout)."""
    a = self.array
    pos = 0
    unit = a[pos]
    pos ^= (unit >> 10) << ((unit & (1 << 9)) >> 6)
    for c in key:
      if c == 0:
        break
      pos ^= c
      if pos >= len(a):
        return None
      unit = a[pos]
      if unit & ((1 << 31) | 0xFF) != c:
        return None
      pos ^= (unit >> 10) << ((unit & (1 << 9)) >> 6)
      if (unit >> 8) & 1:
        return a[pos] & ((1 << 31) - 1)
    return None

  def transform(self, chunk: str) -> str | None:
    found = self.cache.get(chunk, 0)
    if found == 0:
      index = self.prefix_first(chunk.encode("utf-8"))
      if index is not None:
        end = self.blob.index(b"\0", index)
        found = self.blob[index:end].decode("utf-8")
      else:
        found = None
      if len(self.cache) < 1 << 16:
        self.cache[chunk] = found
    return found

  def normalize(self, text: str) -> str:
    if text.isascii() and "\r\n" not in text:  # one character per cluster
      return "".join(ch if (norm := self.transform(ch)) is None else norm for ch in text)
    out = []
    for g in _graphemes(text):
      if len(g.encode("utf-8")) < 6:
        norm = self.transform(g)
        if norm is not None:
          out.append(norm)
          continue
      for ch in g:
        norm = self.transform(ch)
        out.append(ch if norm is None else norm)
    return "".join(out)


_PREPEND = frozenset([*range(0x600, 0x606), 0x6DD, 0x70F, 0x890, 0x891, 0x8E2, 0x110BD, 0x110CD])
_OTHER_EXTEND = frozenset([0x200C, 0xFF9E, 0xFF9F, *range(0x1F3FB, 0x1F400), *range(0xE0020, 0xE0080)])
_SPACING_EXTRA = frozenset([0xE33, 0xEB3])
_PICT_RANGES = ((0x1F000, 0x1F0FF), (0x1F10D, 0x1F10F), (0x1F12F, 0x1F12F), (0x1F16C, 0x1F171), (0x1F17E, 0x1F17F),
                (0x1F18E, 0x1F18E), (0x1F191, 0x1F19A), (0x1F1AD, 0x1F1E5), (0x1F201, 0x1F20F), (0x1F21A, 0x1F21A),
                (0x1F22F, 0x1F22F), (0x1F232, 0x1F23A), (0x1F23C, 0x1F23F), (0x1F249, 0x1F3FA), (0x1F400, 0x1F53D),
                (0x1F546, 0x1F64F), (0x1F680, 0x1F6FF), (0x1F774, 0x1F77F), (0x1F7D5, 0x1F7FF), (0x1F80C, 0x1F80F),
                (0x1F848, 0x1F84F), (0x1F85A, 0x1F85F), (0x1F888, 0x1F88F), (0x1F8AE, 0x1F8FF), (0x1F90C, 0x1F93A),
                (0x1F93C, 0x1F945), (0x1F947, 0x1FAFF), (0x1FC00, 0x1FFFD), (0x2600, 0x27BF), (0x2300, 0x23FF))
_PICT_SINGLE = frozenset([0xA9, 0xAE, 0x203C, 0x2049, 0x2122, 0x2139, *range(0x2194, 0x219A), 0x21A9, 0x21AA,
                          0x24C2, 0x25AA, 0x25AB, 0x25B6, 0x25C0, *range(0x25FB, 0x25FF), 0x2934, 0x2935,
                          *range(0x2B05, 0x2B08), 0x2B1B, 0x2B1C, 0x2B50, 0x2B55, 0x3030, 0x303D, 0x3297, 0x3299])


@functools.lru_cache(maxsize=1 << 16)
def _gcb(ch: str) -> str:
  """The character's Grapheme_Cluster_Break property (Extended_Pictographic as "Pict"), approximately."""
  cp = ord(ch)
  if cp == 0x0D:
    return "CR"
  if cp == 0x0A:
    return "LF"
  if cp == 0x200D:
    return "ZWJ"
  if 0x1F1E6 <= cp <= 0x1F1FF:
    return "RI"
  if cp in _PREPEND:
    return "Prepend"
  if cp in _OTHER_EXTEND:
    return "Extend"
  cat = unicodedata.category(ch)
  if cat in ("Mn", "Me"):
    return "Extend"
  if cat == "Mc" or cp in _SPACING_EXTRA:
    return "SpacingMark"
  if cat in ("Cc", "Zl", "Zp", "Cf", "Cs") or (cat == "Cn" and 0xE0000 <= cp <= 0xE0FFF):
    return "Control"
  if 0x1100 <= cp <= 0x115F or 0xA960 <= cp <= 0xA97C:
    return "L"
  if 0x1160 <= cp <= 0x11A7 or 0xD7B0 <= cp <= 0xD7C6:
    return "V"
  if 0x11A8 <= cp <= 0x11FF or 0xD7CB <= cp <= 0xD7FB:
    return "T"
  if 0xAC00 <= cp <= 0xD7A3:
    return "LV" if (cp - 0xAC00) % 28 == 0 else "LVT"
  if cp in _PICT_SINGLE or any(a <= cp <= b for a, b in _PICT_RANGES):
    return "Pict"
  return "Other"


def _graphemes(text: str) -> list[str]:
  """Extended grapheme clusters (UAX #29's rules, from unicodedata's categories; Indic conjuncts are not
  joined, which leaves them over 6 bytes or without a replacement alike)."""
  clusters, start, prev, pict_zwj, ri_count = [], 0, None, False, 0
  in_pict = False
  for i, ch in enumerate(text):
    kind = _gcb(ch)
    if prev is None:
      join = False
    elif prev == "CR" and kind == "LF":
      join = True
    elif prev in ("Control", "CR", "LF") or kind in ("Control", "CR", "LF"):
      join = False
    elif prev == "L" and kind in ("L", "V", "LV", "LVT"):
      join = True
    elif prev in ("LV", "V") and kind in ("V", "T"):
      join = True
    elif prev in ("LVT", "T") and kind == "T":
      join = True
    elif kind in ("Extend", "ZWJ", "SpacingMark"):
      join = True
    elif prev == "Prepend":
      join = True
    elif prev == "ZWJ" and kind == "Pict" and pict_zwj:
      join = True
    elif prev == "RI" and kind == "RI":
      join = ri_count % 2 == 1
    else:
      join = False
    if not join and i:
      clusters.append(text[start:i])
      start = i
    # GB11 state: a pictographic char followed by Extend* then ZWJ
    if kind == "Pict":
      in_pict = True
    elif kind != "Extend" and kind != "ZWJ":
      in_pict = False
    pict_zwj = in_pict and kind == "ZWJ"
    ri_count = ri_count + 1 if kind == "RI" else 0
    prev = kind
  if text:
    clusters.append(text[start:])
  return clusters


# --- the vocabulary as transformers lays it out ---------------------------------------------------------------

def fairseq_vocab(kind: str, pieces: list[tuple[str, float, int]]) -> list[tuple[str, float]]:
  """transformers' CamembertConverter / XLMRobertaConverter vocabulary of a SentencePiece model's pieces."""
  if kind == "camembert_spm":
    head = [("<s>NOTUSED", 0.0), ("<pad>", 0.0), ("</s>NOTUSED", 0.0), ("<unk>", 0.0), ("<unk>NOTUSED", -100.0)]
    return head + [(p, s) for p, s, _ in pieces[1:]] + [("<mask>", 0.0)]
  if kind == "xlmr_spm":
    head = [("<s>", 0.0), ("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    return head + [(p, s) for p, s, _ in pieces[3:]] + [("<mask>", 0.0)]
  raise DataError(f"tokenizer kind {kind!r} is not one of {KINDS}")


def _added_tokens(vocab: list[tuple[str, float]]) -> list[dict]:
  """The added tokens transformers' tokenizer of that vocabulary matches in raw text (fairseq's NOTUSED
  symbols are not among them: they stay pieces of its Unigram model)."""
  ids = {p: i for i, (p, _) in enumerate(vocab)}
  return [{"id": ids[t], "content": t, "lstrip": t == "<mask>", "rstrip": False}
          for t in ("<pad>", "<unk>", "<s>", "</s>", "<mask>") if t in ids]


class FairseqSentencePieceTokenizer(TokenizerBase):
  """CamemBERT's or XLM-R's tokenizer over a `sentencepiece.bpe.model` or a `tokenizer.json`.

  encode(text) -> ids without `<s>`/`</s>`, equal to transformers' tokenizer of the same folder.
  """
  lower_case = False

  def __init__(self, path: str, kind: str):
    import sentencepiece as spm  # pylint: disable=import-outside-toplevel
    if kind not in KINDS:
      raise DataError(f"tokenizer kind {kind!r} is not one of {KINDS}")
    self.path, self.kind = path, kind
    try:
      with open_binary(path) as f:
        raw = f.read()
      if path.endswith(".json"):
        vocab, unk_id, charsmap, added, self.prepend = _from_tokenizer_json(json.loads(raw))
      else:
        pieces, charsmap, _ = read_model(raw)  # transformers' classes turn byte fallback off
        vocab, unk_id, self.prepend = fairseq_vocab(kind, pieces), 3, "always"
        added = _added_tokens(vocab)
      for a in sorted(added, key=lambda a: a["id"]):  # added tokens past the model's vocabulary take their ids
        if a["id"] >= len(vocab):
          vocab += [(f"<unused{i}>", 0.0) for i in range(len(vocab), a["id"])] + [(a["content"], 0.0)]
      special = {a["id"] for a in added}
      types = [_UNKNOWN if i == unk_id else _CONTROL if i in special else _NORMAL for i in range(len(vocab))]
      pieces = [(p, s, t) for (p, s), t in zip(vocab, types)]
      if _NORMAL not in types:  # sentencepiece loads no model without a piece (a vocabulary of symbols alone)
        pieces.append(("\U0010ffff", -1e9, _NORMAL))
      self._sp = spm.SentencePieceProcessor(model_proto=write_model(pieces, b"", False, unk_id))
      self._normalizer = _Charsmap(charsmap) if charsmap else None
    except (OSError, RuntimeError, ValueError, KeyError, IndexError, UnicodeDecodeError) as e:
      raise DataError(f"cannot load {kind} tokenizer {path}: {e}; pass a {HF_MODEL_FILE} or "
                      f"{HF_TOKENIZER_FILE}") from None
    self.scored_vocab, self.charsmap, self.added = vocab, charsmap, added
    self.vocab = [p for p, _ in vocab]
    self._ids = {p: i for i, p in enumerate(self.vocab)}
    self.special_ids = {role: self._ids.get(token) for role, token in _ROLES.items()}
    self.special_ids["[UNK]"] = unk_id
    missing = [role for role, i in self.special_ids.items() if i is None]
    if missing:
      raise DataError(f"{kind} tokenizer {path} lacks {', '.join(_ROLES[m] for m in missing)}")
    self._added = sorted(added, key=lambda a: -len(a["content"]))
    self._added_re = re.compile("|".join(
        (_SPACE_CLASS + "*" if a["lstrip"] else "") + re.escape(a["content"]) + (_SPACE_CLASS + "*" if a["rstrip"] else "")
        for a in self._added)) if added else None
    self._added_ids = {a["content"]: a["id"] for a in added}
    self._special = np.array(types) == _CONTROL
    self._special[unk_id] = True
    self._cache: dict[str, list[int]] = {}

  def _words(self, text: str) -> list[str]:
    if self._normalizer is not None:
      text = self._normalizer.normalize(text)
    words = [w for w in _WHITE_SPACE.split(text) if w]
    marked = []
    for n, word in enumerate(words):
      if not word.startswith(_META) and (self.prepend == "always" or (self.prepend == "first" and n == 0)):
        word = _META + word
      # Metaspace's split: each `▁` starts a piece of its own
      marked.extend(part for part in re.split(f"(?={_META})", word) if part)
    return marked

  def marked_words(self, text: str) -> list[str]:
    """The words of `text` as the Unigram search sees them: normalized, white-space split, `▁`-marked."""
    return self._words(text)

  def _encode_plain(self, text: str) -> list[int]:
    ids = []
    for word in self._words(text):
      found = self._cache.get(word)
      if found is None:
        if len(self._cache) > 1 << 20:
          self._cache.clear()
        found = self._cache[word] = self._sp.encode(word)
      ids.extend(found)
    return ids

  def encode(self, text: str) -> list[int]:
    """Token ids without `<s>`/`</s>`."""
    if self._added_re is None:
      return self._encode_plain(text)
    ids, start = [], 0
    for match in self._added_re.finditer(text):
      ids.extend(self._encode_plain(text[start:match.start()]))
      ids.append(self._added_ids[_WHITE_SPACE.sub("", match.group())])
      start = match.end()
    return ids + self._encode_plain(text[start:])

  def decode(self, ids) -> str:
    text = "".join(self.vocab[int(i)] for i in ids if not self._special[int(i)])
    return text.replace(_META, " ").strip()

  def special_mask(self) -> np.ndarray:
    """bool[vocab]: ids never masked nor drawn as random replacements (fairseq's symbols, `<mask>`)."""
    mask = self._special.copy()
    mask[[i for i in self.special_ids.values()]] = True
    return mask

  def continuation_mask(self) -> np.ndarray:
    """bool[vocab]: pieces without the word-start marker continue the previous word."""
    return np.array([not t.startswith(_META) for t in self.vocab], bool) & ~self.special_mask()


def _from_tokenizer_json(spec: dict) -> tuple[list[tuple[str, float]], int, bytes, list[dict], str]:
  """(vocab, unk id, character map, added tokens, Metaspace prepend scheme) of a tokenizer.json, read as
  transformers' CamembertTokenizer and XLMRobertaTokenizer read it: its Unigram vocabulary, the precompiled
  character map of its normalizer (any other normalizer step is dropped), their own pre-tokenizer
  (white-space split, then Metaspace), and no byte fallback."""
  model = spec.get("model") or {}
  if model.get("type") not in (None, "Unigram") or not isinstance(model.get("vocab"), list):
    raise ValueError(f"its model is {model.get('type')!r}, not a SentencePiece Unigram model")
  vocab = [(p, float(s)) for p, s in model["vocab"]]
  normalizer = spec.get("normalizer") or {}
  steps = normalizer.get("normalizers", []) if normalizer.get("type") == "Sequence" else [normalizer]
  charsmap = next((base64.b64decode(step["precompiled_charsmap"]) for step in steps
                   if step.get("type") == "Precompiled" and step.get("precompiled_charsmap")), b"")
  pre = spec.get("pre_tokenizer") or {}
  steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
  metaspace = next((step for step in steps if step.get("type") == "Metaspace"), {})
  prepend = metaspace.get("prepend_scheme") or ("always" if metaspace.get("add_prefix_space", True) else "never")
  added = [{"id": a["id"], "content": a["content"], "lstrip": a.get("lstrip", False), "rstrip": a.get("rstrip", False)}
           for a in spec.get("added_tokens") or []]
  return vocab, int(model.get("unk_id") or 0), charsmap, added, prepend


def unigram_model(spec: dict) -> tuple[bytes, bytes, list[str]]:
  """(a SentencePiece ModelProto of its Unigram pieces, scores and ids, with its added tokens as control
  symbols and no normalizer of its own; the precompiled character map; the normalizer's step types) of a
  tokenizer.json (XLNet's: tokenizers.py:XLNetTokenizer). ValueError when it holds no Unigram model."""
  vocab, unk_id, charsmap, added, _ = _from_tokenizer_json(spec)
  special = {a["id"] for a in added}
  pieces = [(p, s, _UNKNOWN if i == unk_id else _CONTROL if i in special else _NORMAL)
            for i, (p, s) in enumerate(vocab)]
  normalizer = spec.get("normalizer") or {}
  steps = normalizer.get("normalizers", []) if normalizer.get("type") == "Sequence" else [normalizer]
  return write_model(pieces, b"", False, unk_id), charsmap, [step.get("type") for step in steps]


def normalizer(charsmap: bytes) -> _Charsmap:
  """tokenizers' Precompiled normalizer over a precompiled character map (`.normalize(text)`)."""
  return _Charsmap(charsmap)


def hf_tokenizer_json(tokenizer: FairseqSentencePieceTokenizer) -> dict:
  """The tokenizer.json transformers' CamembertTokenizer / XLMRobertaTokenizer saves for this vocabulary."""
  def added(a):
    return {"id": a["id"], "content": a["content"], "single_word": False, "lstrip": a["lstrip"],
            "rstrip": a["rstrip"], "normalized": False, "special": True}
  metaspace = {"type": "Metaspace", "replacement": _META, "prepend_scheme": tokenizer.prepend, "split": True}
  bos, eos = tokenizer.special_ids["[CLS]"], tokenizer.special_ids["[SEP]"]
  def special(name):
    return {"SpecialToken": {"id": name, "type_id": 0}}
  def sequence(name):
    return {"Sequence": {"id": name, "type_id": 0}}
  return {
      "version": "1.0", "truncation": None, "padding": None,
      "added_tokens": [added(a) for a in sorted(tokenizer.added, key=lambda a: a["id"])],
      "normalizer": ({"type": "Precompiled", "precompiled_charsmap": base64.b64encode(tokenizer.charsmap).decode()}
                     if tokenizer.charsmap else None),
      "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "WhitespaceSplit"}, metaspace]},
      "post_processor": {
          "type": "TemplateProcessing",
          "single": [special("<s>"), sequence("A"), special("</s>")],
          "pair": [special("<s>"), sequence("A"), special("</s>"), special("</s>"), sequence("B"), special("</s>")],
          "special_tokens": {"<s>": {"id": "<s>", "ids": [bos], "tokens": ["<s>"]},
                             "</s>": {"id": "</s>", "ids": [eos], "tokens": ["</s>"]}}},
      "decoder": metaspace,
      "model": {"type": "Unigram", "unk_id": tokenizer.special_ids["[UNK]"], "vocab": [list(v) for v in tokenizer.scored_vocab],
                "byte_fallback": False}}
