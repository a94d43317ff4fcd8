"""What every reader returns and every writer takes: a family, its config, params and the tokenizer."""
from __future__ import annotations

import dataclasses
import os

from etils import epath

# tokenizers registers the built-in kinds that tokenizer_kinds is asked about here
from bert_jax.data_pipelines import fairseq_spm, hf_tokenizer, tokenizer_kinds, tokenizers  # noqa: F401
from bert_jax.models import families
from bert_jax.models.pooling import Pooling

# CamemBERT's and XLM-R's SentencePiece in fairseq's layout (data_pipelines/fairseq_spm.py): one file, the
# first of these a folder holds (tokenizer.json is what transformers reads when both are there). Only a
# family whose tokenizer is of such a kind looks for them (a BERT folder has a tokenizer.json too).
FAIRSEQ_FILES = (fairseq_spm.HF_TOKENIZER_FILE, fairseq_spm.HF_MODEL_FILE)
TOKENIZER_JSON = hf_tokenizer.KIND  # a Hugging Face tokenizer.json of any kind, read by the `tokenizers` library


def tokenizer_files() -> dict[str, tuple[str, ...]]:
  """{kind: the files a checkpoint folder holds it under}, for the kinds found by their files' names
  (data_pipelines/tokenizer_kinds.py)."""
  return {k: tokenizer_kinds.get(k).files for k in tokenizer_kinds.names() if tokenizer_kinds.get(k).files}


def tokenizer_file_names(kind: str | None = None) -> str:
  """The tokenizer files bert_jax reads for `kind` (a family's tokenizer kind), or for every kind (None)."""
  if kind in tokenizer_kinds.names():
    return tokenizer_kinds.get(kind).described
  return ", ".join(dict.fromkeys(tokenizer_kinds.get(k).described for k in tokenizer_kinds.names()))


@dataclasses.dataclass(frozen=True)
class Tokenizer:
  """kind: wordpiece | sentencepiece | bpe | xlnet_spm | camembert_spm | xlmr_spm | tokenizer_json;
  files: {name in a converted dir: source path};
  max_chars_per_word: WordPiece's longest word ([UNK] beyond): None is Google's 200, a Hugging Face
  tokenizer's is its own (100 unless its tokenizer.json says otherwise)."""
  kind: str
  lower_case: bool
  files: dict[str, str]
  max_chars_per_word: int | None = None


@dataclasses.dataclass(frozen=True)
class TaskHead:
  """A fine-tuning head (bert_jax/models/head_kinds.py, params["head"]) as the run recorded it.

  kind: classification | regression | token | span; labels: class names by id; pooling: pooled | layer_mix;
  max_seq_length: the input length it was fine-tuned at (0: unknown).
  """
  kind: str
  labels: tuple[str, ...]
  pooling: str = "pooled"
  max_seq_length: int = 0


@dataclasses.dataclass
class Converted:
  """A checkpoint read: its family (the record's name), config (the family's config object), params,
  tokenizer, the pretraining heads it lacks, notes for the user, and its fine-tuning head if any; pooling:
  how a sentence embedding model (a converted sentence-transformers folder) pools its token vectors,
  None for other models."""
  family: str
  config: families.Config
  params: dict
  tokenizer: Tokenizer | None
  missing_heads: tuple[str, ...] = ()
  notes: list[str] = dataclasses.field(default_factory=list)
  task_head: TaskHead | None = None
  pooling: Pooling | None = None

  @property
  def record(self) -> families.Family:
    return families.get(self.family)


def tokenizer_from_files(directory: str, lower_case: bool, preferred: str = "wordpiece") -> Tokenizer | None:
  """The tokenizer files that sit in a foreign checkpoint directory, if any: the `preferred` kind's own files
  first; then tokenizer.json, which transformers reads when it is there (XLNet's alone in transformers 5,
  ModernBERT's of any kind alone in its releases), as its tokenizer class reads it; then other kinds' files."""
  directory = epath.Path(directory)
  if preferred in fairseq_spm.KINDS:
    found = next((directory / n for n in FAIRSEQ_FILES if (directory / n).exists()), None)
    return Tokenizer(preferred, False, {found.name: os.fspath(found)}) if found else None
  files = tokenizer_files()
  # A kind with its own id layout (DeBERTa's spm.model, XLNet's, T5's) is read so only for its own family.
  kinds = [k for k in sorted(files, key=lambda k: k != preferred) if all((directory / n).exists() for n in files[k])
           and (k == preferred or not tokenizer_kinds.get(k).own_ids)]
  fast = directory / hf_tokenizer.FILE
  if fast.exists() and preferred not in kinds[:1]:
    kind = hf_tokenizer.class_kind(directory) or ("xlnet_spm" if preferred == "xlnet_spm" else hf_tokenizer.KIND)
    files = hf_tokenizer.files_of(os.fspath(fast)) if kind == hf_tokenizer.KIND else {fast.name: os.fspath(fast)}
    return Tokenizer(kind, lower_case and kind == "xlnet_spm", files)
  if kinds:
    return Tokenizer(kinds[0], lower_case and not tokenizer_kinds.get(kinds[0]).cased,
                     {n: os.fspath(directory / n) for n in files[kinds[0]]})
  models = sorted(p for p in directory.iterdir() if p.name.endswith(".model"))
  if models:  # any *.model: the kind a file of that name is read as
    kind = tokenizer_kinds.get(tokenizers.kind_of_file(models[0].name))
    return Tokenizer(kind.name, lower_case, {kind.files[0]: os.fspath(models[0])})
  return None
