"""DeBERTa-v2/v3's tokenizer: the release's `spm.model`, as transformers' DebertaV2Tokenizer runs it (kind deberta_spm).

The SentencePiece model's own ids are the model's ids ([PAD] 0, [CLS] 1, [SEP] 2, [UNK] 3 in microsoft's
releases); a special token the model lacks ([MASK] in v3: 128000) takes the next id, as transformers adds it.
transformers 5 does not run the model's own normalizer: DebertaV2Tokenizer rebuilds the pipeline in the
`tokenizers` library from the model's pieces and scores, and so does this, step for step: runs of white space and
tab/newline to one space, NFC, right strip (lower-casing first with do_lower_case), punctuation isolated with
split_by_punct, Metaspace with a `▁` before every word, each word's best Unigram segmentation without byte
fallback. The model's control and user-defined pieces and the special tokens match whole in raw text (added
tokens). do_lower_case and split_by_punct are read from tokenizer_config.json beside the model (False, as v3's).
"""
from __future__ import annotations

import json
import os

import numpy as np
from etils import epath

from bert_jax.data_pipelines import fairseq_spm
from bert_jax.data_pipelines.errors import DataError
from bert_jax.data_pipelines.tftools import open_binary
from bert_jax.data_pipelines.tokenizer_base import TokenizerBase

KIND = "deberta_spm"
FILE = "spm.model"
_META = "\u2581"
_UNKNOWN, _CONTROL, _USER = 2, 3, 4
# bert_jax's roles, in the order transformers adds the special tokens it names (tokenizer_config.json may rename them)
_ROLES = {"[CLS]": "cls_token", "[SEP]": "sep_token", "[UNK]": "unk_token", "[PAD]": "pad_token",
          "[MASK]": "mask_token"}


def _settings(path: str) -> dict:
  config = epath.Path(path).parent / "tokenizer_config.json"
  if not config.exists():
    return {}
  try:
    found = json.loads(config.read_text())
  except ValueError as e:
    raise DataError(f"cannot read {config}: {e}") from None
  return found if isinstance(found, dict) else {}


def _token(value, default: str) -> str:
  return (value.get("content") if isinstance(value, dict) else value) or default


def build(pieces: list[tuple[str, float, int]], lower_case: bool, split_by_punct: bool, roles: dict[str, str]):
  """The `tokenizers` pipeline transformers' DebertaV2Tokenizer builds over these pieces (module docstring)."""
  from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers  # pylint: disable=import-outside-toplevel
  from tokenizers.models import Unigram  # pylint: disable=import-outside-toplevel
  unk_id = next((i for i, (_, _, kind) in enumerate(pieces) if kind == _UNKNOWN), 0)
  tokenizer = Tokenizer(Unigram([(p, s) for p, s, _ in pieces], unk_id=unk_id, byte_fallback=False))
  steps = [normalizers.Lowercase()] if lower_case else []
  tokenizer.normalizer = normalizers.Sequence(
      steps + [normalizers.Replace(Regex(r"\s{2,}|[\n\r\t]"), " "), normalizers.NFC(),
               normalizers.Strip(left=False, right=True)])
  splits = [pre_tokenizers.Punctuation(behavior="isolated")] if split_by_punct else []
  tokenizer.pre_tokenizer = pre_tokenizers.Sequence(splits + [pre_tokenizers.Metaspace(_META, prepend_scheme="always")])
  tokenizer.decoder = decoders.Metaspace(_META, prepend_scheme="always")
  added = [AddedToken(p, normalized=False, special=kind == _CONTROL) for p, _, kind in pieces
           if kind in (_CONTROL, _USER)]
  tokenizer.add_tokens(added)
  tokenizer.add_special_tokens([AddedToken(token, normalized=False, special=True) for token in roles.values()])
  return tokenizer


class DebertaTokenizer(TokenizerBase):
  """DeBERTa-v2/v3's spm.model: encode(text) -> ids without [CLS]/[SEP], transformers' DebertaV2Tokenizer's."""
  kind = KIND

  def __init__(self, path: str, lower_case: bool | None = None):
    self.path = path
    settings = _settings(path)
    self.lower_case = bool(settings.get("do_lower_case", False)) if lower_case is None else lower_case
    try:
      with open_binary(path) as f:
        pieces, _, _ = fairseq_spm.read_model(f.read())
    except (OSError, ValueError, IndexError, UnicodeDecodeError) as e:
      raise DataError(f"cannot load {KIND} tokenizer {path}: {e}; pass DeBERTa's {FILE}") from None
    if not pieces:
      raise DataError(f"{path}: no SentencePiece pieces; pass DeBERTa's {FILE}")
    roles = {role: _token(settings.get(name), role) for role, name in _ROLES.items()}
    self._tokenizer = build(pieces, self.lower_case, bool(settings.get("split_by_punct", False)), roles)
    ids = self._tokenizer.get_vocab(with_added_tokens=True)
    self.vocab = [""] * (max(ids.values()) + 1)
    for token, i in ids.items():
      self.vocab[i] = token
    self.special_ids = {role: ids[token] for role, token in roles.items()}
    self._special = np.zeros(len(self.vocab), bool)
    self._special[[i for i, (_, _, kind) in enumerate(pieces) if kind in (_CONTROL, _UNKNOWN)]] = True
    self._special[list(self.special_ids.values())] = True

  @property
  def files(self) -> dict[str, str]:
    """The model, under the name Hugging Face folders give it, and the tokenizer_config.json beside it."""
    config = epath.Path(self.path).parent / "tokenizer_config.json"
    return {FILE: self.path, **({config.name: os.fspath(config)} if config.exists() else {})}

  def to_json(self) -> str:
    """The tokenizer.json transformers' DebertaV2Tokenizer would save for this model."""
    return self._tokenizer.to_str()

  def encode(self, text: str) -> list[int]:
    """Token ids without [CLS]/[SEP] (transformers' add_special_tokens=False)."""
    return self._tokenizer.encode(text, add_special_tokens=False).ids

  def decode(self, ids) -> str:
    return self._tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)

  def special_mask(self) -> np.ndarray:
    """bool[vocab]: the special roles and the model's control pieces, never masked nor drawn as replacements."""
    return self._special.copy()

  def continuation_mask(self) -> np.ndarray:
    """bool[vocab]: pieces without the word-start mark continue the previous word (whole-word masking)."""
    return np.array([not t.startswith(_META) for t in self.vocab], bool) & ~self._special

  def tokenize_tf(self, strings):
    raise DataError(f"the {KIND} tokenizer has no TF path; it tokenizes in Python (finetune, data prepare)")
