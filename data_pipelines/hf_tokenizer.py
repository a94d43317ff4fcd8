"""A Hugging Face `tokenizer.json` of any kind, run by Hugging Face's `tokenizers` library (kind tokenizer_json).

Released encoders ship their tokenizer as one `tokenizer.json`: byte-level BPE (ModernBERT, Ettin), Unigram
with Metaspace (XLM-R-like multilingual ones), WordPiece. The file holds the whole pipeline (normalizer,
pre-tokenizer, model, added tokens, post-processor), and transformers' fast tokenizer of a folder whose
tokenizer_config.json names no class that rebuilds it (PreTrainedTokenizerFast, TokenizersBackend) runs it
as written, so `encode(text)` runs it too: the ids of `AutoTokenizer(text, add_special_tokens=False)`, with
the file's truncation and padding off, as transformers turns them off for a call that asks for neither.

The special roles bert_jax's inputs need ([CLS] [SEP] [PAD] [MASK] [UNK]) are read as transformers reads
them, from tokenizer_config.json or special_tokens_map.json beside the file (cls_token, sep_token, ...),
and otherwise from the file itself: the post-processor's template ([CLS] the special token before the
text, [SEP] the one after it), the model's unknown token, the padding's token, then the usual names
([PAD]/<pad>, [MASK]/<mask>, ...), bos and eos standing in for [CLS] and [SEP]. A role the tokenizer
lacks is None, and asking for it (special_ids["[MASK]"]) is a DataError that names it. A pair's rows follow
the file's pair template (`layout`): BERT's [CLS] a [SEP] b [SEP], or RoBERTa's <s> a </s> </s> b </s>.
"""
from __future__ import annotations

import json
import os

import numpy as np
from etils import epath

from bert_jax.data_pipelines.errors import DataError
from bert_jax.data_pipelines.tftools import open_binary
from bert_jax.data_pipelines.tokenizer_base import BERT_LAYOUT, Layout, TokenizerBase

KIND = "tokenizer_json"
FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
_SPECIAL_MAP_FILE = "special_tokens_map.json"
# bert_jax's roles -> transformers' attribute names, and the names a tokenizer usually gives them
_ATTRIBUTES = {"[PAD]": "pad_token", "[UNK]": "unk_token", "[CLS]": "cls_token", "[SEP]": "sep_token",
               "[MASK]": "mask_token"}
_NAMES = {"[PAD]": ("[PAD]", "<pad>", "<|padding|>", "<|pad|>"), "[UNK]": ("[UNK]", "<unk>", "<|unk|>"),
          "[CLS]": ("[CLS]", "<s>", "<cls>", "[BOS]", "<bos>"), "[SEP]": ("[SEP]", "</s>", "<sep>", "[EOS]", "<eos>"),
          "[MASK]": ("[MASK]", "<mask>", "<|mask|>", "[mask]")}
_STAND_IN = {"[CLS]": "bos_token", "[SEP]": "eos_token"}  # a tokenizer without [CLS]/[SEP] of its own
# transformers' tokenizer classes that read a tokenizer.json through another of bert_jax's kinds (they
# rebuild its pipeline their own way: XLM-R's and CamemBERT's white-space split and Metaspace, XLNet's
# normalizer), by tokenizer_config.json's tokenizer_class.
CLASS_KINDS = {"XLMRobertaTokenizer": "xlmr_spm", "CamembertTokenizer": "camembert_spm", "XLNetTokenizer": "xlnet_spm"}


def class_kind(directory) -> str | None:
  """The kind of a folder's tokenizer.json by tokenizer_config.json's tokenizer_class (CLASS_KINDS), else None."""
  path = epath.Path(directory) / CONFIG_FILE
  name = (_read_json(os.fspath(path)) if path.exists() else {}).get("tokenizer_class") or ""
  return CLASS_KINDS.get(str(name).removesuffix("Fast"))


def files_of(path: str) -> dict[str, str]:
  """{name: path} of a tokenizer.json and the tokenizer_config.json beside it, if there is one."""
  config = epath.Path(path).parent / CONFIG_FILE
  return {os.path.basename(path): path, **({CONFIG_FILE: os.fspath(config)} if config.exists() else {})}


def _read_json(path: str) -> dict:
  try:
    with open_binary(path) as f:
      found = json.loads(f.read())
  except (OSError, ValueError) as e:
    raise DataError(f"cannot read {path}: {e}") from None
  return found if isinstance(found, dict) else {}


def _content(token) -> str | None:
  """A tokenizer_config.json token: a string, or an AddedToken's dict."""
  return token.get("content") if isinstance(token, dict) else token


