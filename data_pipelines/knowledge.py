"""Knowledge masking's units (ERNIE 1.0, Sun et al. 2019): annotators that find phrases and named entities in
raw text, and the per-token tags that carry them from tokenization to the masking (masking.py, "knowledge").

An annotator maps a sentence's raw text (capitalisation intact: it runs before the tokenizer lower-cases)
to character spans `(start, end, level)`, level PHRASE or ENTITY, each covering two words or more (a single
word is a basic unit already). Three annotators, chosen by `data.knowledge`:
- `spacy_model` named: a spaCy pipeline's entities, and its noun chunks as phrases when it parses;
- `phrases` (a file, one phrase or entity per line, `phrase<TAB>text` for a phrase): matched
  case-insensitively, word by word, longest first;
- neither: the offline default, runs of capitalised words ("Free Software Foundation", joined by "of",
  "the", "de", ... as in "Bank of America") as entities, a sentence's first word left out when it is a
  common function word ("The", "In", ...).

Tags. A token's tag is 0 outside a span, 2L - 1 on the first token of a level-L span and 2L on the
others. The sentence is encoded piece by piece, cut at the spans' edges (which fall between words, where
WordPiece cuts anyway), and each id carries its tag in the bits from TAG_SHIFT up, so the rows are built
from the tagged ids by the example builders unchanged; `split_tags` takes them apart in the masking graph.
Prepared documents (`bert-jax data prepare --knowledge ...`) keep the tags in a `units` feature beside `ids`.
"""
from __future__ import annotations

import bisect
import itertools
import re

from bert_jax.data_pipelines.errors import DataError
from bert_jax.errors import require
from bert_jax.data_pipelines.tftools import open_binary, tf

LEVELS = ("basic", "phrase", "entity")
PHRASE, ENTITY = 1, 2
TAG_SHIFT = 24  # ids below 2**24 (vocabularies up to 16.7M entries); tags 0..4 above
ID_MASK = (1 << TAG_SHIFT) - 1
_WORD = re.compile(r"\w+(?:[-\u2010]\w+|['\u2019](?!s\b)\w+)*")  # Jean-Paul, O'Brien; not the 's of Bob's
_TITLES = frozenset("mr mrs ms dr st jr sr prof gen sen rep mt ft".split())  # "Dr. Martin", "St. Louis"
_CONNECTORS = frozenset("of the for de du la le von van der den da del".split())  # not "and": two names
_OPENERS = frozenset(("the a an in on at this that these those when while after before during for from as if but "
                      "and or it he she they we i his her their our my its there then since by with to of so "
                      "however although though because what which who where how").split())


def first_tag(level: int) -> int:
  return 2 * level - 1


def _capitalised(word: str) -> bool:
  return word[0].isupper()


# A cheap test that a run may be there: two capitalised-looking words (any character outside ASCII's lower case
# may be a capital) with at most spaces (not a newline), a "." and two connectors between them; most sentences
# fail it. One search runs over a whole block of sentences joined by newlines.
_UPPER = "A-Z\u00c0-\u00de\u0100-\U0010ffff"
_SPACE = "[^\\S\n]"
_MAYBE_RUN = re.compile(rf"[{_UPPER}]\w*(?:['\u2019-]\w+)*(?:\.{_SPACE}*|{_SPACE}+)"
                        rf"(?:(?:{'|'.join(sorted(_CONNECTORS))}){_SPACE}+){{0,2}}[{_UPPER}]")


def capitalised_runs(text: str) -> list[tuple[int, int, int]]:
  """The offline default: runs of two or more capitalised words as entities (character spans)."""
  found = _MAYBE_RUN.search(text)
  return _runs(text, found.start()) if found else []


