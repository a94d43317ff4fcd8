"""Hugging Face model directories: config.json + model.safetensors / pytorch_model.bin (+ tokenizer files)."""
from __future__ import annotations

import dataclasses
import io
import os
import re

import numpy as np
import safetensors
import safetensors.numpy
from etils import epath

from bert_jax import workdir
from bert_jax.data_pipelines.tokenizers import HF_MAX_CHARS_PER_WORD as HF_MAX_CHARS
from bert_jax.conversion import common, layout, modernbert
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
# An adapter model's export ships this modeling code (conversion/hf_adapter_modeling.py) under this name.
_ADAPTER_MODULE = "modeling_houlsby_adapters"


def family_of(hf_config: dict, source: str) -> str:
  model_type = hf_config.get("model_type")
  if model_type not in layout.FAMILIES:
    archs = hf_config.get("architectures") or ["?"]
    raise UserError(f"{source}: unknown architecture {archs[0]} (model_type {model_type!r}); "
                    f"supported model types: {', '.join(layout.FAMILIES)}")
  return model_type


def _read_file(path: epath.Path) -> dict[str, np.ndarray]:
  """A local file is read in place (memory-mapped safetensors); one in a bucket is fetched whole."""
  local = not workdir.is_url(path)
  if path.name.endswith(".safetensors"):
    try:
      return safetensors.numpy.load_file(path) if local else safetensors.numpy.load(path.read_bytes())
    except (safetensors.SafetensorError, OSError) as e:
      raise UserError(f"{path}: cannot read safetensors ({e}); the file is truncated or damaged") from None
  return load_torch_zip(os.fspath(path), None if local else io.BytesIO(path.read_bytes()))


def read_weights(directory: str) -> dict[str, np.ndarray]:
  """Every tensor of a HF checkpoint: one weights file or the shards its index lists."""
  location = epath.Path(directory)
  for name in _WEIGHT_FILES:
    index = location / (name + ".index.json")
    if index.exists():
      shards = sorted(set(workdir.read_json(index)["weight_map"].values()))
      tensors = {}
      for shard in shards:
        tensors.update(_read_file(location / shard))
      return tensors
    if (location / name).exists():
      return _read_file(location / name)
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
  # Pruned layers differ in width, so they cannot be stacked: such a model comes unrolled.
  pruned = hf_config.get("pruned_heads") or {}
  config = ModelConfig(
      vocab_size=get("vocab_size"), hidden_size=get("hidden_size"), num_layers=get("num_hidden_layers"),
      num_heads=get("num_attention_heads"), intermediate_size=get("intermediate_size"),
      max_position_embeddings=get("max_position_embeddings"), type_vocab_size=get("type_vocab_size"),
      embedding_size=0 if embedding_size == get("hidden_size") else embedding_size,
      hidden_dropout=get("hidden_dropout_prob"), attention_dropout=get("attention_probs_dropout_prob"),
      layer_norm_eps=get("layer_norm_eps"), initializer_range=get("initializer_range"), hidden_act=act,
      position_style="roberta" if family == "roberta" else "absolute", pad_token_id=get("pad_token_id") or 0,
      share_layers="all" if family == "albert" else "none", scan_layers=scan_layers and not pruned,
      pruned_heads=pruned)
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


def _template_pattern(template: str, names: dict) -> str:
  """A regex for a mapping-table name, any layer index in place of {i} (captured)."""
  return r"(\d+)".join(re.escape(part.format(**names)) for part in template.split("{i}"))


def _check_all_used(tensors, family: str, names: dict, known: set[str], config: ModelConfig, source: str):
  """Tensors of the mapping table that this config leaves unused mean config.json disagrees with the
  weights (e.g. fewer num_hidden_layers than the file holds): refuse rather than drop them silently."""
  global_re = re.compile("|".join(_template_pattern(r.hf, names) for r in layout.GLOBAL_ROWS[family]))
  layer_re = re.compile("|".join(_template_pattern(r.hf, names) for r in layout.LAYER_ROWS[family]))
  unused = sorted(k for k in tensors if k not in known and (global_re.fullmatch(k) or layer_re.fullmatch(k)))
  if not unused:
    return
  layers = [int(g) for k in tensors if (m := layer_re.fullmatch(k)) for g in m.groups() if g is not None]
  hint = (f"; config.json says num_hidden_layers={config.num_layers} but the weights hold {max(layers) + 1} "
          "layers" if layers and max(layers) + 1 > config.num_layers else "")
  raise UserError(f"{source}: config.json does not match the weights, which hold tensors it leaves unused: "
                  f"{', '.join(unused[:6])}" + (f" (+{len(unused) - 6} more)" if len(unused) > 6 else "") + hint)


