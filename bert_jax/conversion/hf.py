"""Hugging Face model directories: config.json + model.safetensors / pytorch_model.bin (+ tokenizer files)."""
from __future__ import annotations

import json
import os
import shutil

import numpy as np
import safetensors
import safetensors.numpy

from bert_jax.conversion import common, layout
from bert_jax.conversion import params as params_lib
from bert_jax.conversion.torch_zip import load_torch_zip
from bert_jax.errors import UserError
from bert_jax.models.config import ModelConfig

_CLASS_PREFIX = {"bert": "Bert", "roberta": "Roberta", "albert": "Albert", "electra": "Electra"}
# (architecture, its heads, whether its state dict prefixes the base model), preferred first.
_ARCHITECTURES = {
    "bert": (("BertForPreTraining", {"pooler", "mlm", "sentence"}, True), ("BertForMaskedLM", {"mlm"}, True),
             ("BertForNextSentencePrediction", {"pooler", "sentence"}, True), ("BertModel", {"pooler"}, False)),
    "roberta": (("RobertaForMaskedLM", {"mlm"}, True), ("RobertaModel", {"pooler"}, False)),
    "albert": (("AlbertForPreTraining", {"pooler", "mlm", "sentence"}, True), ("AlbertForMaskedLM", {"mlm"}, True),
               ("AlbertModel", {"pooler"}, False)),
    "electra": (("ElectraForPreTraining", {"rtd"}, True), ("ElectraForMaskedLM", {"mlm"}, True),
                ("ElectraModel", set(), False)),
}
_DEFAULTS = {"hidden_act": "gelu", "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
             "max_position_embeddings": 512, "type_vocab_size": 2, "initializer_range": 0.02,
             "layer_norm_eps": 1e-12, "pad_token_id": 0, "embedding_size": 128}
_FAMILY_DEFAULTS = {"albert": {"hidden_act": "gelu_new", "hidden_dropout_prob": 0.0,
                               "attention_probs_dropout_prob": 0.0},
                    "roberta": {"pad_token_id": 1}}
_REQUIRED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def family_of(hf_config: dict, source: str) -> str:
  model_type = hf_config.get("model_type")
  if model_type not in layout.FAMILIES:
    archs = hf_config.get("architectures") or ["?"]
    raise UserError(f"{source}: unknown architecture {archs[0]} (model_type {model_type!r}); "
                    f"supported model types: {', '.join(layout.FAMILIES)}")
  return model_type


def _read_file(path: str) -> dict[str, np.ndarray]:
  if path.endswith(".safetensors"):
    try:
      return safetensors.numpy.load_file(path)
    except (safetensors.SafetensorError, OSError) as e:
      raise UserError(f"{path}: cannot read safetensors ({e}); the file is truncated or damaged") from None
  return load_torch_zip(path)


def read_weights(directory: str) -> dict[str, np.ndarray]:
  """Every tensor of a HF checkpoint: one weights file or the shards its index lists."""
  for name in _WEIGHT_FILES:
    index = os.path.join(directory, name + ".index.json")
    if os.path.exists(index):
      with open(index) as f:
        shards = sorted(set(json.load(f)["weight_map"].values()))
      tensors = {}
      for shard in shards:
        tensors.update(_read_file(os.path.join(directory, shard)))
      return tensors
    if os.path.exists(os.path.join(directory, name)):
      return _read_file(os.path.join(directory, name))
  raise UserError(f"{directory}: no {' or '.join(_WEIGHT_FILES)} (nor a sharded index) found")


def _get(hf_config: dict, family: str, key: str, source: str):
  if key in hf_config:
    return hf_config[key]
  if key in _REQUIRED:
    raise UserError(f"{source}: config.json lacks {key}")
  return _FAMILY_DEFAULTS.get(family, {}).get(key, _DEFAULTS[key])


