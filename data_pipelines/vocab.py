"""Training a vocabulary from a corpus: WordPiece (vocab.txt) or SentencePiece unigram/BPE (spm.model).

Both read the corpus as a stream of sentences (every one, or a uniform sample: `sample_sentences` here,
beam_vocab.py on a Beam runner, the same sentences); SentencePiece falls back to bytes, so any text
round-trips. Special tokens come first, in BERT's order for WordPiece ([PAD] [UNK] [CLS] [SEP] [MASK]
= ids 0..4) and as [PAD]=0, [UNK]=1, control symbols [CLS] [SEP] [MASK] = 2..4 for SentencePiece, so
`pad_token_id = 0` holds for both. CamemBERT's and XLM-R's kinds (camembert_spm, xlmr_spm) train a
SentencePiece model as theirs were (spm_train's defaults: `<unk>` `<s>` `</s>` = 0..2, nmt_nfkc, raw cased
text) and write it as a Hugging Face folder holds it, `sentencepiece.bpe.model`, with the tokenizer.json of
fairseq's layout of it (fairseq_spm.py), so pad = 1 and a model pretrained on it exports as theirs.
"""
from __future__ import annotations

import collections
import hashlib
import heapq
import itertools
import json
import os
import posixpath
import sys
import tempfile
from typing import Iterable, Iterator

from bert_jax import workdir
from bert_jax.data_pipelines import corpora, fairseq_spm
from bert_jax.data_pipelines.errors import DataError
from bert_jax.data_pipelines.tftools import tf, tf_module
from bert_jax.data_pipelines.tokenizers import SPECIAL_TOKENS, albert_preprocess

KINDS = ("wordpiece", "sentencepiece", *fairseq_spm.KINDS)
SENTENCEPIECE_TYPES = ("unigram", "bpe")


def corpus_sentences(patterns: str, corpus_format: str = corpora.SENTENCE_PER_LINE,
                     stats: corpora.Stats | None = None) -> Iterator[str]:
  stats = corpora.Stats() if stats is None else stats
  source = corpora.TextSource(corpora.list_files(patterns, "--corpus"), corpus_format, stats)
  for unit in source.units:
    for sentences, _, _ in corpora.read_unit(source, unit):
      yield from sentences


def sentence_key(seed: int, unit: str, index: int) -> int:
  """A sentence's draw: a 64-bit hash of (seed, file name, its index among the file's sentences). The `size`
  smallest draws of a corpus are a uniform sample of its sentences, whoever computes them in whatever order."""
  name = posixpath.basename(str(unit).rstrip("/"))
  return int.from_bytes(hashlib.blake2b(f"{seed}\0{name}\0{index}".encode(), digest_size=8).digest(), "little")


def unit_sample(source: corpora.TextSource, position: int, size: int, seed: int) -> list[tuple]:
  """One file's reservoir: its `size` sentences of smallest draw, as (draw, file position, index, sentence)."""
  unit = source.units[position]
  sentences = (s for doc, _, _ in corpora.read_unit(source, unit) for s in doc)
  return heapq.nsmallest(size, ((sentence_key(seed, unit, i), position, i, s) for i, s in enumerate(sentences)))


def in_corpus_order(candidates) -> list[str]:
  """The sampled sentences in the corpus' order (file, then place in it), so the trainers see the same input."""
  return [sentence for _, _, _, sentence in sorted(candidates, key=lambda c: c[1:3])]


def sample_sentences(patterns: str, size: int, seed: int = 0, corpus_format: str = corpora.SENTENCE_PER_LINE,
                     stats: corpora.Stats | None = None) -> list[str]:
  """`size` sentences drawn uniformly from the corpus without replacement (all of them when it has fewer)."""
  source = corpora.TextSource(corpora.list_files(patterns, "--corpus"), corpus_format,
                              corpora.Stats() if stats is None else stats)
  reservoirs = (unit_sample(source, position, size, seed) for position in range(len(source.units)))
  return in_corpus_order(heapq.nsmallest(size, itertools.chain.from_iterable(reservoirs)))


def _nonempty(sentences: Iterator[str], patterns: str, stats: corpora.Stats) -> Iterator[str]:
  """`sentences`, or a DataError before any training when the corpus holds no text at all."""
  first = next(sentences, None)
  if first is None:
    skipped = ", ".join(f"{stats[k]} {k.replace('_', ' ')}" for k in ("skipped_files", "skipped_lines",
                                                                        "overlong_lines") if stats[k])
    raise DataError(f"--corpus {patterns}: no text to learn a vocabulary from "
                    f"({skipped or 'the files are empty'}; binary files and non-UTF-8 lines are skipped)")
  return itertools.chain([first], sentences)


def _count_words(sentences: Iterable[str], lower_case: bool, chunk: int = 20_000) -> collections.Counter:
  """Word counts after BERT's basic tokenization (tensorflow-text's BasicTokenizer), in chunks of sentences."""
  tokenizer = tf_module("tensorflow_text.python.ops.bert_tokenizer").BasicTokenizer(lower_case=lower_case)
  counts: collections.Counter = collections.Counter()
  batch, seen = [], 0
  for sentence in itertools.chain(sentences, [None]):
    if sentence is not None:
      batch.append(sentence)
      if len(batch) < chunk:
        continue
    if batch:
      counts.update(tokenizer.tokenize(tf().constant(batch)).flat_values.numpy().tolist())
      seen += len(batch)
      if seen % 1_000_000 < chunk:
        print(f"vocab: counted the words of {seen:,} sentences", file=sys.stderr, flush=True)
      batch = []
  return collections.Counter({w.decode("utf-8"): c for w, c in counts.items()})