def read(directory: str, scan_layers: bool = True) -> common.Converted:
  """A HF model directory as bert_jax params (the heads it has) plus its tokenizer files."""
  hf_config = workdir.read_json(epath.Path(directory) / "config.json")
  if hf_config.get("model_type") == modernbert.MODEL_TYPE:
    return modernbert.read(directory, hf_config, read_weights(directory), scan_layers, tokenizer(directory))
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
  _check_all_used(tensors, family, names, known, config, directory)
  ignored = sorted(k for k in tensors if k not in known and not k.endswith(layout.HF_BUFFERS))
  notes = [f"{directory}: ignored tensors without a bert_jax counterpart: {', '.join(ignored[:6])}"
           + (f" (+{len(ignored) - 6} more)" if len(ignored) > 6 else "")] if ignored else []
  return common.Converted(family, config, params, tokenizer(directory),
                          missing_heads=tuple(h for h in common.expected_heads(family, heads) if h not in heads),
                          notes=notes)


def tokenizer(directory: str) -> common.Tokenizer | None:
  """The tokenizer files of a HF directory; tokenizer_config.json says whether it lower-cases."""
  hf_config = workdir.read_json(epath.Path(directory) / "config.json")
  cased = hf_config.get("model_type") == modernbert.MODEL_TYPE or family_of(hf_config, directory) == "roberta"
  path = epath.Path(directory) / "tokenizer_config.json"
  settings = workdir.read_json(path) if path.exists() else {}
  found = common.tokenizer_from_files(directory, settings.get("do_lower_case", not cased))
  return _with_word_limit(found, directory)


def _with_word_limit(found: common.Tokenizer | None, directory: str) -> common.Tokenizer | None:
  """A WordPiece tokenizer keeps HF's longest word: tokenizer.json's model.max_input_chars_per_word,
  else BertTokenizer's 100 (Google's tokenizer, and so bert_jax's by default, allows 200)."""
  if found is None or found.kind != "wordpiece":
    return found
  fast = epath.Path(directory) / "tokenizer.json"
  model = workdir.read_json(fast).get("model") or {} if fast.exists() else {}
  return dataclasses.replace(found, max_chars_per_word=int(model.get("max_input_chars_per_word", HF_MAX_CHARS)))


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
  if config.pruned_heads:
    d["pruned_heads"] = {str(i): heads for i, heads in config.pruned_heads_dict().items()}
  if family in ("albert", "electra"):
    d["embedding_size"] = config.embed_dim
  if family == "albert":
    d.update(num_hidden_groups=1, inner_group_num=1)
  if family == "roberta":
    d.update(bos_token_id=0, eos_token_id=2)
  return d


_TOKENIZER_CLASS = {"bert": "BertTokenizer", "roberta": "RobertaTokenizer", "albert": "AlbertTokenizer",
                    "electra": "ElectraTokenizer"}


@dataclasses.dataclass
class _Export:
  """What a HF directory gets: the class, the encoder (with the heads kept), the rows outside it,
  the keys config.json adds, and notes for the user."""
  architecture: str
  config: ModelConfig
  prefixed: bool
  extra_rows: list = dataclasses.field(default_factory=list)
  extra_config: dict = dataclasses.field(default_factory=dict)
  notes: list[str] = dataclasses.field(default_factory=list)


def _pretraining_export(converted: common.Converted) -> _Export:
  config, family = converted.config, converted.family
  heads = set(common.present_heads(config))
  architecture, arch_heads, prefixed = _architecture(family, heads)
  kept = common.with_heads(config, family, heads & arch_heads)
  if family == "roberta" and kept.mlm_head and config.hidden_act != "gelu":
    raise UserError(f"RoBERTa's HF MLM head hard-codes GELU; this model uses {config.hidden_act}")
  notes = []
  if arch_heads - heads:
    notes.append(f"{architecture} expects {', '.join(sorted(arch_heads - heads))}, which this model lacks: "
                 "transformers will initialise it")
  return _Export(architecture, kept, prefixed, notes=notes)


