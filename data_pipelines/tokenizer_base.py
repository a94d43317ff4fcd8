"""The surface every tokenizer kind shares (data_pipelines/tokenizers.py, fairseq_spm.py, hf_tokenizer.py):
the vocabulary list, special ids, id lookups and the mask of ids never masked; the input `Layout` a kind's
rows follow."""
from __future__ import annotations

import dataclasses
import os

import numpy as np


@dataclasses.dataclass(frozen=True)
class Layout:
  """Where a model's inputs put the special tokens and the padding (finetune/features.py builds rows by it).

  cls_first: [CLS] a [SEP] (b [SEP]) (BERT); otherwise a [SEP] (b [SEP]) [CLS] (XLNet's a <sep> b <sep> <cls>).
  Token types 0 for a and its [SEP] (and the padding), 1 for b and its [SEP], cls_type for [CLS]; the
  padding is on the left with pad_left. SQuAD's rows put the question first with cls_first, the context
  first otherwise (transformers' SQuAD features for a tokenizer that pads on the left). A pair's a and b are
  parted by len(between) [SEP]s of those token types (RoBERTa's template: a </s> </s> b, types all 0,
  between=(0, 0), b_type=0), b and its [SEP] typed b_type.
  """
  cls_first: bool = True
  pad_left: bool = False
  cls_type: int = 0
  between: tuple[int, ...] = (0,)
  b_type: int = 1

  @property
  def pair_specials(self) -> int:
    """How many special tokens a pair's row adds."""
    return len(self.between) + 2

  def wrap(self, cls: int, sep: int, a: list[int], b: list[int] | None = None) -> tuple[list[int], list[int]]:
    """(ids, token types) of a (and b) with the special tokens."""
    ids, types = [*a, sep], [0] * len(a) + [self.between[0]]
    if b is not None:
      extra = list(self.between[1:])
      ids, types = ids + [sep] * len(extra) + [*b, sep], types + extra + [self.b_type] * (len(b) + 1)
    if self.cls_first:
      return [cls, *ids], [0, *types]
    return [*ids, cls], [*types, self.cls_type]

  @property
  def before_a(self) -> int:
    """How many special tokens precede a's first."""
    return int(self.cls_first)


BERT_LAYOUT = Layout()
# transformers' XLNetTokenizer (5.x pads with token type 0; its slow tokenizer's 3 reaches nothing: pads are masked)
XLNET_LAYOUT = Layout(cls_first=False, pad_left=True, cls_type=2)


def layout_of(tokenizer) -> Layout:
  """The tokenizer kind's input layout (BERT's unless the kind says otherwise)."""
  return getattr(tokenizer, "layout", BERT_LAYOUT)


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
