"""Hugging Face model directories: config.json + model.safetensors / pytorch_model.bin (+ tokenizer files)."""
from __future__ import annotations

import dataclasses
import io
import json
import os
import re

import numpy as np
import safetensors
import safetensors.numpy
from etils import epath

from bert_jax import workdir
from bert_jax.data_pipelines import fairseq_spm, hf_tokenizer, tokenizer_kinds, tokenizers
from bert_jax.data_pipelines.tokenizers import HF_MAX_CHARS_PER_WORD as HF_MAX_CHARS
from bert_jax.conversion import common
from bert_jax.conversion import sentence_transformers
from bert_jax.conversion import params as params_lib
from bert_jax.conversion.torch_zip import load_torch_zip
from bert_jax.errors import UserError
from bert_jax.models import families, head_kinds, hf_config as hf_config_lib
from bert_jax.models.families import Family

_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
# An adapter model's export ships this modeling code (conversion/hf_adapter_modeling.py) under this name.
_ADAPTER_MODULE = "modeling_houlsby_adapters"


def read_config_json(directory: str) -> hf_config_lib.HFConfig:
  """A HF directory's config.json, read through the typed reader (models/hf_config.py)."""
  path = epath.Path(directory) / "config.json"
  return hf_config_lib.HFConfig(workdir.read_json(path), str(path))


def family_of(hf_config: hf_config_lib.HFConfig, source: str) -> Family:
  archs = hf_config.list("architectures", None) or ["?"]
  family = families.by_model_type(hf_config.str("model_type", None), source, str(archs[0]))
  if family.hf is None:
    raise UserError(f"{source}: the {family.name} family has no Hugging Face layout")
  return family


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


def _heads_in(tensors, family: Family, names: dict) -> tuple[str, ...]:
  firsts = {}
  for row in family.layout.global_rows:
    if row.hf is not None:
      firsts.setdefault(row.part, row.hf.format(**names))
  return tuple(h for h in family.heads if firsts.get(h) in tensors)


def _check_tied(tensors, family: Family, names: dict, source: str) -> None:
  for name, target in family.hf.tied.items():
    target = target.format(**names)
    if name in tensors and target in tensors and not np.array_equal(tensors[name], tensors[target]):
      raise UserError(f"{source}: {name} differs from {target}; bert_jax ties the MLM decoder to the "
                      "word embeddings, so untied decoders do not convert")


def _template_pattern(template: str, names: dict) -> str:
  """A regex for a mapping-table name, any layer index in place of {i} (captured)."""
  return r"(\d+)".join(re.escape(part.format(**names)) for part in template.split("{i}"))


def _check_all_used(tensors, family: Family, names: dict, known: set[str], config, source: str):
  """Tensors of the mapping table that this config leaves unused mean config.json disagrees with the
  weights (e.g. fewer num_hidden_layers than the file holds): refuse rather than drop them silently."""
  global_re = re.compile("|".join(_template_pattern(r.hf, names) for r in family.layout.global_rows if r.hf))
  layer_re = re.compile("|".join(_template_pattern(r.hf, names) for r in family.layout.rows_in_layer(config)
                                if r.hf))
  unused = sorted(k for k in tensors if k not in known and (global_re.fullmatch(k) or layer_re.fullmatch(k)))
  if not unused:
    return
  layers = [int(g) for k in tensors if (m := layer_re.fullmatch(k)) for g in m.groups() if g is not None]
  hint = (f"; config.json says num_hidden_layers={config.num_layers} but the weights hold {max(layers) + 1} "
          "layers" if layers and max(layers) + 1 > config.num_layers else "")
  raise UserError(f"{source}: config.json does not match the weights, which hold tensors it leaves unused: "
                  f"{', '.join(unused[:6])}" + (f" (+{len(unused) - 6} more)" if len(unused) > 6 else "") + hint)


def _task_kinds(hf_config: dict, family: Family):
  """The head kinds whose HF class (in this family) config.json's architectures name."""
  archs = hf_config.get("architectures") or ()
  for kind in map(head_kinds.get, head_kinds.names()):
    hf_class = family.hf.task_classes.get(kind.name, kind.hf_class)
    if hf_class and family.hf.class_prefix + hf_class in archs:
      yield kind