def _task_export(converted: common.Converted) -> _Export:
  """A fine-tuned model as <Family>For{SequenceClassification, TokenClassification, QuestionAnswering}."""
  config, family, head = converted.config, converted.family, converted.task_head
  architecture = _CLASS_PREFIX[family] + layout.TASK_CLASSES[head.kind]
  if head.pooling != "pooled":
    raise UserError(f"head.pooling={head.pooling!r} (a mix of every layer's [CLS]) has no Hugging Face "
                    "equivalent: only pooled classification heads export; use bert-jax predict")
  rows = layout.TASK_ROWS[family].get(head.kind)
  if rows is None:
    raise UserError(f"{architecture} applies GELU to its [CLS] dense layer where bert_jax's pooler applies "
                    "tanh: this head has no exact Hugging Face equivalent; use bert-jax predict")
  pooler_in_head = any(r.ours.startswith("pooler/") for r in rows)
  base = common.with_heads(config, family, {"pooler"} if config.use_pooler and not pooler_in_head else set())
  extra = {}
  if head.kind != "span":  # HF's QA classes read num_labels=2 (start, end), its default
    names = head.labels or ("LABEL_0",)  # regression: one output, HF's default name
    extra.update(num_labels=len(names), id2label=dict(enumerate(names)),
                 label2id={name: i for i, name in enumerate(names)})
  if head.kind in ("classification", "regression"):
    extra["problem_type"] = "regression" if head.kind == "regression" else "single_label_classification"
  if config.adapter_size:
    architecture = _CLASS_PREFIX[family] + "Adapters" + layout.TASK_CLASSES[head.kind]
    extra.update(model_type=f"{family}_houlsby_adapters", adapter_size=config.adapter_size, auto_map={
        "AutoConfig": f"{_ADAPTER_MODULE}.{_CLASS_PREFIX[family]}AdaptersConfig",
        "AutoModel" + layout.TASK_CLASSES[head.kind]: f"{_ADAPTER_MODULE}.{architecture}"})
  notes = [f"Houlsby adapters: load with trust_remote_code=True ({_ADAPTER_MODULE}.py builds them)"
           ] if config.adapter_size else []
  return _Export(architecture, base, True, rows, extra, notes)


def write(directory: str, converted: common.Converted) -> list[str]:
  """Writes config.json, model.safetensors and the tokenizer files; returns notes for the user, which
  name every parameter the HF class has no place for."""
  family = converted.family
  if family == modernbert.MODEL_TYPE:
    return modernbert.write(directory, converted)
  export = (_pretraining_export if converted.task_head is None else _task_export)(converted)
  names = {"b": layout.HF_BASE[family] if export.prefixed else ""}
  tensors = params_lib.from_params(export.config, family, converted.params, "hf", names, export.extra_rows)
  out = workdir.create(directory)
  workdir.write_bytes(out / "model.safetensors", safetensors.numpy.save(tensors, metadata={"format": "pt"}))
  workdir.write_json(out / "config.json",
                     {**_hf_config(converted.config, family, export.architecture), **export.extra_config})
  if export.config.adapter_size:
    modeling = epath.Path(__file__).parent / "hf_adapter_modeling.py"
    workdir.write_text(out / f"{_ADAPTER_MODULE}.py", modeling.read_text())
  left = params_lib.unwritten(export.config, family, converted.params, export.extra_rows)
  notes = list(export.notes)
  if left:
    notes.append(f"{export.architecture} has no place for {len(left)} parameters, not written: "
                 f"{', '.join(left[:8])}{' ...' if len(left) > 8 else ''}")
  if converted.tokenizer:
    # A fine-tuned model's tokenizer truncates (truncation=True) where fine-tuning and predict did.
    max_length = converted.task_head.max_seq_length if converted.task_head else 0
    _write_tokenizer(out, family, converted.tokenizer, max_length)
  return notes


def _write_tokenizer(directory: epath.Path, family: str, tokenizer: common.Tokenizer, max_length: int = 0) -> None:
  workdir.write_tokenizer(directory, tokenizer.files)
  settings = {"tokenizer_class": _TOKENIZER_CLASS[family], "do_lower_case": tokenizer.lower_case}
  if max_length:
    settings["model_max_length"] = max_length
  if family == "roberta":
    settings.update(bos_token="<s>", eos_token="</s>", unk_token="<unk>", sep_token="</s>",
                    cls_token="<s>", pad_token="<pad>", mask_token="<mask>", add_prefix_space=False)
  workdir.write_json(directory / "tokenizer_config.json", settings)