def model_config(hf_config: dict, family: str, heads, scan_layers: bool, source: str) -> ModelConfig:
  """The ModelConfig of a HF config.json, with `heads` switched on."""
  get = lambda key: _get(hf_config, family, key, source)  # noqa: E731
  if hf_config.get("position_embedding_type", "absolute") != "absolute":
    raise UserError(f"{source}: position_embedding_type={hf_config['position_embedding_type']!r}; "
                    "only 'absolute' position embeddings convert")
  if family == "albert" and (hf_config.get("num_hidden_groups", 1), hf_config.get("inner_group_num", 1)) != (1, 1):
    raise UserError(f"{source}: ALBERT with num_hidden_groups/inner_group_num != 1 has no bert_jax layout")
  act = common.hidden_act(get("hidden_act"), source)
  if family in ("roberta", "electra") and "mlm" in heads and act != "gelu":
    # Their HF MLM heads hard-code exact GELU; bert_jax's head uses the encoder's activation.
    raise UserError(f"{source}: the {family} MLM head uses GELU but hidden_act={get('hidden_act')!r}")
  embedding_size = get("embedding_size") if family in ("albert", "electra") else 0
  config = ModelConfig(
      vocab_size=get("vocab_size"), hidden_size=get("hidden_size"), num_layers=get("num_hidden_layers"),
      num_heads=get("num_attention_heads"), intermediate_size=get("intermediate_size"),
      max_position_embeddings=get("max_position_embeddings"), type_vocab_size=get("type_vocab_size"),
      embedding_size=0 if embedding_size == get("hidden_size") else embedding_size,
      hidden_dropout=get("hidden_dropout_prob"), attention_dropout=get("attention_probs_dropout_prob"),
      layer_norm_eps=get("layer_norm_eps"), initializer_range=get("initializer_range"), hidden_act=act,
      position_style="roberta" if family == "roberta" else "absolute", pad_token_id=get("pad_token_id") or 0,
      share_layers="all" if family == "albert" else "none", scan_layers=scan_layers)
  return common.with_heads(config, family, heads)


def _heads_in(tensors, family: str, names: dict) -> tuple[str, ...]:
  firsts = {}
  for row in layout.GLOBAL_ROWS[family]:
    firsts.setdefault(row.head, row.hf.format(**names))
  return tuple(h for h in layout.HEADS if firsts.get(h) in tensors)


def _check_tied(tensors, family: str, names: dict, source: str) -> None:
  for name, target in layout.HF_TIED[family].items():
    target = target.format(**names)
    if name in tensors and target in tensors and not np.array_equal(tensors[name], tensors[target]):
      raise UserError(f"{source}: {name} differs from {target}; bert_jax ties the MLM decoder to the "
                      "word embeddings, so untied decoders do not convert")


def read(directory: str, scan_layers: bool = True) -> common.Converted:
  """A HF model directory as bert_jax params (the heads it has) plus its tokenizer files."""
  with open(os.path.join(directory, "config.json")) as f:
    hf_config = json.load(f)
  family = family_of(hf_config, directory)
  tensors = read_weights(directory)
  base = layout.HF_BASE[family]
  names = {"b": base if any(k.startswith(base) for k in tensors) else ""}
  heads = _heads_in(tensors, family, names)
  config = model_config(hf_config, family, heads, scan_layers, directory)
  _check_tied(tensors, family, names, directory)
  params = params_lib.to_params(config, family, tensors, "hf", names, directory)
  known = {name for name, _ in params_lib.foreign_names(config, family, "hf", names)}
  known |= {t.format(**names) for t in layout.HF_TIED[family]}
  ignored = sorted(k for k in tensors if k not in known and not k.endswith(layout.HF_BUFFERS))
  notes = [f"{directory}: ignored tensors without a bert_jax counterpart: {', '.join(ignored[:6])}"
           + (f" (+{len(ignored) - 6} more)" if len(ignored) > 6 else "")] if ignored else []
  return common.Converted(family, config, params, tokenizer(directory),
                          missing_heads=tuple(h for h in common.expected_heads(family, heads) if h not in heads),
                          notes=notes)