def _task_head_names(hf_config: dict, family: Family) -> set[str]:
  """The tensors of the fine-tuning head of a <Family>For<Task> checkpoint (not read: noted as ignored),
  which may share names with a pretraining head (ModernBERT's head.* in ForMaskedLM and the task classes)."""
  found = set()
  for kind in _task_kinds(hf_config, family):
    found |= {r.hf.format(b=family.hf.base_prefix) for r in family.hf.task_rows.get(kind.name, kind.hf_rows)}
  return found


def _read_task_head(hf_config: dict, family: Family, tensors, config, source: str
                    ) -> tuple[common.TaskHead | None, dict, set[str]]:
  """(the head, its params {"head": ...}, the tensor names read) of a checkpoint whose class is a head kind's
  that `convert --from hf` reads (HeadKind.hf_read: XLNetForQuestionAnswering); (None, {}, set()) otherwise."""
  kind = next((k for k in _task_kinds(hf_config, family) if k.hf_read), None)
  if kind is None:
    return None, {}, set()
  rows = family.hf.task_rows.get(kind.name, kind.hf_rows)
  params = params_lib.rows_to_params(rows, tensors, "hf", {"b": family.hf.base_prefix},
                                     params_lib.head_shapes(config, kind.name), source)
  return common.TaskHead(kind.name, ()), params, {r.hf.format(b=family.hf.base_prefix) for r in rows}


def read(directory: str, scan_layers: bool = True) -> common.Converted:
  """A HF model directory as bert_jax params (the heads it has) plus its tokenizer files."""
  hf_config = read_config_json(directory)
  family = family_of(hf_config, directory)
  tensors = read_weights(directory)
  base = family.hf.base_prefix
  names = {"b": base if any(k.startswith(base) for k in tensors) else ""}
  heads = _heads_in(tensors, family, names)
  config = family.hf.read_config(hf_config, heads, scan_layers, directory)
  _check_tied(tensors, family, names, directory)
  params = params_lib.to_params(config, family, tensors, "hf", names, directory)
  task_head, head_params, head_names = _read_task_head(hf_config, family, tensors, config, directory)
  params.update(head_params)
  known = {name for name, _ in params_lib.foreign_names(config, family, "hf", names)} | head_names
  known |= {t.format(**names) for t in family.hf.tied}
  _check_all_used(tensors, family, names, known | _task_head_names(hf_config, family), config, directory)
  ignored = sorted(k for k in tensors if k not in known and not k.endswith(family.hf.buffers))
  notes = [f"{directory}: ignored tensors without a bert_jax counterpart: {', '.join(ignored[:6])}"
           + (f" (+{len(ignored) - 6} more)" if len(ignored) > 6 else "")] if ignored else []
  found = tokenizer(directory)
  return common.Converted(family.name, config, params, found,
                          missing_heads=tuple(h for h in family.pretrained_heads(heads) if h not in heads),
                          notes=notes, task_head=task_head)


def tokenizer(directory: str) -> common.Tokenizer | None:
  """The tokenizer files of a HF directory; tokenizer_config.json says whether it lower-cases."""
  family = family_of(read_config_json(directory), directory)
  path = epath.Path(directory) / "tokenizer_config.json"
  settings = hf_config_lib.HFConfig(workdir.read_json(path) if path.exists() else {}, str(path))
  found = common.tokenizer_from_files(directory, settings.bool("do_lower_case", family.hf.lower_case),
                                      family.tokenizer)
  return _with_word_limit(found, directory)


def _with_word_limit(found: common.Tokenizer | None, directory: str) -> common.Tokenizer | None:
  """A tokenizer whose kind has HF's word limit (WordPiece) keeps HF's longest word: tokenizer.json's
  model.max_input_chars_per_word, else BertTokenizer's 100 (Google's tokenizer, and so bert_jax's by default,
  allows 200)."""
  if found is None or not tokenizer_kinds.get(found.kind).hf_word_limit:
    return found
  fast = epath.Path(directory) / "tokenizer.json"
  model = workdir.read_json(fast).get("model") or {} if fast.exists() else {}
  return dataclasses.replace(found, max_chars_per_word=int(model.get("max_input_chars_per_word", HF_MAX_CHARS)))


