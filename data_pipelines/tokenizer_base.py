"""The surface every tokenizer kind shares (data_pipelines/tokenizers.py, fairseq_spm.py, hf_tokenizer.py):
the vocabulary list, special ids, id lookups and the mask of ids never masked."""
from __future__ import annotations

import os

import numpy as np


class TokenizerBase:
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
