"""The embedded default corpus: English prose every Python install carries, plus a WordPiece vocab built from it.

Text: the docstrings of the standard library (parsed with `ast`, never imported) and the `pydoc`
help topics, keeping prose paragraphs only (no doctest or indented code). Documents are one docstring
or one help topic, shuffled with a fixed seed and written one sentence per line. The vocabulary
(8192 entries, lower-cased) is trained on it; configs with data.tokenizer=sentencepiece and no data.vocab
(RoBERTa's `tiny`) get a SentencePiece BPE model learnt from it on first use, in the same folder, and
CamemBERT's and XLM-R's kinds a unigram one (spm-unigram-fairseq/sentencepiece.bpe.model). All are
cached under
$BERT_JAX_CACHE, else $XDG_CACHE_HOME/bert_jax, else ~/.cache/bert_jax, in a folder keyed by a hash
of the recipe and the source files; each is built aside and renamed into place under a lock, so concurrent
processes never see half a cache and build it once.
"""
from __future__ import annotations

import ast
import fcntl
import functools
import hashlib
import os
import random
import re
import shutil
import sys
import sysconfig
import tempfile
from collections.abc import Sequence

from bert_jax.data_pipelines import corpora, fairseq_spm, t5_spm, vocab

VOCAB_SIZE = 8192
_RECIPE = "embedded-v2"  # v2: the tensorflow-text WordPiece learner (deterministic)
_SKIP_DIRS = ("site-packages", "test", "tests", "idlelib", "turtledemo", "__pycache__")
_PROSE = re.compile(r"[A-Za-z][A-Za-z ,;:'()-]*[.!?]$")


def cache_root() -> str:
  if os.environ.get("BERT_JAX_CACHE"):
    return os.environ["BERT_JAX_CACHE"]
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "bert_jax")


def _stdlib_files() -> list[str]:
  root, files = sysconfig.get_paths()["stdlib"], []
  for directory, subdirs, names in os.walk(root):
    subdirs[:] = sorted(d for d in subdirs if d not in _SKIP_DIRS)
    files.extend(os.path.join(directory, n) for n in sorted(names) if n.endswith(".py"))
  return files


def _cache_key(files: Sequence[str]) -> str:
  h = hashlib.sha256(f"{_RECIPE}|{sys.version}|{VOCAB_SIZE}".encode())
  for path in files:
    h.update(f"{os.path.relpath(path, sysconfig.get_paths()['stdlib'])}:{os.path.getsize(path)}\n".encode())
  return h.hexdigest()[:16]


def _prose_sentences(text: str) -> list[str]:
  """Sentences of the paragraphs that read as prose: unindented, no doctest, ending like a sentence."""
  sentences = []
  for paragraph in re.split(r"\n\s*\n", text):
    lines = paragraph.splitlines()
    if not lines or any(l.startswith((" ", "\t", ">>>")) or "::" in l for l in lines):
      continue
    joined = " ".join(l.strip() for l in lines)
    if len(joined.split()) >= 5 and _PROSE.search(joined):
      sentences.extend(corpora.split_sentences(joined))
  return sentences


def _docstrings(path: str):
  try:
    with open(path, "rb") as f:
      tree = ast.parse(f.read())
  except (SyntaxError, ValueError, OSError):
    return
  for node in ast.walk(tree):
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
      doc = ast.get_docstring(node)
      if doc:
        yield doc


def build_documents(files: Sequence[str]) -> list[list[str]]:
  import pydoc_data.topics  # pylint: disable=import-outside-toplevel
  texts = [doc for path in files for doc in _docstrings(path)]
  texts += [pydoc_data.topics.topics[k] for k in sorted(pydoc_data.topics.topics)]
  documents = [s for s in map(_prose_sentences, texts) if s]
  random.Random(0).shuffle(documents)
  return documents


def _build(directory: str, files: Sequence[str]) -> None:
  print(f"building the embedded corpus from {len(files)} standard-library files (once; cached in "
        f"{cache_root()})", flush=True)
  documents = build_documents(files)
  with open(os.path.join(directory, "corpus.txt"), "w", encoding="utf-8") as f:
    for document in documents:
      f.write("\n".join(document) + "\n\n")
  print(f"learning a WordPiece vocabulary (at most {VOCAB_SIZE:,} entries) from its "
        f"{sum(map(len, documents)):,} sentences", flush=True)
  vocab.train_wordpiece((s for d in documents for s in d), VOCAB_SIZE, directory, lower_case=True)


