"""This project's checkpoints (params checkpoints, workdirs, step dirs) as a conversion source and target."""
from __future__ import annotations

from bert_jax import params_checkpoint, workdir
from bert_jax.conversion import common
from bert_jax.conversion import params as params_lib
from bert_jax.data_pipelines import hf_tokenizer, tokenizer_kinds, tokenizers
from bert_jax.errors import UserError
from bert_jax.models import families
from bert_jax.models.pooling import Pooling

SENTENCE_EMBEDDING = "sentence_embedding"  # config.json's record of a sentence embedding model's pooling


def is_native(path: str) -> bool:
  location = workdir.path(path)
  return any((location / d).is_dir() for d in (workdir.PARAMS, workdir.CHECKPOINTS, workdir.PAUSED))


def tokenizer(path: str) -> common.Tokenizer | None:
  """The tokenizer a bert_jax checkpoint names in config.json's data section (copied beside it)."""
  config = workdir.read_config(path)
  data = config.get("data", {})
  located = workdir.vocab_file(path, config)
  if located is None:
    return None
  kind = data.get("tokenizer") or tokenizers.kind_of_file(located.name)
  spec = tokenizer_kinds.get(kind)
  if kind == common.TOKENIZER_JSON:  # and the tokenizer_config.json copied beside it, if any
    files = hf_tokenizer.files_of(str(located))
  elif spec.own_ids:  # a SentencePiece model or tokenizer.json, under its own name
    files = {located.name: str(located)}
  else:  # its first file, and the others it reads beside it (BPE's merges.txt)
    files = {spec.files[0]: str(located), **{name: str(located.parent / name) for name in spec.files[1:]}}
  return common.Tokenizer(kind, data.get("lower_case", True), files, data.get("max_chars_per_word"))


def read(path: str, scan_layers: bool | None = None, task: str | None = None) -> common.Converted:
  """task: which head of a multi-task checkpoint (params_checkpoint.one_task); it must name one there."""
  params, saved = params_checkpoint.one_task(*params_checkpoint.load_params(path), task, path)
  config = families.model_config(saved["model"])
  params = families.of(config).from_pretraining(params)
  if scan_layers is not None:
    params = params_lib.relayout(params, config, scan_layers)
    config = config.replace(scan_layers=scan_layers)
  pooling = Pooling.from_dict(saved[SENTENCE_EMBEDDING], path) if SENTENCE_EMBEDDING in saved else None
  return common.Converted(config.family, config, params, tokenizer(path),
                          task_head=_task_head(saved, params, path), pooling=pooling)


def _task_head(saved: dict, params: dict, path: str) -> common.TaskHead | None:
  """The fine-tuning head a `bert-jax finetune` workdir recorded in config.json, if it has one."""
  if "head" not in params:
    return None
  task = saved.get("task") or {}
  if "head" not in task:
    raise UserError(f"{path}: has fine-tuning head weights, but config.json does not record the head's kind "
                    "(task.head); it comes from an older bert-jax: fine-tune again to export it")
  return common.TaskHead(task["head"], tuple(task.get("labels") or ()), saved.get("head", {}).get("pooling", "pooled"),
                         int(saved.get("data", {}).get("max_seq_length", 0)))


def write(directory: str, converted: common.Converted) -> None:
  """A params checkpoint that `--config.init_from` and `load_pretrained` accept."""
  tok = converted.tokenizer
  data = {"vocab": next(iter(tok.files)), "tokenizer": tok.kind, "lower_case": tok.lower_case} if tok else {}
  if tok and tok.max_chars_per_word:  # travels with the checkpoint (a Hugging Face tokenizer's 100)
    data["max_chars_per_word"] = tok.max_chars_per_word
  config = {"objective": "bert", "model": converted.config.to_dict(), "data": data,
            "heads": list(converted.record.heads_of(converted.config))}
  if converted.pooling is not None:
    config[SENTENCE_EMBEDDING] = converted.pooling.to_dict()
  head = converted.task_head
  if head is not None:  # a fine-tuned HF model read with its head (XLNetForQuestionAnswering): --to hf writes it back
    config["task"] = {"head": head.kind, "labels": list(head.labels)}
    config["head"] = {"pooling": head.pooling}
    if head.max_seq_length:
      data["max_seq_length"] = head.max_seq_length
  params_checkpoint.save_params(directory, converted.params, config, tok.files if tok else None)

