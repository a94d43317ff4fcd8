"""What every reader returns and every writer takes: a family, a ModelConfig, params and the tokenizer."""
from __future__ import annotations

import dataclasses
import os

from etils import epath

from bert_jax.conversion import params as params_lib
from bert_jax.conversion.layout import HEADS
from bert_jax.errors import UserError
from bert_jax.models.config import ModelConfig

# The heads each family is pretrained with; ELECTRA's generator is the one with an MLM head.
PRETRAINING_HEADS = {"bert": ("pooler", "mlm", "sentence"), "roberta": ("mlm",),
                     "albert": ("pooler", "mlm", "sentence"), "electra": ("rtd",),
                     "electra_generator": ("mlm",)}
SENTENCE_HEAD = {"bert": "nsp", "albert": "sop"}
TOKENIZER_FILES = {"wordpiece": ("vocab.txt",), "sentencepiece": ("spiece.model",),
                   "bpe": ("vocab.json", "merges.txt")}


@dataclasses.dataclass(frozen=True)
class Tokenizer:
  """kind: wordpiece | sentencepiece | bpe; files: {name in a converted dir: source path};
  max_chars_per_word: WordPiece's longest word ([UNK] beyond): None is Google's 200, a Hugging Face
  tokenizer's is its own (100 unless its tokenizer.json says otherwise)."""
  kind: str
  lower_case: bool
  files: dict[str, str]
  max_chars_per_word: int | None = None


@dataclasses.dataclass(frozen=True)
class TaskHead:
  """A fine-tuning head (bert_jax/finetune/heads.py, params["head"]) as the run recorded it.

  kind: classification | regression | token | span; labels: class names by id; pooling: pooled | layer_mix;
  max_seq_length: the input length it was fine-tuned at (0: unknown).
  """
  kind: str
  labels: tuple[str, ...]
  pooling: str = "pooled"
  max_seq_length: int = 0


@dataclasses.dataclass
class Converted:
  family: str
  config: ModelConfig
  params: dict
  tokenizer: Tokenizer | None
  missing_heads: tuple[str, ...] = ()
  notes: list[str] = dataclasses.field(default_factory=list)
  task_head: TaskHead | None = None


def present_heads(config: ModelConfig) -> tuple[str, ...]:
  return tuple(h for h in HEADS if params_lib.head_enabled(config, h))


def with_heads(config: ModelConfig, family: str, heads) -> ModelConfig:
  """`config` with exactly `heads` switched on (a sentence head brings the pooler it reads)."""
  sentence = "sentence" in heads and family in SENTENCE_HEAD
  return config.replace(use_pooler="pooler" in heads or sentence, mlm_head="mlm" in heads,
                        sentence_head=SENTENCE_HEAD[family] if sentence else "none", rtd_head="rtd" in heads)


def expected_heads(family: str, present) -> tuple[str, ...]:
  key = "electra_generator" if family == "electra" and "mlm" in present else family
  return PRETRAINING_HEADS[key]


def infer_family(config: ModelConfig) -> str:
  """The foreign family a bert_jax model exports as (its config says which architecture it is)."""
  if config.share_layers == "all":
    return "albert"
  if config.position_style == "roberta":
    return "roberta"
  if config.rtd_head or config.embed_dim != config.hidden_size:
    return "electra"
  return "bert"


def tokenizer_from_files(directory: str, lower_case: bool) -> Tokenizer | None:
  """The tokenizer files that sit in a foreign checkpoint directory, if any."""
  directory = epath.Path(directory)
  for kind, names in TOKENIZER_FILES.items():
    if all((directory / n).exists() for n in names):
      return Tokenizer(kind, lower_case and kind != "bpe", {n: os.fspath(directory / n) for n in names})
  models = sorted(p for p in directory.iterdir() if p.name.endswith(".model"))
  if models:
    return Tokenizer("sentencepiece", lower_case, {"spiece.model": os.fspath(models[0])})
  return None


_ACTS_TO_OURS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                 "gelu_fast": "gelu_tanh", "relu": "relu"}


def hidden_act(name: str, source: str) -> str:
  if name not in _ACTS_TO_OURS:
    raise UserError(f"{source}: hidden_act={name!r} is not supported; known: {sorted(_ACTS_TO_OURS)}")
  return _ACTS_TO_OURS[name]