def default_vocab(data_cfg) -> str:
  """data.vocab, or the embedded corpus's vocabulary of data.tokenizer's kind (and data.lower_case's casing
  for SentencePiece)."""
  if data_cfg.vocab:
    return data_cfg.vocab
  if data_cfg.tokenizer == "sentencepiece":
    return ensure_sentencepiece(data_cfg.lower_case)
  if data_cfg.tokenizer in fairseq_spm.KINDS:
    return ensure_fairseq_sentencepiece()
  if data_cfg.tokenizer == t5_spm.KIND:
    return ensure_t5_sentencepiece()
  return ensure_embedded()[1]


def ensure_sentencepiece(lower_case: bool) -> str:
  """spm-bpe-{cased,uncased}.model: a SentencePiece BPE model (RoBERTa's kind) of at most VOCAB_SIZE pieces
  learnt from the embedded corpus, built on first use (a few seconds) next to it and cached."""
  corpus, _ = ensure_embedded()
  return build_once(
      os.path.join(os.path.dirname(corpus), f"spm-bpe-{'uncased' if lower_case else 'cased'}.model"),
      lambda staging: vocab.train_sentencepiece(_lines(corpus), VOCAB_SIZE, staging, lower_case, "bpe"),
      f"learning a SentencePiece BPE vocabulary (at most {VOCAB_SIZE:,} pieces) from the embedded corpus")


def _lines(corpus: str):
  with open(corpus, encoding="utf-8") as f:
    yield from (line.strip() for line in f if line.strip())


def build_once(final: str, build, message: str = "") -> str:
  """`final` (a file or a folder), built once: `build(staging)` fills a fresh staging folder beside it and returns
  the path to rename to `final` (the staging folder itself when it returns None), after printing `message` and
  where it is cached. Concurrent builders take turns on a lock file beside it, so the second one waits for the
  first's copy instead of building its own (two test workers or two hosts' processes starting together)."""
  if os.path.exists(final):
    return final
  folder = os.path.dirname(final)
  os.makedirs(folder, exist_ok=True)
  with open(os.path.join(folder, f".{os.path.basename(final)}.lock"), "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if os.path.exists(final):
      return final
    if message:
      print(f"{message} (once; cached in {folder})", flush=True)
    staging = tempfile.mkdtemp(prefix=".building-", dir=folder)
    try:
      os.rename(build(staging) or staging, final)
    finally:
      shutil.rmtree(staging, ignore_errors=True)
  return final


@functools.cache
def _stdlib_snapshot() -> tuple[tuple[str, ...], str]:
  """The standard library's files and their cache key, read once per process: walking and sizing its ~650 files
  took 0.1-0.15 s a call (0.27 s on busy cores), and a pretraining run calls ensure_embedded 4 times."""
  files = tuple(_stdlib_files())
  return files, _cache_key(files)


def ensure_embedded() -> tuple[str, str]:
  """(corpus.txt, vocab.txt) of the embedded corpus, built on first use (a few seconds) and cached."""
  files, key = _stdlib_snapshot()
  final = os.path.join(cache_root(), f"embedded-{key}")
  build_once(final, lambda staging: _build(staging, files))
  return os.path.join(final, "corpus.txt"), os.path.join(final, "vocab.txt")


def ensure_fairseq_sentencepiece() -> str:
  """spm-unigram-fairseq/sentencepiece.bpe.model: a cased SentencePiece unigram model of at most VOCAB_SIZE
  pieces trained as CamemBERT's was (vocab.train_fairseq_sentencepiece), from the embedded corpus, built on
  first use next to it and cached; its kind (data.tokenizer) lays it out."""
  corpus, _ = ensure_embedded()
  final = build_once(
      os.path.join(os.path.dirname(corpus), "spm-unigram-fairseq"),
      lambda staging: os.path.dirname(vocab.train_fairseq_sentencepiece(_lines(corpus), VOCAB_SIZE, staging,
                                                                         "camembert_spm")),
      f"learning a SentencePiece unigram vocabulary (at most {VOCAB_SIZE:,} pieces) from the embedded corpus")
  return os.path.join(final, fairseq_spm.HF_MODEL_FILE)


def ensure_t5_sentencepiece() -> str:
  """t5-spiece/spiece.model beside the embedded corpus: T5's SentencePiece layout (t5_spm.train), learnt once (a
  few seconds), then cached."""
  corpus, _ = ensure_embedded()
  final = build_once(
      os.path.join(os.path.dirname(corpus), "t5-spiece"),
      lambda staging: os.path.dirname(t5_spm.train(_lines(corpus), t5_spm.EMBEDDED_SIZE, staging)),
      f"learning T5's SentencePiece vocabulary (at most {t5_spm.EMBEDDED_SIZE:,} pieces) from the embedded corpus")
  return os.path.join(final, t5_spm.HF_MODEL_FILE)