def _template_roles(processor: dict | None) -> dict[str, str]:
  """{"[CLS]": token, "[SEP]": token} of a post-processor: the special tokens before and after the text."""
  if not processor:
    return {}
  kind = processor.get("type")
  if kind == "Sequence":
    return next((r for p in processor.get("processors", []) if (r := _template_roles(p))), {})
  if kind in ("BertProcessing", "RobertaProcessing"):
    return {"[CLS]": processor["cls"][0], "[SEP]": processor["sep"][0]}
  if kind != "TemplateProcessing":
    return {}
  single = processor.get("single") or []
  text = next((i for i, piece in enumerate(single) if "Sequence" in piece), len(single))
  before = [p["SpecialToken"]["id"] for p in single[:text] if "SpecialToken" in p]
  after = [p["SpecialToken"]["id"] for p in single[text + 1:] if "SpecialToken" in p]
  roles = {"[CLS]": before[0]} if before else {}
  if after:
    roles["[SEP]"] = after[0]
  return roles


def _template_layout(processor: dict | None) -> Layout:
  """The rows' Layout by the post-processor's pair template: [CLS] $A, then the [SEP]s between a and b with
  their token types (RoBERTa's </s> </s>), then $B typed as the template types it; BERT's otherwise."""
  kind = (processor or {}).get("type")
  if kind == "Sequence":
    return next((found for p in processor.get("processors", []) if (found := _template_layout(p)) != BERT_LAYOUT),
                BERT_LAYOUT)
  if kind == "RobertaProcessing":
    return Layout(between=(0, 0), b_type=0)
  pair = (processor.get("pair") or []) if kind == "TemplateProcessing" else []
  where = {piece["Sequence"]["id"]: i for i, piece in enumerate(pair) if "Sequence" in piece}
  if set(where) != {"A", "B"} or where["A"] != 1 or where["B"] <= where["A"] + 1 or "SpecialToken" not in pair[0]:
    return BERT_LAYOUT
  between = pair[where["A"] + 1:where["B"]]
  if not all("SpecialToken" in piece for piece in between):
    return BERT_LAYOUT
  return Layout(between=tuple(p["SpecialToken"].get("type_id", 0) for p in between),
                b_type=pair[where["B"]]["Sequence"].get("type_id", 0))


class _Roles(dict):
  """special_ids: a role the tokenizer lacks maps to None, and indexing it is a DataError naming it."""
  path = ""

  def __getitem__(self, role):
    found = super().__getitem__(role)
    if found is None:
      attribute = _ATTRIBUTES.get(role, role)
      raise DataError(f"tokenizer {self.path} has no {role} token ({attribute}); name it in {CONFIG_FILE} "
                      f"beside it (\"{attribute}\": \"...\") or add it to the tokenizer")
    return found


