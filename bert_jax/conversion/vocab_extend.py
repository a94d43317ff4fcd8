"""`bert-jax vocab extend`: domain words added to a checkpoint's vocabulary, as exBERT and domain models do.

The N most frequent words of a domain corpus that the vocabulary splits into several pieces become
tokens of their own, appended after the old ones (old ids unchanged). Each new row of every
vocabulary-sized parameter (the word embeddings; the MLM output bias) starts as the mean of the word's
old pieces' rows, and model.vocab_size grows to match, so the extended model predicts and exports as
before for old tokens. A table padded past its vocabulary (pretraining rounds vocab_size up: 8192 rows
for the embedded 7716-entry vocabulary) gives its padding rows to the new words first.

- WordPiece: the whole word is appended to vocab.txt (greedy longest-match finds it first).
- SentencePiece (ALBERT's layout, a unigram `spiece.model`): the word, `▁`-marked, is appended to the
  model as a normal piece whose score is the model's best (a single piece then outscores any split of
  the word in the Unigram search). Not as a user-defined piece: transformers' converter makes those
  added tokens matched in the raw text, where no `▁` is, so HF's tokenizer would split the word.
- fairseq's layout (CamemBERT, XLM-R: `<mask>` is the last id, after the model's pieces): appending to
  the SentencePiece model would move `<mask>`; instead the tokenizer becomes the tokenizer.json
  transformers reads, the new pieces (same score rule) after `<mask>`, so `<mask>` and every old id
  keep their ids and the new words take the ids after it.
SentencePiece BPE models (merges, not a Unigram search) and byte-level BPE are refused.
"""
from __future__ import annotations

import collections
import os

import jax
import numpy as np

from bert_jax import workdir
from bert_jax.conversion import common
from bert_jax.data_pipelines import fairseq_spm, tokenizer_kinds
from bert_jax.data_pipelines.tokenizers import albert_preprocess, basic_tokenize
from bert_jax.errors import UserError

_MARK = "\u2581"


def extendable() -> tuple[str, ...]:
  """The tokenizer kinds this extends: those whose record names a way (`TokenizerKind.extend`, `_WAYS`)."""
  return tuple(k for k in tokenizer_kinds.names() if tokenizer_kinds.get(k).extend)


def _way(kind: str) -> str:
  if kind not in extendable():
    raise UserError(f"a {kind} vocabulary; `bert-jax vocab extend` extends {', '.join(extendable())} vocabularies")
  return tokenizer_kinds.get(kind).extend


def candidates(tokenizer, sentences, count: int, min_pieces: int = 2) -> list[tuple[str, list[int], int]]:
  """(word, its old piece ids, its frequency) for the `count` most frequent words split into at least
  `min_pieces` pieces (none of them unknown), most frequent first (ties by the word)."""
  counts = collections.Counter(word for sentence in sentences
                               for word in basic_tokenize(sentence, tokenizer.lower_case))
  unk = tokenizer.special_ids["[UNK]"]
  known = set(tokenizer.vocab)
  found = []
  for word, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
    pieces = tokenizer.encode(word)
    if len(pieces) >= min_pieces and unk not in pieces and new_token(tokenizer, word) not in known:
      found.append((word, pieces, n))
      if len(found) == count:
        break
  return found


def new_token(tokenizer, word: str) -> str | None:
  """The vocabulary entry that makes `word` one token: itself (WordPiece), or its `▁`-marked piece as the
  SentencePiece search sees it (None where the normalizer makes it several words)."""
  return _WAYS[_way(tokenizer.kind)][0](tokenizer, word)


def _unigram_token(tokenizer, word: str) -> str:
  return _MARK + albert_preprocess(word, tokenizer.lower_case, tokenizer.quotes_to_double)


def _fairseq_token(tokenizer, word: str) -> str | None:
  marked = tokenizer.marked_words(word)
  return marked[0] if len(marked) == 1 else None


def _has_vocab_axis(path) -> bool:
  return any(getattr(k, "key", None) in ("word_embeddings", "output_bias") for k in path)


