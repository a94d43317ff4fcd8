"""Applies the mapping table: foreign tensors {name: array} <-> a bert_jax params tree, in both directions.

Foreign arrays are numpy, in the foreign layout (HF Linear weights [out, in], TF kernels [in, out]).
Every missing tensor and every shape mismatch is collected and reported in one UserError that names
the tensor and both shapes.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from bert_jax.errors import UserError
from bert_jax.models import bert, families, head_kinds
from bert_jax.models.families import Family, Row

Config = families.Config
_SHOWN = 6


def param_shapes(config: Config) -> dict[str, tuple[int, ...]]:
  """{bert_jax path: shape} of the model `config` describes, without allocating it."""
  ids = jnp.zeros((1, 1), jnp.int32)
  abstract = jax.eval_shape(lambda: families.build(config).init(jax.random.key(0), ids))["params"]
  flat = traverse_util.flatten_dict(nn.meta.unbox(abstract), sep="/")
  return {k: tuple(v.shape) for k, v in flat.items()}


def head_shapes(config: Config, kind: str) -> dict[str, tuple[int, ...]]:
  """{bert_jax path under head/: shape} of a fine-tuning head of `kind` on the encoder `config` describes."""
  length = max(getattr(config, "start_n_top", 1), getattr(config, "end_n_top", 1), 2)  # top-k heads need k tokens
  out = bert.ModelOutput(last_hidden_state=jnp.zeros((1, length, config.hidden_size), jnp.float32))
  module = head_kinds.get(kind).build(config, 2, "pooled", 0.0)
  mask = jnp.ones((1, length), jnp.int32)
  abstract = jax.eval_shape(lambda: module.init(jax.random.key(0), out, mask, True))["params"]
  flat = traverse_util.flatten_dict(nn.meta.unbox(abstract), sep="/")
  return {f"head/{k}": tuple(v.shape) for k, v in flat.items()}


def _canonical_shape(kind: str, shape: tuple[int, ...]) -> tuple[int, ...]:
  if kind == "heads_in":
    return (shape[0], shape[1] * shape[2])
  if kind == "heads_bias":
    return (shape[0] * shape[1],)
  if kind == "heads_out":
    return (shape[0] * shape[1], shape[2])
  if kind == "flat_in":
    return (shape[0], math.prod(shape[1:]))
  return shape


def _transposed(fmt: str, row: Row, name: str) -> bool:
  if fmt == "hf":
    return row.kind != "copy" and not row.kind.endswith("bias")
  return name.endswith("output_weights")


def _name(fmt: str, row: Row, names: Mapping[str, str], i: int) -> str:
  template = row.hf if fmt == "hf" else row.tf
  if template is None:
    raise UserError(f"{row.ours} has no original TF name in this family; convert with --to hf")
  return template.format(i=i, **names)


def foreign_shape(fmt: str, row: Row, name: str, our_shape: tuple[int, ...]) -> tuple[int, ...]:
  shape = _canonical_shape(row.kind, our_shape)
  return shape[::-1] if _transposed(fmt, row, name) else shape


def _rows(config: Config, family: Family, extra: Sequence[Row] = ()):
  """(row, foreign layer index, bert_jax prefix, stacked) for every tensor the model has;
  `extra`: rows outside the encoder (a fine-tuning head) written as they are."""
  parts = family.layout.parts(config)
  for row in family.layout.global_rows:
    if row.part in parts:
      yield row, 0, "", False
  for row in extra:
    yield row, 0, "", False
  for i, prefix, stacked in family.layout.layer_slots(config):
    for row in family.layout.rows_at(config, prefix):
      yield row, i, prefix + "/", stacked


def _rows_shown(config: Config, family: Family, desc: str, extra: Sequence[Row] = ()):
  """_rows with a progress bar on a terminal: a big checkpoint (BERT-large: ~400 tensors, each read,
  transposed and cast here) takes a while; in logs and tests nothing is printed."""
  from tqdm import tqdm  # pylint: disable=import-outside-toplevel
  rows = list(_rows(config, family, extra))
  return tqdm(rows, desc=desc, unit="tensor", disable=None, leave=False)


def foreign_names(config: Config, family: Family, fmt: str, names: Mapping[str, str]):
  """(foreign name, row) of every tensor the model `config` describes."""
  for row, i, _, _ in _rows(config, family):
    yield _name(fmt, row, names, i), row
  for row, _ in family.layout.constants(config):
    yield _name(fmt, row, names, 0), row


def _absent(family: Family, fmt: str, names: Mapping[str, str]) -> dict[str, float]:
  """{foreign name: value} of the parameters the family's foreign checkpoints leave out (HFNames.absent)."""
  if fmt != "hf" or family.hf is None:
    return {}
  return {template.format(**names): value for template, value in family.hf.absent.items()}


def _check_constants(config: Config, family: Family, tensors, fmt: str, names, source: str):
  for row, value in family.layout.constants(config):
    name = _name(fmt, row, names, 0)
    if name in tensors and not np.array_equal(tensors[name], value):
      raise UserError(f"{source}: {name} is not {'the identity' if value.ndim == 2 else 'zero'}, the value "
                      f"this {family.name} config fixes it at (bert_jax has no parameter for it: no E -> H "
                      "projection when embedding_size == hidden_size)")