def _architecture(family: Family, heads: set[str]) -> families.Architecture:
  """The HF class for these heads: an exact match, else the one keeping most of them."""
  return max(family.hf.architectures,
             key=lambda a: (a.heads == heads, len(a.heads & heads), -len(a.heads - heads)))


@dataclasses.dataclass
class _Export:
  """What a HF directory gets: the class, the encoder (with the heads kept), the rows outside it,
  the keys config.json adds, and notes for the user."""
  architecture: str
  config: families.Config
  prefixed: bool
  extra_rows: tuple = ()
  extra_config: dict = dataclasses.field(default_factory=dict)
  notes: list[str] = dataclasses.field(default_factory=list)


def _pretraining_export(converted: common.Converted) -> _Export:
  config, family = converted.config, converted.record
  heads = set(family.heads_of(config))
  architecture = _architecture(family, heads)
  kept = family.with_heads(config, heads & architecture.heads)
  notes = []
  if architecture.heads - heads:
    notes.append(f"{architecture.name} expects {', '.join(sorted(architecture.heads - heads))}, which this "
                 "model lacks: transformers will initialise it")
  return _Export(architecture.name, kept, architecture.prefixed, notes=notes)


def _task_export(converted: common.Converted) -> _Export:
  """A fine-tuned model as <Family>For{SequenceClassification, TokenClassification, QuestionAnswering}."""
  config, family, head = converted.config, converted.record, converted.task_head
  kind = head_kinds.get(head.kind)
  hf_class = family.hf.task_classes.get(kind.name, kind.hf_class)
  if not hf_class:
    raise UserError(f"a {family.name} model with a {kind.name} head has no Hugging Face class; use bert-jax predict")
  architecture = family.hf.class_prefix + hf_class
  if head.pooling != "pooled":
    raise UserError(f"head.pooling={head.pooling!r} (a mix of every layer's [CLS]) has no Hugging Face "
                    "equivalent: only pooled classification heads export; use bert-jax predict")
  if head.kind in family.hf.no_task_export:
    raise UserError(f"{architecture} {family.hf.no_task_export[head.kind]}")
  if "cls_norm" in converted.params.get("head", {}):
    raise UserError("head.cls_norm='isobn' (IsoBN's normalised [CLS]) has no Hugging Face equivalent: "
                    f"{architecture} would drop it; use bert-jax predict")
  rows = family.hf.task_rows.get(head.kind, kind.hf_rows)
  # A pretraining head whose parameters the task rows write (RoBERTa's pooler) leaves the base model.
  written = {r.ours for r in rows}
  moved = {r.part for r in family.layout.global_rows if r.ours in written}
  base = family.with_heads(config, [h for h in family.heads_of(config) if h not in moved])
  extra = kind.hf_config(head.labels)
  notes = []
  if "adapters" in family.layout.parts(config):
    architecture = family.hf.class_prefix + "Adapters" + hf_class
    extra.update(model_type=f"{family.hf.model_type}_houlsby_adapters", adapter_size=config.adapter_size, auto_map={
        "AutoConfig": f"{_ADAPTER_MODULE}.{family.hf.class_prefix}AdaptersConfig",
        "AutoModel" + hf_class: f"{_ADAPTER_MODULE}.{architecture}"})
    notes.append(f"Houlsby adapters: load with trust_remote_code=True ({_ADAPTER_MODULE}.py builds them)")
  return _Export(architecture, base, True, rows, extra, notes)