def train_wordpiece(sentences: Iterable[str], size: int, output_dir: str, lower_case: bool = True) -> str:
  """Learns a WordPiece vocab.txt with the learner Google's BERT vocabularies come from (tensorflow-text).

  Deterministic: the same sentences give a byte-identical file in every process and on every machine
  (the `tokenizers` trainer breaks ties through per-process random hash maps, so it is not). At most
  `size` entries; on a small corpus fewer, since pieces must be seen at least once as a word part.
  """
  learner = tf_module("tensorflow_text.tools.wordpiece_vocab.wordpiece_tokenizer_learner_lib")
  counts = _count_words(sentences, lower_case)
  if not counts:
    raise DataError("the corpus has no words to learn a vocabulary from (is it empty, or not text?)")
  pieces = learner.learn(sorted(counts.items()), size, list(SPECIAL_TOKENS), lower_thresh=1)
  if len(pieces) <= len(SPECIAL_TOKENS) + 1:
    raise DataError(f"the corpus yields no vocabulary beyond the special tokens ({sum(counts.values())} words)")
  path = os.path.join(output_dir, "vocab.txt")
  _write(path, "".join(piece + "\n" for piece in pieces).encode("utf-8"))
  return path


def train_sentencepiece(sentences: Iterable[str], size: int, output_dir: str, lower_case: bool = True,
                        model_type: str = "unigram") -> str:
  """Trains a SentencePiece model (unigram or BPE); returns the spm.model path."""
  import sentencepiece as spm  # pylint: disable=import-outside-toplevel
  if model_type not in SENTENCEPIECE_TYPES:
    raise DataError(f"--model-type={model_type!r}; choose one of {SENTENCEPIECE_TYPES}")
  sentences = (albert_preprocess(s, lower_case) for s in sentences)  # as SentencePieceTokenizer.encode sees text
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


def train_fairseq_sentencepiece(sentences: Iterable[str], size: int, output_dir: str, kind: str,
                                model_type: str = "unigram") -> str:
  """A SentencePiece model of `size` pieces trained as CamemBERT's and XLM-R's were (no preprocessing, no
  pad piece: fairseq adds its own symbols in front), written as `sentencepiece.bpe.model` plus the
  tokenizer.json of `kind`'s layout; returns the model's path. The vocabulary has size + 5 (CamemBERT) or
  size + 2 (XLM-R) entries."""
  import sentencepiece as spm  # pylint: disable=import-outside-toplevel
  if model_type not in SENTENCEPIECE_TYPES:
    raise DataError(f"--model-type={model_type!r}; choose one of {SENTENCEPIECE_TYPES}")
  with tempfile.TemporaryDirectory() as tmp:
    prefix = os.path.join(tmp, "spm")
    try:
      spm.SentencePieceTrainer.train(
          sentence_iterator=iter(sentences), model_prefix=prefix, vocab_size=size, model_type=model_type,
          unk_id=0, bos_id=1, eos_id=2, pad_id=-1, character_coverage=0.9995, input_sentence_size=2_000_000,
          shuffle_input_sentence=True, hard_vocab_limit=False, num_threads=os.cpu_count() or 1, minloglevel=2)
    except RuntimeError as e:
      raise DataError(f"SentencePiece training failed: {e}; a larger corpus or a smaller --size helps") from None
    tokenizer = fairseq_spm.FairseqSentencePieceTokenizer(prefix + ".model", kind)
    with open(prefix + ".model", "rb") as f:
      model = f.read()
  path = os.path.join(output_dir, fairseq_spm.HF_MODEL_FILE)
  _write(path, model)
  _write(os.path.join(output_dir, fairseq_spm.HF_TOKENIZER_FILE),
         json.dumps(fairseq_spm.hf_tokenizer_json(tokenizer), ensure_ascii=False).encode("utf-8"))
  return path


def _write(path: str, data: bytes) -> None:
  workdir.write_bytes(workdir.path(path), data)


def train_vocab(corpus: str, kind: str, size: int, output_dir: str, lower_case: bool = True,
                corpus_format: str = corpora.SENTENCE_PER_LINE, model_type: str = "unigram", sample: int = 0,
                seed: int = 0, beam_args: list[str] | None = None) -> str:
  """`bert-jax vocab`: trains a `kind` vocabulary of about `size` entries from text files: all their sentences,
  or `sample` of them drawn uniformly with `seed` (on a Beam runner with `beam_args`)."""
  if kind not in KINDS:
    raise DataError(f"--type={kind!r}; choose one of {KINDS}")
  if size < len(SPECIAL_TOKENS) + 1:
    raise DataError(f"--size={size} is too small; use at least a few hundred")
  if sample < 0 or (beam_args is not None and not sample):
    raise DataError(f"--sample-sentences={sample}; a Beam runner samples the corpus: give how many sentences "
                    "the trainer reads, e.g. --sample-sentences 10000000")
  stats = corpora.Stats()
  if beam_args is not None:
    from bert_jax.data_pipelines import beam_vocab  # pylint: disable=import-outside-toplevel
    drawn = iter(beam_vocab.sample_sentences(corpus, sample, seed, corpus_format, output_dir, beam_args))
  elif sample:
    drawn = iter(sample_sentences(corpus, sample, seed, corpus_format, stats))
  else:
    drawn = corpus_sentences(corpus, corpus_format, stats)
  sentences = _nonempty(drawn, corpus, stats)
  if kind == "wordpiece":
    return train_wordpiece(sentences, size, output_dir, lower_case)
  if kind in fairseq_spm.KINDS:  # cased: CamemBERT and XLM-R keep the text as it is
    return train_fairseq_sentencepiece(sentences, size, output_dir, kind, model_type)
  return train_sentencepiece(sentences, size, output_dir, lower_case, model_type)