def to_params(config: Config, family: Family, tensors: Mapping[str, np.ndarray], fmt: str,
              names: Mapping[str, str], source: str) -> dict:
  """The bert_jax params (float32 numpy) for `config` from foreign `tensors` ("hf" or "tf" layout)."""
  shapes = param_shapes(config)
  absent = _absent(family, fmt, names)
  flat: dict[str, list | np.ndarray] = {}
  missing, mismatched = [], []
  for row, i, prefix, stacked in _rows_shown(config, family, f"reading {source}"):
    path = prefix + row.ours
    our_shape = shapes[path][1:] if stacked else shapes[path]
    name = _name(fmt, row, names, i)
    if name not in tensors and name in absent:
      value = np.full(our_shape, absent[name], np.float32)
    elif name not in tensors:
      missing.append(name)
      continue
    else:
      value, want = np.asarray(tensors[name]), foreign_shape(fmt, row, name, our_shape)
      if value.shape != want:
        mismatched.append(f"{name}: checkpoint {value.shape} vs config {want}")
        continue
      value = (value.T if _transposed(fmt, row, name) else value).reshape(our_shape).astype(np.float32)
    if stacked:
      flat.setdefault(path, []).append(value)
    else:
      flat[path] = value
  _raise_problems(source, missing, mismatched)
  _check_constants(config, family, tensors, fmt, names, source)
  flat = {k: np.stack(v) if isinstance(v, list) else v for k, v in flat.items()}
  return traverse_util.unflatten_dict(flat, sep="/")


def rows_to_params(rows: Sequence[Row], tensors: Mapping[str, np.ndarray], fmt: str, names: Mapping[str, str],
                   shapes: Mapping[str, tuple[int, ...]], source: str) -> dict:
  """The params of `rows` outside the encoder (a fine-tuning head's), of these `shapes`, from foreign `tensors`."""
  flat, missing, mismatched = {}, [], []
  for row in rows:
    name = _name(fmt, row, names, 0)
    if name not in tensors:
      missing.append(name)
      continue
    value, want = np.asarray(tensors[name]), foreign_shape(fmt, row, name, shapes[row.ours])
    if value.shape != want:
      mismatched.append(f"{name}: checkpoint {value.shape} vs config {want}")
      continue
    flat[row.ours] = (value.T if _transposed(fmt, row, name) else value).reshape(shapes[row.ours]).astype(np.float32)
  _raise_problems(source, missing, mismatched)
  return traverse_util.unflatten_dict(flat, sep="/")


def _raise_problems(source: str, missing: list[str], mismatched: list[str]) -> None:
  problems = mismatched + ([f"missing tensors {', '.join(missing[:_SHOWN])}"
                            + (f" (+{len(missing) - _SHOWN} more)" if len(missing) > _SHOWN else "")]
                           if missing else [])
  if problems:
    raise UserError(f"{source} does not fit its config: {'; '.join(problems[:_SHOWN])}")


def _refuse_adapters(config: Config, family: Family, fmt: str) -> None:
  """A config whose parts hold "adapters" has them `adapter_size` wide (ModelConfig's field)."""
  with_adapters = [f.name for f in families.all_families() if f.layout.adapter_rows and f.hf]
  where = ("original TF BERT checkpoints have no place for; export it with --to hf" if fmt == "tf" else
           f"have no Hugging Face export in {family.name} (only in {', '.join(with_adapters)})")
  raise UserError(f"the model has Houlsby adapters (model.adapter_size={config.adapter_size}), which {where}; "
                  "or use it in bert_jax (`bert-jax predict`, bert_jax.Predictor)")


def from_params(config: Config, family: Family, params: Mapping, fmt: str,
                names: Mapping[str, str], extra: Sequence[Row] = ()) -> dict[str, np.ndarray]:
  """Foreign tensors {name: float32 array} in the "hf" or "tf" layout for bert_jax `params` (the
  encoder `config` describes, plus the `extra` rows)."""
  if "adapters" in family.layout.parts(config) and (fmt != "hf" or not family.layout.adapter_rows):
    _refuse_adapters(config, family, fmt)
  flat = traverse_util.flatten_dict(nn.meta.unbox(params), sep="/")
  absent = _absent(family, fmt, names)
  tensors = {}
  for row, i, prefix, stacked in _rows_shown(config, family, f"converting to {fmt}", extra):
    name = _name(fmt, row, names, i)
    if name in absent:
      continue
    value = np.asarray(flat[prefix + row.ours], np.float32)
    value = value[i] if stacked else value
    value = value.reshape(_canonical_shape(row.kind, value.shape))
    tensors[name] = np.ascontiguousarray(value.T if _transposed(fmt, row, name) else value)
  for row, value in family.layout.constants(config):
    tensors[_name(fmt, row, names, 0)] = value
  return tensors


def unwritten(config: Config, family: Family, params: Mapping, extra: Sequence[Row] = ()) -> list[str]:
  """The bert_jax parameters that from_params(config, family, params, ..., extra) leaves out."""
  written = {prefix + row.ours for row, _, prefix, _ in _rows(config, family, extra)}
  return sorted(k for k in traverse_util.flatten_dict(nn.meta.unbox(params), sep="/") if k not in written)


def relayout(params: Mapping, config: Config, scan_layers: bool) -> dict:
  """`params` of `config` re-arranged for scan_layers (stacked layers) or unrolled layer_i."""
  family = families.of(config)
  if family.layout.relayout is None:
    if config.scan_layers != scan_layers:
      raise UserError(f"{family.name} models have one layer layout: load with scan_layers={config.scan_layers}")
    return dict(params)
  return family.layout.relayout(params, config, scan_layers)