def _runs(text: str, start: int) -> list[tuple[int, int, int]]:
  """The runs from the word around `start`, where the first _MAYBE_RUN match begins (no run starts before it)."""
  while start and (text[start - 1].isalnum() or text[start - 1] in "_-'\u2010\u2019"):
    start -= 1
  words = [(m.group(), m.start(), m.end()) for m in _WORD.finditer(text, start)]
  first = not text[:start].strip()  # words[0] opens the sentence
  spans, i = [], 0
  while i < len(words):
    if not _capitalised(words[i][0]) or (i == 0 and first and words[i][0].lower() in _OPENERS):
      i += 1
      continue
    j = i + 1  # words[i:j] is the run so far
    while j < len(words):
      step = _continues(text, words, j)
      if not step:
        break
      j += step
    if j - i >= 2:
      spans.append((words[i][1], words[j - 1][2], ENTITY))
    i = j
  return spans


def _continues(text: str, words, j: int) -> int:
  """How many words from words[j] on extend a capitalised run that ends at words[j - 1] (0: it ends):
  a capitalised word, or one or two connectors and a capitalised word ("of", "of the"), with spaces
  only between them, or a "." after an initial or a title ("J. K. Rowling", "Dr. Martin")."""
  def joined(k):  # words[k - 1] and words[k] are neighbours in a name
    gap = text[words[k - 1][2]:words[k][1]]
    previous = words[k - 1][0]
    return not gap.strip() or (gap.strip() == "." and (len(previous) == 1 or previous.lower() in _TITLES)
                               and _capitalised(previous))
  for connectors in range(3):
    k = j + connectors
    if k >= len(words) or not all(joined(m) for m in range(j, k + 1)):
      return 0
    if _capitalised(words[k][0]) and not (connectors and words[k][0].lower() in _CONNECTORS):
      return connectors + 1
    if words[k][0].lower() not in _CONNECTORS:
      return 0
  return 0


class CapitalisedAnnotator:
  name = "capitalised"

  def __call__(self, texts: list[str]) -> list:
    joined = "\n".join(texts)
    if joined.count("\n") != len(texts) - 1:  # a text with a newline of its own
      return [capitalised_runs(t) for t in texts]
    spans, last = [()] * len(texts), -1
    starts = list(itertools.accumulate((len(t) + 1 for t in texts[:-1]), initial=0))  # each text's offset
    for found in _MAYBE_RUN.finditer(joined):
      i = bisect.bisect_right(starts, found.start()) - 1
      if i != last:  # the sentence's first match (they come in order)
        last, spans[i] = i, _runs(texts[i], found.start() - starts[i])
    return spans


