"""`bert-jax vocab extend`: domain words added to a checkpoint's vocabulary, as exBERT and domain models do.

The N most frequent words of a domain corpus that the vocabulary splits into several pieces become
tokens of their own, appended after the old ones (old ids unchanged). Each new row of every
vocabulary-sized parameter (the word embeddings; the MLM output bias) starts as the mean of the word's
old pieces' rows, and model.vocab_size grows to match, so the extended model predicts and exports as
before for old tokens. WordPiece vocabularies only for now (a whole word added to vocab.txt is what
greedy longest-match finds first); SentencePiece models are refused with that message.
"""
from __future__ import annotations

import collections

import jax
import numpy as np

from bert_jax.conversion import common
from bert_jax.data_pipelines.tokenizers import basic_tokenize
from bert_jax.errors import UserError


def candidates(tokenizer, sentences, count: int, min_pieces: int = 2) -> list[tuple[str, list[int], int]]:
  """(word, its old piece ids, its frequency) for the `count` most frequent words split into at least
  `min_pieces` pieces (none of them unknown), most frequent first (ties by the word)."""
  counts = collections.Counter(word for sentence in sentences
                               for word in basic_tokenize(sentence, tokenizer.lower_case))
  unk = tokenizer.special_ids["[UNK]"]
  found = []
  for word, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
    pieces = tokenizer.encode(word)
    if len(pieces) >= min_pieces and unk not in pieces:
      found.append((word, pieces, n))
      if len(found) == count:
        break
  return found


def _has_vocab_axis(path) -> bool:
  return any(getattr(k, "key", None) in ("word_embeddings", "output_bias") for k in path)


def grow(params, old_size: int, pieces: list[list[int]]):
  """`params` with the word embeddings and the MLM output bias grown by one row per new word (along their
  vocabulary axis, of size old_size): the mean of its pieces' rows."""
  def grown(path, x):
    x = np.asarray(x)
    if not _has_vocab_axis(path) or old_size not in x.shape:
      return x
    axis = x.shape.index(old_size)
    rows = np.stack([np.take(x, p, axis=axis).mean(axis=axis) for p in pieces], axis=axis)
    return np.concatenate([x, rows.astype(x.dtype)], axis=axis)
  return jax.tree_util.tree_map_with_path(grown, params)


def extended(converted: common.Converted, tokenizer, words: list[tuple[str, list[int], int]],
             vocab_path: str) -> common.Converted:
  """`converted` with `words` (from `candidates`) appended to its WordPiece vocabulary, written to
  `vocab_path`, and its parameters grown to match."""
  info, config = converted.tokenizer, converted.config
  if info is None or info.kind != "wordpiece":
    raise UserError(f"a {info.kind if info else 'missing'} vocabulary; `bert-jax vocab extend` extends WordPiece "
                    "vocabularies (vocab.txt) only for now")
  if config.vocab_size != tokenizer.vocab_size:
    raise UserError(f"the model has {config.vocab_size} token embeddings but its vocabulary {tokenizer.vocab_size} "
                    "entries; extend a model whose sizes agree")
  with open(vocab_path, "w", encoding="utf-8") as f:
    f.write("".join(t + "\n" for t in [*tokenizer.vocab, *(w for w, _, _ in words)]))
  params = grow(converted.params, config.vocab_size, [p for _, p, _ in words])
  return common.Converted(converted.family, config.replace(vocab_size=config.vocab_size + len(words)), params,
                          common.Tokenizer(info.kind, info.lower_case, {"vocab.txt": vocab_path},
                                           info.max_chars_per_word), pooling=converted.pooling)
