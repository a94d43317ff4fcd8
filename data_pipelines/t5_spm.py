"""T5's vocabulary (tokenizer kind `t5_spm`): a SentencePiece model (pad 0, </s> 1, <unk> 2) plus 100 sentinel
ids `<extra_id_N>` above it, counting down from the top: <extra_id_0> is the last id (T5's and transformers'
T5Tokenizer's layout; seqio's SentencePieceVocabulary(extra_ids=100)).

`encode` is the model's own (its normaliser included, no lower-casing), with `<extra_id_N>` written in the text
read as its sentinel id; no </s> is added (the example builders add it). The embedded corpus gets its own model
of this layout (`embedded.ensure_t5_sentencepiece`), learnt once and cached beside the corpus.
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile

import numpy as np

from bert_jax.data_pipelines.errors import DataError
from bert_jax.data_pipelines.tftools import open_binary
from bert_jax.data_pipelines.tokenizer_base import TokenizerBase

KIND = "t5_spm"
EXTRA_IDS = 100
HF_MODEL_FILE = "spiece.model"  # what a Hugging Face T5 folder calls it
_SENTINEL = re.compile(r"<extra_id_(\d+)>")
EMBEDDED_SIZE = 4000


class T5Tokenizer(TokenizerBase):
  """A SentencePiece model with T5's 100 sentinels; `sentinel(n)` is <extra_id_n>'s id."""
  kind = KIND

  def __init__(self, path: str, extra_ids: int = EXTRA_IDS):
    import sentencepiece as spm  # pylint: disable=import-outside-toplevel
    self.path, self.lower_case = path, False
    try:
      with open_binary(path) as f:
        self._proto = f.read()
      self._sp = spm.SentencePieceProcessor(model_proto=self._proto)
    except (OSError, RuntimeError) as e:
      raise DataError(f"cannot load SentencePiece model {path}: {e}; T5's vocabulary is a spiece.model") from None
    size = self._sp.get_piece_size()
    self.pieces = size
    self.extra_ids = extra_ids
    self.vocab = [self._sp.id_to_piece(i) for i in range(size)] + [
        f"<extra_id_{extra_ids - 1 - i}>" for i in range(extra_ids)]
    self.pad_id = max(self._sp.pad_id(), 0)
    self.eos_id = self._sp.eos_id()
    if self.eos_id < 0:
      raise DataError(f"{path}: the SentencePiece model has no </s> (eos) piece, which T5's rows end with; train it "
                      "with eos_id=1 (T5's layout: pad 0, </s> 1, <unk> 2)")
    # Roles that shared code reads by BERT's names: T5 has no [CLS] or [MASK]; </s> ends a sequence.
    self.special_ids = {"[PAD]": self.pad_id, "[UNK]": self._sp.unk_id(), "[CLS]": self.eos_id,
                        "[SEP]": self.eos_id, "[MASK]": self.sentinel(0)}

  def sentinel(self, n: int) -> int:
    """<extra_id_n>'s id: the top id for n = 0, counting down."""
    if not 0 <= n < self.extra_ids:
      raise DataError(f"<extra_id_{n}>: T5's vocabulary has sentinels 0..{self.extra_ids - 1}")
    return len(self.vocab) - 1 - n

  def encode(self, text: str) -> list[int]:
    ids, start = [], 0
    for m in _SENTINEL.finditer(text):
      ids += self._sp.encode(text[start:m.start()])
      ids.append(self.sentinel(int(m.group(1))))
      start = m.end()
    return ids + self._sp.encode(text[start:])

  def decode(self, ids) -> str:
    """The text of `ids`, sentinels written as <extra_id_N>, padding and </s> left out, and ids past the vocabulary
    (a model's vocabulary is padded to a multiple of 128: an untrained one generates them) too."""
    out, run = [], []
    for i in (int(i) for i in ids):
      if i >= len(self.vocab):
        continue
      if i >= self.pieces:
        out += [self._sp.decode(run), self.vocab[i]]
        run = []
      elif i not in (self.pad_id, self.eos_id):
        run.append(i)
    out.append(self._sp.decode(run))
    return " ".join(s for s in out if s)

  def special_mask(self) -> np.ndarray:
    mask = np.zeros(self.vocab_size, bool)
    mask[[self.pad_id, self.eos_id, self._sp.unk_id()]] = True
    mask[self.pieces:] = True
    return mask

  def continuation_mask(self) -> np.ndarray:
    return np.array([not t.startswith("\u2581") for t in self.vocab], bool) & ~self.special_mask()


def train(sentences, size: int, output_dir: str) -> str:
  """A T5-layout SentencePiece unigram model (pad 0, </s> 1, <unk> 2) of at most `size` pieces from `sentences`,
  written as output_dir/spiece.model; returns its path."""
  import sentencepiece as spm  # pylint: disable=import-outside-toplevel
  with tempfile.TemporaryDirectory() as tmp:
    prefix = os.path.join(tmp, "spiece")
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_prefix=prefix, vocab_size=size, model_type="unigram",
        pad_id=0, eos_id=1, unk_id=2, bos_id=-1, character_coverage=1.0, hard_vocab_limit=False,
        num_threads=1, minloglevel=2)
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, HF_MODEL_FILE)
    shutil.copyfile(prefix + ".model", path)
  return path