def tokenizer(directory: str) -> common.Tokenizer | None:
  """The tokenizer files of a HF directory; tokenizer_config.json says whether it lower-cases."""
  with open(os.path.join(directory, "config.json")) as f:
    family = family_of(json.load(f), directory)
  settings = {}
  path = os.path.join(directory, "tokenizer_config.json")
  if os.path.exists(path):
    with open(path) as f:
      settings = json.load(f)
  return common.tokenizer_from_files(directory, settings.get("do_lower_case", family != "roberta"))


def _architecture(family: str, heads: set[str]) -> tuple[str, set[str], bool]:
  """The HF class for these heads: an exact match, else the one keeping most of them."""
  options = _ARCHITECTURES[family]
  return max(options, key=lambda o: (o[1] == heads, len(o[1] & heads), -len(o[1] - heads)))


def _hf_config(config: ModelConfig, family: str, architecture: str) -> dict:
  acts = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu"}
  d = {"architectures": [architecture], "model_type": family, "vocab_size": config.vocab_size,
       "hidden_size": config.hidden_size, "num_hidden_layers": config.num_layers,
       "num_attention_heads": config.num_heads, "intermediate_size": config.intermediate_size,
       "hidden_act": acts[config.hidden_act], "hidden_dropout_prob": config.hidden_dropout,
       "attention_probs_dropout_prob": config.attention_dropout,
       "max_position_embeddings": config.max_position_embeddings, "type_vocab_size": config.type_vocab_size,
       "initializer_range": config.initializer_range, "layer_norm_eps": config.layer_norm_eps,
       "pad_token_id": config.pad_token_id, "position_embedding_type": "absolute",
       "tie_word_embeddings": True, "dtype": "float32"}
  if family in ("albert", "electra"):
    d["embedding_size"] = config.embed_dim
  if family == "albert":
    d.update(num_hidden_groups=1, inner_group_num=1)
  if family == "roberta":
    d.update(bos_token_id=0, eos_token_id=2)
  return d


_TOKENIZER_CLASS = {"bert": "BertTokenizer", "roberta": "RobertaTokenizer", "albert": "AlbertTokenizer",
                    "electra": "ElectraTokenizer"}


def write(directory: str, converted: common.Converted) -> list[str]:
  """Writes config.json, model.safetensors and the tokenizer files; returns notes on dropped heads."""
  config, family = converted.config, converted.family
  heads = set(common.present_heads(config))
  architecture, arch_heads, prefixed = _architecture(family, heads)
  kept = common.with_heads(config, family, heads & arch_heads)
  if family == "roberta" and kept.mlm_head and config.hidden_act != "gelu":
    raise UserError(f"RoBERTa's HF MLM head hard-codes GELU; this model uses {config.hidden_act}")
  names = {"b": layout.HF_BASE[family] if prefixed else ""}
  tensors = params_lib.from_params(kept, family, converted.params, "hf", names)
  os.makedirs(directory, exist_ok=True)
  safetensors.numpy.save_file(tensors, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump(_hf_config(config, family, architecture), f, indent=2, sort_keys=True)
  notes = []
  if heads - arch_heads:
    notes.append(f"{architecture} has no {', '.join(sorted(heads - arch_heads))}: not written")
  if arch_heads - heads:
    notes.append(f"{architecture} expects {', '.join(sorted(arch_heads - heads))}, which this model lacks: "
                 "transformers will initialise it")
  if converted.tokenizer:
    _write_tokenizer(directory, family, converted.tokenizer)
  return notes


def _write_tokenizer(directory: str, family: str, tokenizer: common.Tokenizer) -> None:
  for name, source in tokenizer.files.items():
    shutil.copyfile(source, os.path.join(directory, name))
  settings = {"tokenizer_class": _TOKENIZER_CLASS[family], "do_lower_case": tokenizer.lower_case}
  if family == "roberta":
    settings.update(bos_token="<s>", eos_token="</s>", unk_token="<unk>", sep_token="</s>",
                    cls_token="<s>", pad_token="<pad>", mask_token="<mask>", add_prefix_space=False)
  with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
    json.dump(settings, f, indent=2, sort_keys=True)