class ListAnnotator:
  """Phrases and entities of a list file, matched case-insensitively on whole words, longest first."""

  def __init__(self, path: str):
    self.name = f"phrases:{path}"
    try:
      with open_binary(path) as f:
        lines = f.read().decode("utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
      raise DataError(f"data.knowledge.phrases={path!r} cannot be read ({getattr(e, 'strerror', None) or e}); "
                      "pass a UTF-8 file with one phrase or entity per line") from None
    except tf().errors.OpError as e:
      raise DataError(f"data.knowledge.phrases={path!r} cannot be read ({e.message.splitlines()[0]}); "
                      "pass a UTF-8 file with one phrase or entity per line") from None
    self._entries: dict[tuple[str, ...], int] = {}
    for line in lines:
      kind, _, text = line.partition("\t") if "\t" in line else ("entity", "", line)
      if kind.strip().lower() not in ("phrase", "entity"):
        raise DataError(f"data.knowledge.phrases={path!r}: {line!r} starts with {kind!r}; a line is a phrase or "
                        "entity, or `phrase<TAB>text` / `entity<TAB>text`")
      words = tuple(w.lower() for w in _WORD.findall(text))
      if len(words) >= 2:
        self._entries[words] = PHRASE if kind.strip().lower() == "phrase" else ENTITY
    self._longest = max((len(k) for k in self._entries), default=0)

  def _spans(self, text: str) -> list[tuple[int, int, int]]:
    words = [(m.group().lower(), m.start(), m.end()) for m in _WORD.finditer(text)]
    spans, i = [], 0
    while i < len(words):
      for n in range(min(self._longest, len(words) - i), 1, -1):
        level = self._entries.get(tuple(w for w, _, _ in words[i:i + n]))
        if level:
          spans.append((words[i][1], words[i + n - 1][2], level))
          i += n
          break
      else:
        i += 1
    return spans

  def __call__(self, texts: list[str]) -> list[list[tuple[int, int, int]]]:
    return [self._spans(t) for t in texts]


class SpacyAnnotator:
  """A spaCy pipeline's entities (ENTITY) and, when it parses, noun chunks (PHRASE) outside them."""

  def __init__(self, model: str):
    self.name = f"spacy:{model}"
    spacy = require("spacy", "knowledge", f"data.knowledge.spacy_model={model!r}")
    try:
      self._nlp = spacy.load(model)
    except (OSError, ValueError) as e:
      raise DataError(f"data.knowledge.spacy_model={model!r} cannot be loaded ({str(e).splitlines()[0][:160]}); "
                      "install it (python -m spacy download NAME), pass a pipeline's folder, or leave it empty "
                      "for the offline annotator") from None

  def _spans(self, doc) -> list[tuple[int, int, int]]:
    spans = [(e.start_char, e.end_char, ENTITY) for e in doc.ents if len(e) >= 2]
    if doc.has_annotation("DEP"):
      taken = [(s, e) for s, e, _ in spans]
      for chunk in doc.noun_chunks:
        s, e = chunk.start_char, chunk.end_char
        if len(chunk) >= 2 and all(e <= a or s >= b for a, b in taken):
          spans.append((s, e, PHRASE))
    return sorted(spans)

  def __call__(self, texts: list[str]) -> list[list[tuple[int, int, int]]]:
    return [self._spans(doc) for doc in self._nlp.pipe(texts)]


def make_annotator(spacy_model: str = "", phrases: str = ""):
  """The annotator `data.knowledge` names: spaCy, a list file, or the offline default."""
  if spacy_model:
    return SpacyAnnotator(spacy_model)
  if phrases:
    return ListAnnotator(phrases)
  return CapitalisedAnnotator()


def encode_tagged(encode, text: str, spans) -> list[int]:
  """`text`'s ids with each span's tags above TAG_SHIFT (spans sorted, not overlapping; others are dropped)."""
  if not spans:
    return encode(text)
  ids, at = [], 0
  for start, end, level in spans:
    if start < at:
      continue
    ids.extend(encode(text[at:start]))
    piece = encode(text[start:end])
    if piece:
      ids.append(piece[0] | first_tag(level) << TAG_SHIFT)
      ids.extend(i | 2 * level << TAG_SHIFT for i in piece[1:])
    at = end
  ids.extend(encode(text[at:]))
  return ids


class TaggedEncoder:
  """Documents (lists of sentence strings) -> lists of tagged ids, one annotator call per block."""

  def __init__(self, tokenizer, annotator):
    if tokenizer.vocab_size > ID_MASK + 1:
      raise DataError(f"data.masking=knowledge keeps tags above bit {TAG_SHIFT} of each id; this vocabulary has "
                      f"{tokenizer.vocab_size:,} entries, more than {ID_MASK + 1:,}")
    self.encode, self.annotator = tokenizer.encode, annotator

  def documents(self, docs: list[list[str]]) -> list[list[list[int]]]:
    encode, spans = self.encode, iter(self.annotator([s for doc in docs for s in doc]))
    return [[encode_tagged(encode, s, found) if (found := next(spans)) else encode(s) for s in doc]
            for doc in docs]


def split_ids(tagged: list[int]) -> tuple[list[int], list[int]]:
  """Tagged ids -> (ids, tags), as prepared records keep them."""
  return [i & ID_MASK for i in tagged], [i >> TAG_SHIFT for i in tagged]


def join_ids(ids, tags) -> list[int]:
  return [int(i) | int(t) << TAG_SHIFT for i, t in zip(ids, tags)]


def split_tags(ids):
  """int32[B, T] tagged ids -> (ids, tags), in TensorFlow."""
  t = tf()
  return t.bitwise.bitwise_and(ids, ID_MASK), t.bitwise.right_shift(ids, TAG_SHIFT)
