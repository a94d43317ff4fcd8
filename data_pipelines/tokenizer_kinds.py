"""The registry of tokenizer kinds (data.tokenizer; a family record's `tokenizer`): one `TokenizerKind` per
kind says everything the rest of bert_jax asks about it: how to load it, the files a checkpoint folder
holds it under, transformers' class for it, what a workdir's config.json records of it, HF's word limit and
how `bert-jax vocab extend` grows it. A new kind is one `register(TokenizerKind(...))`; the built-in ones
are registered at the end of tokenizers.py (their classes there and in fairseq_spm.py, hf_tokenizer.py,
t5_spm.py, deberta_spm.py); tests/test_tokenizer_kind.py registers a toy one.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

from bert_jax.data_pipelines.errors import DataError


@dataclasses.dataclass(frozen=True)
class TokenizerKind:
  name: str
  # (path, lower_case, max_chars_per_word, quotes_to_double) -> the tokenizer; None: read from checkpoints only
  load: Callable[[str, bool, int, bool], Any] | None
  files: tuple[str, ...] = ()  # the names a checkpoint folder holds it under (the first: the file copied into one)
  file_names: str = ""  # the files, as a message names them ("" : `files` joined)
  hf_class: str = "PreTrainedTokenizerFast"  # transformers' tokenizer_class for a generic export
  # The tokenizer.json transformers reads beside a SentencePiece model, from (model path, lower_case); None: none
  hf_json: Callable[[str, bool], dict] | None = None
  own_ids: bool = False  # SentencePiece in a family's own id layout: a *.model/*.json file is read as this kind
  cased: bool = False  # its files are a cased vocabulary: a checkpoint's do_lower_case never applies (byte-level BPE)
  saved: Callable[[Any], dict] = lambda tokenizer: {}  # what config.json records of it besides kind and case
  # transformers' class for it keeps words of at most max_input_chars_per_word characters (BertTokenizer's 100):
  # a Hugging Face folder's tokenizer is read with that limit (conversion/hf.py)
  hf_word_limit: bool = False
  # how `bert-jax vocab extend` makes a word one token (conversion/vocab_extend.py: "whole_word", "unigram",
  # "fairseq"); "": it does not extend this kind
  extend: str = ""

  @property
  def described(self) -> str:
    return self.file_names or " + ".join(self.files)


_KINDS: dict[str, TokenizerKind] = {}


def register(kind: TokenizerKind) -> TokenizerKind:
  if kind.name in _KINDS:
    raise ValueError(f"tokenizer kind {kind.name!r} is registered twice")
  _KINDS[kind.name] = kind
  return kind


def unregister(name: str) -> None:
  """Removes a kind (a test's toy kind)."""
  _KINDS.pop(name, None)


def get(name: str) -> TokenizerKind:
  if name not in _KINDS:
    raise DataError(f"tokenizer kind {name!r} is not one of {loadable()}")
  return _KINDS[name]


def names() -> tuple[str, ...]:
  """Every registered kind, in registration order."""
  return tuple(_KINDS)


def loadable() -> tuple[str, ...]:
  """The kinds `load_tokenizer` reads (data.tokenizer's choices)."""
  return tuple(k for k, v in _KINDS.items() if v.load is not None)


def saved_fields(tokenizer: Any) -> dict:
  """What a workdir's config.json `data` section records of a run's tokenizer (its copy's name is the caller's)."""
  return {"tokenizer": tokenizer.kind, "lower_case": tokenizer.lower_case, **get(tokenizer.kind).saved(tokenizer)}