def grow(params, table_size: int, first: int, pieces: list[list[int]]):
  """`params` with the word embeddings' and the MLM output bias' rows `first`, `first` + 1, ... (along their
  vocabulary axis, of size table_size) set to the mean of each new word's pieces' rows: padding rows past the
  vocabulary (`first` < table_size) are taken first, then the tables grow."""
  end = first + len(pieces)

  def grown(path, x):
    x = np.asarray(x)
    if not _has_vocab_axis(path) or table_size not in x.shape:
      return x
    axis = x.shape.index(table_size)
    rows = np.stack([np.take(x, p, axis=axis).mean(axis=axis) for p in pieces], axis=axis)
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, max(end - table_size, 0))
    x = np.pad(x, widths)
    where = [slice(None)] * x.ndim
    where[axis] = slice(first, end)
    x[tuple(where)] = rows.astype(x.dtype)
    return x
  return jax.tree_util.tree_map_with_path(grown, params)


def extended(converted: common.Converted, tokenizer, words: list[tuple[str, list[int], int]],
             directory: str) -> common.Converted:
  """`converted` with `words` (from `candidates`) added to its vocabulary (written into `directory`: see
  the module docstring) and its parameters set to match: a table padded past the vocabulary (vocab_size
  rounded up to a multiple) gives its padding rows to the new words first, and grows only past them."""
  info, config = converted.tokenizer, converted.config
  way = _way(info.kind if info else "missing")
  if config.vocab_size < tokenizer.vocab_size:
    raise UserError(f"the model has {config.vocab_size} token embeddings but its vocabulary {tokenizer.vocab_size} "
                    "entries: the vocabulary's last ids have no embedding; extend a model whose table covers it")
  tokens = [new_token(tokenizer, w) for w, _, _ in words]
  name = _WAYS[way][1](tokenizer, tokens, directory)
  params = grow(converted.params, config.vocab_size, tokenizer.vocab_size, [p for _, p, _ in words])
  size = max(config.vocab_size, tokenizer.vocab_size + len(words))
  return common.Converted(converted.family, config.replace(vocab_size=size), params,
                          common.Tokenizer(info.kind, info.lower_case, {name: os.path.join(directory, name)},
                                           info.max_chars_per_word), pooling=converted.pooling)


def _wordpiece(tokenizer, tokens: list[str], directory: str) -> str:
  workdir.write_text(os.path.join(directory, "vocab.txt"), "".join(t + "\n" for t in [*tokenizer.vocab, *tokens]))
  return "vocab.txt"


def _sentencepiece(tokenizer, tokens: list[str], directory: str) -> str:
  with open(tokenizer.path, "rb") as f:
    proto = f.read()
  if fairseq_spm.model_type(proto) != 1:
    raise UserError(f"{tokenizer.path} is not a unigram SentencePiece model (a BPE one merges pieces: a new piece "
                    "is not reached); `bert-jax vocab extend` extends unigram models")
  pieces, _, _ = fairseq_spm.read_model(proto)
  best = max(score for _, score, kind in pieces if kind == 1)
  workdir.write_bytes(os.path.join(directory, "spiece.model"), fairseq_spm.with_pieces(proto, [(t, best) for t in tokens]))
  return "spiece.model"


def _fairseq(tokenizer, tokens: list[str], directory: str) -> str:
  spec = fairseq_spm.hf_tokenizer_json(tokenizer)
  special = tokenizer.special_mask()
  best = max(score for (_, score), s in zip(tokenizer.scored_vocab, special) if not s)
  spec["model"]["vocab"] += [[t, best] for t in tokens]
  workdir.write_json(os.path.join(directory, fairseq_spm.HF_TOKENIZER_FILE), spec)
  return fairseq_spm.HF_TOKENIZER_FILE


# TokenizerKind.extend -> (the entry that makes a word one token, the writer of the extended vocabulary)
_WAYS = {
    "whole_word": (lambda tokenizer, word: word, _wordpiece),
    "unigram": (_unigram_token, _sentencepiece),
    "fairseq": (_fairseq_token, _fairseq),
}
