"""Applies the mapping table: foreign tensors {name: array} <-> a bert_jax params tree, in both directions.

Foreign arrays are numpy, in the foreign layout (HF Linear weights [out, in], TF kernels [in, out]).
Every missing tensor and every shape mismatch is collected and reported in one UserError that names
the tensor and both shapes.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from bert_jax.conversion.layout import ADAPTER_ROWS, GLOBAL_ROWS, LAYER_ROWS, Row
from bert_jax.errors import UserError
from bert_jax.models.bert import BertModel
from bert_jax.models.config import ModelConfig

_SHOWN = 6


def param_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
  """{bert_jax path: shape} of the model `config` describes, without allocating it."""
  ids = jnp.zeros((1, 1), jnp.int32)
  abstract = jax.eval_shape(lambda: BertModel(config).init(jax.random.key(0), ids))["params"]
  flat = traverse_util.flatten_dict(nn.meta.unbox(abstract), sep="/")
  return {k: tuple(v.shape) for k, v in flat.items()}


def head_enabled(config: ModelConfig, head: str) -> bool:
  return {"backbone": True, "projection": config.embed_dim != config.hidden_size,
          "pooler": config.use_pooler, "mlm": config.mlm_head,
          "sentence": config.sentence_head != "none", "rtd": config.rtd_head}[head]


def layer_slots(config: ModelConfig, family: str) -> list[tuple[int, str, bool]]:
  """(foreign layer index, bert_jax prefix, stacked on a leading axis) for each foreign layer."""
  if config.share_layers == "all":
    prefix = "encoder/layers" if config.scan_layers else "encoder/layer"
    count = 1 if family == "albert" else config.num_layers
    return [(i, prefix, False) for i in range(count)]
  if config.share_layers != "none":
    raise UserError(f"model.share_layers={config.share_layers!r} has no Hugging Face or TF layout; "
                    "only 'none' and 'all' (ALBERT) convert")
  if family == "albert":
    raise UserError("an ALBERT checkpoint shares one layer: it needs model.share_layers='all'")
  if config.scan_layers:
    return [(i, "encoder/layers", True) for i in range(config.num_layers)]
  return [(i, f"encoder/layer_{i}", False) for i in range(config.num_layers)]


def _canonical_shape(kind: str, shape: tuple[int, ...]) -> tuple[int, ...]:
  if kind == "heads_in":
    return (shape[0], shape[1] * shape[2])
  if kind == "heads_bias":
    return (shape[0] * shape[1],)
  if kind == "heads_out":
    return (shape[0] * shape[1], shape[2])
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


def _rows(config: ModelConfig, family: str, extra: Sequence[Row] = ()):
  """(row, foreign layer index or None, bert_jax prefix, stacked) for every tensor the model has;
  `extra`: rows outside the encoder (a fine-tuning head) written as they are."""
  for row in GLOBAL_ROWS[family]:
    if head_enabled(config, row.head):
      yield row, 0, "", False
  for row in extra:
    yield row, 0, "", False
  adapters = ADAPTER_ROWS.get(family, []) if config.adapter_size else []
  for i, prefix, stacked in layer_slots(config, family):
    for row in list(LAYER_ROWS[family]) + adapters:
      yield row, i, prefix + "/", stacked


def _rows_shown(config: ModelConfig, family: str, desc: str, extra: Sequence[Row] = ()):
  """_rows with a progress bar on a terminal: a big checkpoint (BERT-large: ~400 tensors, each read,
  transposed and cast here) takes a while; in logs and tests nothing is printed."""
  from tqdm import tqdm  # pylint: disable=import-outside-toplevel
  rows = list(_rows(config, family, extra))
  return tqdm(rows, desc=desc, unit="tensor", disable=None, leave=False)


def foreign_names(config: ModelConfig, family: str, fmt: str, names: Mapping[str, str]):
  """(foreign name, row) of every tensor the model `config` describes."""
  for row, i, _, _ in _rows(config, family):
    yield _name(fmt, row, names, i), row
  for row in _identity_projection_rows(config, family):
    yield _name(fmt, row, names, 0), row


def _identity_projection_rows(config: ModelConfig, family: str) -> list[Row]:
  """ALBERT always projects E -> H; bert_jax only when E != H, where ALBERT's projection is the identity."""
  if family != "albert" or config.embed_dim != config.hidden_size:
    return []
  return [row for row in GLOBAL_ROWS[family] if row.head == "projection"]


def _identity(row: Row, size: int) -> np.ndarray:
  return np.eye(size, dtype=np.float32) if row.ours.endswith("kernel") else np.zeros(size, np.float32)