class TokenizerJson(TokenizerBase):
  """A tokenizer.json through the `tokenizers` library: encode(text) -> ids without special tokens."""
  kind = KIND

  def __init__(self, path: str):
    from tokenizers import Tokenizer  # pylint: disable=import-outside-toplevel  (only this kind needs it)
    self.path = path
    spec = _read_json(path)
    try:
      self._tokenizer = Tokenizer.from_str(json.dumps(spec))
    except Exception as e:  # pylint: disable=broad-except  (tokenizers raises a bare Exception)
      raise DataError(f"cannot load tokenizer {path}: {str(e).splitlines()[0]}; pass a Hugging Face "
                      "tokenizer.json") from None
    self._tokenizer.no_truncation()
    self._tokenizer.no_padding()
    beside = self._beside()
    self._add_tokens_named(spec, beside)
    ids = self._tokenizer.get_vocab(with_added_tokens=True)
    self.vocab = [""] * (max(ids.values(), default=-1) + 1)
    for token, i in ids.items():
      self.vocab[i] = token
    self._spec = spec
    self.special_ids = self._roles(spec, ids, beside)
    self._special = {ids[a.content] for a in self._tokenizer.get_added_tokens_decoder().values() if a.special}
    self.lower_case = _lowercases(spec.get("normalizer"))
    self.layout = _template_layout(spec.get("post_processor"))

  def _add_tokens_named(self, spec: dict, beside: dict) -> None:
    """The tokens tokenizer_config.json names (added_tokens_decoder, the special tokens, the extra ones) that the
    file does not hold as added tokens become special added tokens, in transformers' order (its
    TokenizersBackend adds them on load): raw text matches them whole, new ones take the next ids."""
    from tokenizers import AddedToken  # pylint: disable=import-outside-toplevel
    held = {a.get("content") for a in spec.get("added_tokens") or []}
    decoder = beside.get("added_tokens_decoder") or {}
    named = [decoder[k] for k in sorted(decoder, key=lambda k: int(k)) if isinstance(decoder[k], dict)]
    named += [beside[k] for k in ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                                  "mask_token") if beside.get(k)]
    extra = beside.get("extra_special_tokens") or beside.get("additional_special_tokens") or []
    named += extra if isinstance(extra, list) else list(extra.values())
    for token in named:
      token = token if isinstance(token, dict) else {"content": token}
      content = token.get("content")
      if isinstance(content, str) and content not in held:
        held.add(content)
        self._tokenizer.add_tokens([AddedToken(
            content, single_word=token.get("single_word", False), lstrip=token.get("lstrip", False),
            rstrip=token.get("rstrip", False), normalized=token.get("normalized", False), special=True)])

  def _roles(self, spec: dict, ids: dict[str, int], beside: dict) -> _Roles:
    model = spec.get("model") or {}
    found = dict(_template_roles(spec.get("post_processor")))
    unk = model.get("unk_token")
    if unk is None and model.get("unk_id") is not None and model.get("vocab"):
      unk = model["vocab"][model["unk_id"]][0]
    found.setdefault("[UNK]", unk)
    found.setdefault("[PAD]", (spec.get("padding") or {}).get("pad_token"))
    for role, attribute in _ATTRIBUTES.items():
      named = _content(beside.get(attribute)) or _content(beside.get(_STAND_IN.get(role)))
      if named in ids:
        found[role] = named
    roles = _Roles()
    roles.path = self.path
    for role, names in _NAMES.items():
      token = found.get(role) if found.get(role) in ids else next((n for n in names if n in ids), None)
      roles[role] = ids.get(token)
    return roles

  def _beside(self) -> dict:
    """tokenizer_config.json over special_tokens_map.json, where they sit beside the file."""
    merged = {}
    for name in (_SPECIAL_MAP_FILE, CONFIG_FILE):
      path = epath.Path(self.path).parent / name
      if path.exists():
        merged.update(_read_json(os.fspath(path)))
    return merged

  def transformers_settings(self) -> dict[str, str]:
    """tokenizer_config.json's special tokens (cls_token, ...) for the roles the tokenizer has."""
    return {attribute: self.vocab[i] for role, attribute in _ATTRIBUTES.items()
            if (i := self.special_ids.get(role)) is not None}

  @property
  def files(self) -> dict[str, str]:
    """{file name: path}: what a checkpoint must carry to rebuild this tokenizer (a HF export names it FILE):
    the file, and the tokenizer_config.json beside it that names its roles and extra tokens."""
    return files_of(self.path)

  def to_json(self) -> str:
    """The tokenizer.json transformers reads as this tokenizer (the tokens named beside the file added)."""
    return self._tokenizer.to_str()

  def encode(self, text: str) -> list[int]:
    """Token ids without special tokens (transformers' add_special_tokens=False)."""
    return self._tokenizer.encode(text, add_special_tokens=False).ids

  def decode(self, ids) -> str:
    return self._tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)

  def special_mask(self) -> np.ndarray:
    """bool[vocab]: the special roles and the file's other special added tokens."""
    mask = np.zeros(self.vocab_size, bool)
    mask[[i for i in (*self.special_ids.values(), *self._special) if i is not None]] = True
    return mask

  def continuation_mask(self) -> np.ndarray:
    """bool[vocab]: pieces that continue the previous word: WordPiece's `##x`, and for the others a piece
    without the word-start mark (Metaspace's `▁`, byte-level BPE's `Ġ` for a space)."""
    model, pre = self._spec.get("model") or {}, json.dumps(self._spec.get("pre_tokenizer") or {})
    if model.get("type") == "WordPiece":
      prefix = model.get("continuing_subword_prefix") or "##"
      joins = [t.startswith(prefix) for t in self.vocab]
    elif model.get("type") == "BPE" and model.get("continuing_subword_prefix"):
      joins = [t.startswith(model["continuing_subword_prefix"]) for t in self.vocab]
    else:
      mark = "\u0120" if '"ByteLevel"' in pre else "\u2581"
      joins = [not t.startswith(mark) for t in self.vocab]
    return np.array(joins, bool) & ~self.special_mask()

  def tokenize_tf(self, strings):
    raise DataError(f"the {KIND} tokenizer has no TF path; it tokenizes in Python (finetune, data prepare, "
                    "pretraining's Python pipeline)")


def _lowercases(normalizer: dict | None) -> bool:
  """Whether the file's normalizer lower-cases (informational: the file decides, whatever a config says)."""
  if not normalizer:
    return False
  if normalizer.get("type") == "Sequence":
    return any(_lowercases(n) for n in normalizer.get("normalizers", []))
  return normalizer.get("type") == "Lowercase" or (normalizer.get("type") == "BertNormalizer"
                                                     and normalizer.get("lowercase", True))
