"""Training a vocabulary from a corpus: WordPiece (vocab.txt) or SentencePiece unigram/BPE (spm.model).

Both read the corpus as a stream of sentences; SentencePiece falls back to bytes, so any text round-trips. Special tokens come first, in BERT's order for
WordPiece ([PAD] [UNK] [CLS] [SEP] [MASK] = ids 0..4) and as [PAD]=0, [UNK]=1, control symbols
[CLS] [SEP] [MASK] = 2..4 for SentencePiece, so `pad_token_id = 0` holds for both.
"""
from __future__ import annotations

import os
import tempfile
from typing import Iterable, Iterator

from data_pipelines import corpora
from data_pipelines.errors import DataError
from data_pipelines.tftools import tf
from data_pipelines.tokenizers import SPECIAL_TOKENS

KINDS = ("wordpiece", "sentencepiece")
SENTENCEPIECE_TYPES = ("unigram", "bpe")


def corpus_sentences(patterns: str, corpus_format: str = corpora.SENTENCE_PER_LINE) -> Iterator[str]:
  stats = corpora.Stats()
  source = corpora.TextSource(corpora.list_files(patterns, "--corpus"), corpus_format, stats)
  for unit in source.units:
    for sentences, _, _ in source.read(unit, 0, 0):
      yield from sentences


def train_wordpiece(sentences: Iterable[str], size: int, output_dir: str, lower_case: bool = True) -> str:
  """Trains with the `tokenizers` WordPiece trainer using BERT's normaliser; returns the vocab.txt path."""
  from tokenizers import BertWordPieceTokenizer  # pylint: disable=import-outside-toplevel
  tokenizer = BertWordPieceTokenizer(clean_text=True, handle_chinese_chars=True,
                                     strip_accents=lower_case, lowercase=lower_case)
  tokenizer.train_from_iterator(sentences, vocab_size=size, min_frequency=2,
                                special_tokens=list(SPECIAL_TOKENS), limit_alphabet=1000,
                                show_progress=False)
  vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
  path = os.path.join(output_dir, "vocab.txt")
  _write(path, "".join(token + "\n" for token, _ in vocab).encode("utf-8"))
  return path


def train_sentencepiece(sentences: Iterable[str], size: int, output_dir: str, lower_case: bool = True,
                        model_type: str = "unigram") -> str:
  """Trains a SentencePiece model (unigram or BPE); returns the spm.model path."""
  import sentencepiece as spm  # pylint: disable=import-outside-toplevel
  if model_type not in SENTENCEPIECE_TYPES:
    raise DataError(f"--model-type={model_type!r}; choose one of {SENTENCEPIECE_TYPES}")
  sentences = (s.lower() if lower_case else s for s in sentences)
  with tempfile.TemporaryDirectory() as tmp:
    prefix = os.path.join(tmp, "spm")
    try:
      spm.SentencePieceTrainer.train(
          sentence_iterator=iter(sentences), model_prefix=prefix, vocab_size=size,
          model_type=model_type, pad_id=0, pad_piece="[PAD]", unk_id=1, unk_piece="[UNK]",
          bos_id=-1, eos_id=-1, control_symbols=["[CLS]", "[SEP]", "[MASK]"],
          character_coverage=0.9995, input_sentence_size=2_000_000, shuffle_input_sentence=True,
          byte_fallback=True, hard_vocab_limit=False, num_threads=os.cpu_count() or 1, minloglevel=2)
    except RuntimeError as e:
      raise DataError(f"SentencePiece training failed: {e}; a larger corpus or a smaller --size helps") from None
    with open(prefix + ".model", "rb") as f:
      model = f.read()
  path = os.path.join(output_dir, "spm.model")
  _write(path, model)
  return path


def _write(path: str, data: bytes) -> None:
  gfile = tf().io.gfile
  gfile.makedirs(os.path.dirname(path))
  with gfile.GFile(path, "wb") as f:
    f.write(data)


def train_vocab(corpus: str, kind: str, size: int, output_dir: str, lower_case: bool = True,
                corpus_format: str = corpora.SENTENCE_PER_LINE, model_type: str = "unigram") -> str:
  """`bert-jax vocab`: trains a `kind` vocabulary of about `size` entries from text files."""
  if kind not in KINDS:
    raise DataError(f"--type={kind!r}; choose one of {KINDS}")
  if size < len(SPECIAL_TOKENS) + 1:
    raise DataError(f"--size={size} is too small; use at least a few hundred")
  sentences = corpus_sentences(corpus, corpus_format)
  if kind == "wordpiece":
    return train_wordpiece(sentences, size, output_dir, lower_case)
  return train_sentencepiece(sentences, size, output_dir, lower_case, model_type)
