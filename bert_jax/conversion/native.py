"""This project's checkpoints (params checkpoints, workdirs, step dirs) as a conversion source and target."""
from __future__ import annotations

import json
import os

from bert_jax.conversion import common
from bert_jax.conversion import params as params_lib
from bert_jax.errors import UserError
from bert_jax.models.config import ModelConfig


def is_native(path: str) -> bool:
  return any(os.path.isdir(os.path.join(path, d)) for d in ("params", "checkpoints", "state"))


def _config_path(path: str) -> str:
  """config.json of a params checkpoint or workdir, or of the workdir above a step directory."""
  for candidate in (os.path.join(path, "config.json"), os.path.join(path, os.pardir, os.pardir, "config.json")):
    if os.path.exists(candidate):
      return os.path.abspath(candidate)
  raise UserError(f"{path}: no config.json found; expected a bert_jax workdir or params checkpoint")


def tokenizer(path: str) -> common.Tokenizer | None:
  """The tokenizer a bert_jax checkpoint names in config.json's data section (copied beside it)."""
  config_path = _config_path(path)
  with open(config_path) as f:
    data = json.load(f).get("data", {})
  vocab = data.get("vocab", "")
  if not vocab:
    return None
  located = os.path.join(os.path.dirname(config_path), os.path.basename(vocab))
  located = located if os.path.exists(located) else vocab
  if not os.path.exists(located):
    raise UserError(f"{path}: config.json names vocabulary {vocab!r}, which is neither beside it nor at that path")
  kind = data.get("tokenizer") or ("sentencepiece" if located.endswith(".model") else "wordpiece")
  if kind == "bpe":
    files = {"vocab.json": located, "merges.txt": os.path.join(os.path.dirname(located), "merges.txt")}
  else:
    files = {common.TOKENIZER_FILES[kind][0]: located}
  return common.Tokenizer(kind, data.get("lower_case", True), files)


def read(path: str, scan_layers: bool | None = None) -> common.Converted:
  from bert_jax.training.checkpoint import load_params  # pylint: disable=import-outside-toplevel
  params, saved = load_params(path)
  config = ModelConfig.from_dict(saved["model"])
  if scan_layers is not None:
    params = params_lib.relayout(params, config, scan_layers)
    config = config.replace(scan_layers=scan_layers)
  return common.Converted(common.infer_family(config), config, params, tokenizer(path))


def write(directory: str, converted: common.Converted) -> None:
  """A params checkpoint that `--config.init_from` and `load_pretrained` accept."""
  from bert_jax.training.checkpoint import save_params  # pylint: disable=import-outside-toplevel
  tok = converted.tokenizer
  data = {"vocab": next(iter(tok.files)), "tokenizer": tok.kind, "lower_case": tok.lower_case} if tok else {}
  config = {"objective": "bert", "model": converted.config.to_dict(), "data": data,
            "heads": list(common.present_heads(converted.config))}
  save_params(directory, converted.params, config, tok.files if tok else None)
