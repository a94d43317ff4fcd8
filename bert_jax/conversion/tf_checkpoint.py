"""Original Google TF1 checkpoints (google-research/bert, albert, electra): `*.ckpt*` + `bert_config.json`.

TensorFlow is imported inside the functions: bert_jax itself imports without it. Which family a
checkpoint holds, its scopes, its config json and the variable names come from the family records
(models/records/; BERT's, ALBERT's and ELECTRA's have TF names): this module only reads and writes.
"""
from __future__ import annotations

import collections.abc
import os
import re

import numpy as np
from etils import epath

from bert_jax import workdir
from bert_jax.conversion import common
from bert_jax.conversion import params as params_lib
from bert_jax.data_pipelines import tftools
from bert_jax.errors import UserError
from bert_jax.models import families, hf_config
from bert_jax.models.families import Family


def find_prefix(path: str) -> str | None:
  """The checkpoint prefix (".../model.ckpt") for a prefix or a directory holding one, else None."""
  location = epath.Path(path)
  if epath.Path(path + ".index").exists():
    return path
  if not location.is_dir():
    return None
  state = location / "checkpoint"
  if state.exists():
    match = re.search(r'^model_checkpoint_path:\s*"(.*)"', state.read_text(), re.M)
    if match:
      return os.fspath(location / match.group(1))
  indexes = sorted(location.glob("*.ckpt*.index"), key=lambda p: p.stat().mtime)
  return os.fspath(indexes[-1])[:-len(".index")] if indexes else None


class _Tensors(collections.abc.Mapping):
  """Reads variables on demand: original checkpoints also hold Adam slots three times the model's size."""

  def __init__(self, prefix: str):
    tf = tftools.tf()
    self.prefix, self._errors = prefix, tf.errors.OpError
    try:
      self._reader = tf.train.load_checkpoint(prefix)
    except (self._errors, ValueError) as e:
      raise UserError(f"{prefix}: cannot open the TF checkpoint ({_first_line(e)}); truncated or "
                      "not a checkpoint") from None
    self._shapes = self._reader.get_variable_to_shape_map()

  def __getitem__(self, name):
    if name not in self._shapes:
      raise KeyError(name)
    try:
      return np.asarray(self._reader.get_tensor(name))
    except (self._errors, IndexError) as e:
      raise UserError(f"{self.prefix}: cannot read {name} ({_first_line(e)}); the checkpoint is "
                      "truncated or damaged") from None

  def __contains__(self, name):
    return name in self._shapes

  def __iter__(self):
    return iter(self._shapes)

  def __len__(self):
    return len(self._shapes)

  def shape(self, name: str) -> tuple[int, ...]:
    return tuple(self._shapes[name])


def _first_line(e: Exception) -> str:
  return str(getattr(e, "message", e)).strip().splitlines()[0]


def _family(tensors: _Tensors, source: str) -> Family:
  for family in families.all_families():
    if family.tf is not None and family.tf.detect(tensors):
      return family
  known = [f.name for f in families.all_families() if f.tf is not None]
  raise UserError(f"{source}: unknown architecture: no encoder variables of {', '.join(known)}")


def _read_json(directory: str, family: Family) -> hf_config.HFConfig:
  """The config json beside the checkpoint (the family's own name first, then any family's), read through
  the typed reader (models/hf_config.py); empty when there is none."""
  names = [family.tf.config_file] + [f.tf.config_file for f in families.all_families() if f.tf is not None]
  for name in dict.fromkeys(names):
    path = epath.Path(directory) / name
    if path.exists():
      return hf_config.HFConfig(workdir.read_json(path), str(path))
  return hf_config.HFConfig({}, str(epath.Path(directory) / family.tf.config_file))


def _heads_in(tensors, family: Family, names: dict) -> tuple[str, ...]:
  firsts = {}
  for row in family.layout.global_rows:
    if row.tf is not None:
      firsts.setdefault(row.part, row.tf.format(**names))
  return family.tf.own_heads(names, tuple(h for h in family.heads if firsts.get(h) in tensors))


def read(path: str, scan_layers: bool = True, electra_part: str | None = None) -> common.Converted:
  """electra_part: which model of a checkpoint holding two (ELECTRA's discriminator and generator)."""
  prefix = find_prefix(path)
  if prefix is None:
    raise UserError(f"{path}: no TF checkpoint (*.ckpt*.index) found")
  directory = os.fspath(epath.Path(prefix).parent)
  tensors = _Tensors(prefix)
  family = _family(tensors, path)
  names, notes = family.tf.scopes(tensors, electra_part, path)
  heads = _heads_in(tensors, family, names)
  config, config_notes = family.tf.read_config(tensors, names, _read_json(directory, family), heads, scan_layers,
                                               path)
  params = params_lib.to_params(config, family, tensors, "tf", names, path)
  return common.Converted(family.name, config, params, tokenizer(directory),
                          missing_heads=tuple(h for h in family.pretrained_heads(heads) if h not in heads),
                          notes=config_notes + notes)


def tokenizer(directory: str) -> common.Tokenizer | None:
  """The vocabulary beside a checkpoint; released models say "cased"/"uncased" only in their names."""
  base = epath.Path(directory).name.lower()
  return common.tokenizer_from_files(directory, not ("cased" in base and "uncased" not in base))


def write(directory: str, converted: common.Converted) -> list[str]:
  """Writes model.ckpt (original variable names), checkpoint, the config json and the vocabulary."""
  config, family = converted.config, converted.record
  if family.tf is None:
    raise UserError(f"{family.name} has no original TF checkpoint layout (it was not released as one); "
                    "use --to hf")
  settings, notes = family.tf.write_config(config)
  tensors = params_lib.from_params(config, family, converted.params, "tf", family.tf.write_scopes(config))
  tf = tftools.tf()
  out = workdir.create(directory)
  ordered = sorted(tensors)
  tf.raw_ops.SaveV2(prefix=os.fspath(out / "model.ckpt"), tensor_names=ordered,
                    shape_and_slices=[""] * len(ordered), tensors=[tensors[n] for n in ordered])
  workdir.write_text(out / "checkpoint",
                     'model_checkpoint_path: "model.ckpt"\nall_model_checkpoint_paths: "model.ckpt"\n')
  workdir.write_json(out / family.tf.config_file, settings)
  if converted.tokenizer:
    workdir.write_tokenizer(out, converted.tokenizer.files)
  left = params_lib.unwritten(config, family, converted.params)
  unwritten = [f"the original TF layout has no place for {len(left)} parameters, not written: {', '.join(left[:8])}"
               f"{' ...' if len(left) > 8 else ''}{'; export a fine-tuned head with --to hf' if converted.task_head else ''}"
               ] if left else []
  return unwritten + notes