def _check_identity_projection(config: ModelConfig, family: str, tensors, fmt: str, names, source: str):
  for row in _identity_projection_rows(config, family):
    name = _name(fmt, row, names, 0)
    if name in tensors and not np.array_equal(tensors[name], _identity(row, config.hidden_size)):
      raise UserError(f"{source}: {name} is not the identity; bert_jax has no E -> H projection when "
                      f"embedding_size == hidden_size ({config.hidden_size})")


def to_params(config: ModelConfig, family: str, tensors: Mapping[str, np.ndarray], fmt: str,
              names: Mapping[str, str], source: str) -> dict:
  """The bert_jax params (float32 numpy) for `config` from foreign `tensors` ("hf" or "tf" layout)."""
  shapes = param_shapes(config)
  flat: dict[str, list | np.ndarray] = {}
  missing, mismatched = [], []
  for row, i, prefix, stacked in _rows_shown(config, family, f"reading {source}"):
    path = prefix + row.ours
    our_shape = shapes[path][1:] if stacked else shapes[path]
    name = _name(fmt, row, names, i)
    if name not in tensors:
      missing.append(name)
      continue
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
  _check_identity_projection(config, family, tensors, fmt, names, source)
  flat = {k: np.stack(v) if isinstance(v, list) else v for k, v in flat.items()}
  return traverse_util.unflatten_dict(flat, sep="/")


def _raise_problems(source: str, missing: list[str], mismatched: list[str]) -> None:
  problems = mismatched + ([f"missing tensors {', '.join(missing[:_SHOWN])}"
                            + (f" (+{len(missing) - _SHOWN} more)" if len(missing) > _SHOWN else "")]
                           if missing else [])
  if problems:
    raise UserError(f"{source} does not fit its config: {'; '.join(problems[:_SHOWN])}")


def from_params(config: ModelConfig, family: str, params: Mapping, fmt: str,
                names: Mapping[str, str], extra: Sequence[Row] = ()) -> dict[str, np.ndarray]:
  """Foreign tensors {name: float32 array} in the "hf" or "tf" layout for bert_jax `params` (the
  encoder `config` describes, plus the `extra` rows)."""
  if config.adapter_size and (fmt != "hf" or family not in ADAPTER_ROWS):
    where = ("original TF BERT checkpoints have no place for; export it with --to hf" if fmt == "tf" else
             f"have no Hugging Face export in {family} (only in BERT, RoBERTa and ELECTRA)")
    raise UserError(f"the model has Houlsby adapters (model.adapter_size={config.adapter_size}), which {where}; "
                    "or use it in bert_jax (`bert-jax predict`, bert_jax.Predictor)")
  flat = traverse_util.flatten_dict(nn.meta.unbox(params), sep="/")
  tensors = {}
  for row, i, prefix, stacked in _rows_shown(config, family, f"converting to {fmt}", extra):
    value = np.asarray(flat[prefix + row.ours], np.float32)
    value = value[i] if stacked else value
    name = _name(fmt, row, names, i)
    value = value.reshape(_canonical_shape(row.kind, value.shape))
    tensors[name] = np.ascontiguousarray(value.T if _transposed(fmt, row, name) else value)
  for row in _identity_projection_rows(config, family):
    tensors[_name(fmt, row, names, 0)] = _identity(row, config.hidden_size)
  return tensors


def unwritten(config: ModelConfig, family: str, params: Mapping, extra: Sequence[Row] = ()) -> list[str]:
  """The bert_jax parameters that from_params(config, family, params, ..., extra) leaves out."""
  written = {prefix + row.ours for row, _, prefix, _ in _rows(config, family, extra)}
  return sorted(k for k in traverse_util.flatten_dict(nn.meta.unbox(params), sep="/") if k not in written)


def relayout(params: Mapping, config: ModelConfig, scan_layers: bool) -> dict:
  """`params` of `config` re-arranged for scan_layers (stacked layers) or unrolled layer_i."""
  if config.scan_layers == scan_layers:
    return dict(params)
  if scan_layers and config.pruned_heads:
    raise UserError("a pruned model (model.pruned_heads) has layers of different widths, which cannot be "
                    "stacked: load it with scan_layers=False")
  encoder = dict(params["encoder"])
  if config.share_layers == "all":
    old, new = ("layers", "layer") if config.scan_layers else ("layer", "layers")
    encoder[new] = encoder.pop(old)
  elif config.scan_layers:
    stacked = encoder.pop("layers")
    encoder.update({f"layer_{i}": jax.tree.map(lambda x, i=i: np.asarray(x)[i], stacked)
                    for i in range(config.num_layers)})
  else:
    layers = [encoder.pop(f"layer_{i}") for i in range(config.num_layers)]
    encoder["layers"] = jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *layers)
  return {**params, "encoder": encoder}
