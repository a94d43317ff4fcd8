"""Original Google TF1 checkpoints (google-research/bert, albert, electra): `*.ckpt*` + `bert_config.json`.

TensorFlow is imported inside the functions: bert_jax itself imports without it. The original TF code
computes "gelu" with the tanh approximation, so its checkpoints load with hidden_act="gelu_tanh".
"""
from __future__ import annotations

import collections.abc
import os
import re

import numpy as np
from etils import epath

from bert_jax import workdir
from bert_jax.conversion import common, layout
from bert_jax.conversion import params as params_lib
from bert_jax.data_pipelines import tftools
from bert_jax.errors import UserError
from bert_jax.models.config import ModelConfig

_CONFIG_FILES = {"bert": "bert_config.json", "albert": "albert_config.json", "electra": "bert_config.json"}
_TF_LAYER_NORM_EPS = 1e-12  # tf.contrib.layers.layer_norm's, which all three code bases use
_ACTS = {"gelu": "gelu_tanh", "relu": "relu"}


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


def _family(tensors: _Tensors, source: str) -> str:
  if "bert/encoder/transformer/group_0/inner_group_0/LayerNorm/gamma" in tensors:
    return "albert"
  if any(n.startswith(("electra/encoder/", "generator/encoder/")) for n in tensors):
    return "electra"
  if "bert/encoder/layer_0/output/LayerNorm/gamma" in tensors:
    return "bert"
  raise UserError(f"{source}: unknown architecture: no bert/, ALBERT or electra/ encoder variables")


def _scopes(family: str, tensors: _Tensors, electra_part: str | None) -> dict[str, str]:
  if family != "electra":
    return {"t": "bert", "e": "bert"}
  part = electra_part or ("discriminator" if "electra/encoder/layer_0/output/LayerNorm/gamma" in tensors
                          else "generator")
  if part not in ("discriminator", "generator"):
    raise UserError(f"electra_part={part!r} is not 'discriminator' or 'generator'")
  scope = "electra" if part == "discriminator" else "generator"
  own_embeddings = f"{scope}/embeddings/word_embeddings" in tensors
  return {"t": scope, "e": scope if own_embeddings else "electra"}


def _read_json(directory: str, family: str) -> dict:
  for name in (_CONFIG_FILES[family], "bert_config.json", "albert_config.json"):
    path = epath.Path(directory) / name
    if path.exists():
      return workdir.read_json(path)
  return {}