def write(directory: str, converted: common.Converted) -> list[str]:
  """Writes config.json, model.safetensors and the tokenizer files; returns notes for the user, which
  name every parameter the HF class has no place for."""
  family = converted.record
  if family.hf is None:
    raise UserError(f"the {family.name} family has no Hugging Face layout (transformers has no such model); "
                    "keep it in bert_jax's format (predict reads it)")
  if getattr(converted.config, "sublayer_order", ""):
    raise UserError(f"model.sublayer_order={converted.config.sublayer_order!r}: a sandwich transformer has no "
                    "Hugging Face layout (its layers are not attention-then-feed-forward); keep it in bert_jax's format")
  if getattr(converted.config, "entity_layers", 0):
    raise UserError(f"model.entity_layers={converted.config.entity_layers}: ERNIE-THU's entity fusion layers have no "
                    "Hugging Face layout; keep it in bert_jax's format")
  export = (_pretraining_export if converted.task_head is None else _task_export)(converted)
  names = {"b": family.hf.base_prefix if export.prefixed else ""}
  hf_config = {"architectures": [export.architecture], "model_type": family.hf.model_type,
               **family.hf.write_config(export.config), **export.extra_config,
               **_token_ids(family, converted.tokenizer)}
  tensors = params_lib.from_params(export.config, family, converted.params, "hf", names, export.extra_rows)
  out = workdir.create(directory)
  workdir.write_bytes(out / "model.safetensors", safetensors.numpy.save(tensors, metadata={"format": "pt"}))
  workdir.write_json(out / "config.json", hf_config)
  if "adapters" in family.layout.parts(export.config):
    modeling = epath.Path(__file__).parent / "hf_adapter_modeling.py"
    workdir.write_text(out / f"{_ADAPTER_MODULE}.py", modeling.read_text())
  left = params_lib.unwritten(export.config, family, converted.params, export.extra_rows)
  notes = list(export.notes)
  if left:
    notes.append(f"{export.architecture} has no place for {len(left)} parameters, not written: "
                 f"{', '.join(left[:8])}{' ...' if len(left) > 8 else ''}")
  if converted.tokenizer:
    # A fine-tuned model's tokenizer truncates (truncation=True) where fine-tuning and predict did, a
    # sentence embedding model's where it embeds.
    max_length = converted.task_head.max_seq_length if converted.task_head else 0
    max_length = converted.pooling.max_seq_length if converted.pooling else max_length
    _write_tokenizer(out, family, converted.tokenizer, max_length)
  if converted.pooling is not None:
    sentence_transformers.write(directory, converted.pooling, converted.config.hidden_size)
    notes.append(f"a sentence-transformers folder too ({'+'.join(converted.pooling.modes)} pooling"
                 f"{', normalized' if converted.pooling.normalize else ''}): SentenceTransformer(DIR) loads it")
  return notes


def _token_ids(family: Family, tokenizer: common.Tokenizer | None) -> dict[str, int]:
  """config.json's special token ids the family's HF config keeps (family.hf.token_ids), by the roles of the
  tokenizer exported beside it (HF's defaults are its released vocabulary's ids)."""
  if not family.hf.token_ids or tokenizer is None or tokenizer.kind not in tokenizer_kinds.loadable():
    return {}
  loaded = tokenizers.load_tokenizer(next(iter(tokenizer.files.values())), tokenizer.lower_case, kind=tokenizer.kind)
  return {key: found for key, role in family.hf.token_ids.items()
          if (found := loaded.special_ids.get(role)) is not None}


def _write_tokenizer(directory: epath.Path, family: Family, tokenizer: common.Tokenizer, max_length: int = 0) -> None:
  if tokenizer.kind == hf_tokenizer.KIND:  # under this name only, with the tokens named beside it added
    fast = hf_tokenizer.TokenizerJson(next(iter(tokenizer.files.values())))
    workdir.write_text(directory / hf_tokenizer.FILE, fast.to_json())
  else:
    workdir.write_tokenizer(directory, tokenizer.files)
  kind = tokenizer_kinds.get(tokenizer.kind)
  if kind.hf_json is not None and fairseq_spm.HF_TOKENIZER_FILE not in tokenizer.files:
    # transformers reads tokenizer.json without the sentencepiece library (a SentencePiece model alone
    # needs it and protobuf): write the one its tokenizer class would save.
    workdir.write_json(directory / fairseq_spm.HF_TOKENIZER_FILE,
                       kind.hf_json(next(iter(tokenizer.files.values())), tokenizer.lower_case))
  own = tokenizer.kind == family.tokenizer  # a family trained with another kind of tokenizer gets its generic class
  settings = {"tokenizer_class": family.hf.tokenizer_class if own else kind.hf_class,
              "do_lower_case": tokenizer.lower_case}
  if tokenizer.kind == hf_tokenizer.KIND:  # its normalizer cases it; transformers takes the roles from here
    settings = {"tokenizer_class": settings["tokenizer_class"], **fast.transformers_settings()}
  if max_length:
    settings["model_max_length"] = max_length
  if own:
    settings.update(family.hf.tokenizer_settings)
  workdir.write_json(directory / "tokenizer_config.json", settings)