def _sizes(tensors: _Tensors, family: str, names: dict, settings: dict, source: str) -> dict:
  """The encoder's sizes: from the config json when it describes this encoder, else off the shapes.

  An original ELECTRA checkpoint's json describes the discriminator only; its generator's sizes come
  from the shapes, with the original code's 64-dim heads.
  """
  hidden = tensors.shape(f"{_LAYER0[family].format(**names)}/attention_1/self/query/kernel"
                         if family == "albert" else f"{_LAYER0[family].format(**names)}/attention/self/query/kernel")[0]
  layers = {m.group(1) for n in tensors for m in [re.match(rf"{names['t']}/encoder/layer_(\d+)/", n)] if m}
  if settings and (family != "electra" or names["t"] == "electra" or settings.get("hidden_size") == hidden):
    if family != "albert" and len(layers) != settings["num_hidden_layers"]:
      raise UserError(f"{source}: the config json says num_hidden_layers={settings['num_hidden_layers']} but "
                      f"the checkpoint holds {len(layers)} layers ({names['t']}/encoder/layer_*)")
    embedding = settings.get("embedding_size", settings["hidden_size"])
    return dict(vocab_size=settings["vocab_size"], hidden_size=settings["hidden_size"],
                embedding_size=0 if embedding == settings["hidden_size"] else embedding,
                num_layers=settings["num_hidden_layers"], num_heads=settings["num_attention_heads"],
                intermediate_size=settings["intermediate_size"],
                max_position_embeddings=settings.get("max_position_embeddings", 512),
                type_vocab_size=settings.get("type_vocab_size", 2))
  if family == "albert":
    raise UserError(f"{source}: an ALBERT checkpoint needs albert_config.json (for num_hidden_layers)")
  vocab, embed = tensors.shape(f"{names['e']}/embeddings/word_embeddings")
  return dict(vocab_size=vocab, embedding_size=0 if embed == hidden else embed, hidden_size=hidden,
              num_layers=len(layers), num_heads=max(1, hidden // 64),
              intermediate_size=tensors.shape(f"{names['t']}/encoder/layer_0/intermediate/dense/kernel")[1],
              max_position_embeddings=tensors.shape(f"{names['e']}/embeddings/position_embeddings")[0],
              type_vocab_size=tensors.shape(f"{names['e']}/embeddings/token_type_embeddings")[0])


_LAYER0 = {"albert": "bert/encoder/transformer/group_0/inner_group_0", "bert": "{t}/encoder/layer_0",
           "electra": "{t}/encoder/layer_0"}


def _heads_in(tensors, family: str, names: dict) -> tuple[str, ...]:
  firsts = {}
  for row in layout.GLOBAL_ROWS[family]:
    firsts.setdefault(row.head, row.tf.format(**names))
  present = {h for h in layout.HEADS if firsts.get(h) in tensors}
  if family == "electra":
    # One original ELECTRA checkpoint holds both models; each keeps only its own head.
    present -= {"rtd"} if names["t"] == "generator" else {"mlm"}
  return tuple(h for h in layout.HEADS if h in present)


def read(path: str, scan_layers: bool = True, electra_part: str | None = None) -> common.Converted:
  prefix = find_prefix(path)
  if prefix is None:
    raise UserError(f"{path}: no TF checkpoint (*.ckpt*.index) found")
  directory = os.fspath(epath.Path(prefix).parent)
  tensors = _Tensors(prefix)
  family = _family(tensors, path)
  names = _scopes(family, tensors, electra_part)
  settings = _read_json(directory, family)
  act = settings.get("hidden_act", "gelu")
  if act not in _ACTS:
    raise UserError(f"{path}: hidden_act={act!r} is not one of {sorted(_ACTS)}")
  heads = _heads_in(tensors, family, names)
  config = ModelConfig(
      **_sizes(tensors, family, names, settings, path), hidden_act=_ACTS[act],
      hidden_dropout=settings.get("hidden_dropout_prob", 0.1),
      attention_dropout=settings.get("attention_probs_dropout_prob", 0.1),
      initializer_range=settings.get("initializer_range", 0.02), layer_norm_eps=_TF_LAYER_NORM_EPS,
      share_layers="all" if family == "albert" else "none", scan_layers=scan_layers)
  config = common.with_heads(config, family, heads)
  params = params_lib.to_params(config, family, tensors, "tf", names, path)
  notes = [f"{path}: no {_CONFIG_FILES[family]}; sizes read off the tensors, 64-dim attention heads assumed"] if not settings else []
  if family == "electra" and electra_part is None and {"electra/", "generator/"} <= {n[:n.find("/") + 1] for n in tensors}:
    notes.append(f"{path}: holds a discriminator and a generator; loaded the {'discriminator' if names['t'] == 'electra' else 'generator'} "
                 "(electra_part= chooses)")
  return common.Converted(family, config, params, tokenizer(directory),
                          missing_heads=tuple(h for h in common.expected_heads(family, heads) if h not in heads),
                          notes=notes)


def tokenizer(directory: str) -> common.Tokenizer | None:
  """The vocabulary beside a checkpoint; released models say "cased"/"uncased" only in their names."""
  base = epath.Path(directory).name.lower()
  return common.tokenizer_from_files(directory, not ("cased" in base and "uncased" not in base))


def _tf_config(config: ModelConfig, family: str) -> dict:
  d = {"vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
       "num_hidden_layers": config.num_layers, "num_attention_heads": config.num_heads,
       "intermediate_size": config.intermediate_size, "hidden_act": "relu" if config.hidden_act == "relu" else "gelu",
       "hidden_dropout_prob": config.hidden_dropout, "attention_probs_dropout_prob": config.attention_dropout,
       "max_position_embeddings": config.max_position_embeddings, "type_vocab_size": config.type_vocab_size,
       "initializer_range": config.initializer_range}
  if family in ("albert", "electra"):
    d["embedding_size"] = config.embed_dim
  if family == "albert":
    d.update(num_hidden_groups=1, inner_group_num=1, net_structure_type=0, gap_size=0, num_memory_blocks=0,
             down_scale_factor=1)
  return d


def write(directory: str, converted: common.Converted) -> list[str]:
  """Writes model.ckpt (original variable names), checkpoint, the config json and the vocabulary."""
  config, family = converted.config, converted.family
  if family == "roberta":
    raise UserError("RoBERTa was released by fairseq and has no original TF checkpoint layout; use --to hf")
  if config.pruned_heads:
    raise UserError("a pruned model (model.pruned_heads) has no original TF checkpoint layout: the TF code "
                    "builds every head; use --to hf (transformers 4.x prunes on load)")
  generator = family == "electra" and config.mlm_head and not config.rtd_head
  names = {"t": "generator" if generator else layout.TF_SCOPE[family],
           "e": "electra" if family == "electra" else "bert"}
  tensors = params_lib.from_params(config, family, converted.params, "tf", names)
  tf = tftools.tf()
  out = workdir.create(directory)
  ordered = sorted(tensors)
  tf.raw_ops.SaveV2(prefix=os.fspath(out / "model.ckpt"), tensor_names=ordered,
                    shape_and_slices=[""] * len(ordered), tensors=[tensors[n] for n in ordered])
  workdir.write_text(out / "checkpoint",
                     'model_checkpoint_path: "model.ckpt"\nall_model_checkpoint_paths: "model.ckpt"\n')
  workdir.write_json(out / _CONFIG_FILES[family], _tf_config(config, family))
  if converted.tokenizer:
    workdir.write_tokenizer(out, converted.tokenizer.files)
  left = params_lib.unwritten(config, family, converted.params)
  notes = [f"the original TF layout has no place for {len(left)} parameters, not written: {', '.join(left[:8])}"
           f"{' ...' if len(left) > 8 else ''}{'; export a fine-tuned head with --to hf' if converted.task_head else ''}"
           ] if left else []
  if config.hidden_act == "gelu":
    notes.append("the original TF code computes 'gelu' with the tanh approximation; this model uses exact GELU")
  if config.layer_norm_eps != _TF_LAYER_NORM_EPS:
    notes.append(f"the original TF code uses LayerNorm epsilon 1e-12; this model uses {config.layer_norm_eps}")
  return notes
