"""`load_pretrained` and `load_tokenizer`: one entry point for Hugging Face, original TF and bert_jax checkpoints.

`init_from` takes any of them too: `check_init_from` names a missing, unknown or damaged one, or one of
another family than the run's model (`check_family`), before a run writes anything, and `native_init_from`
converts a foreign one into the run's workdir (WORKDIR/init_from, what `bert-jax convert --from hf|tf`
writes), once: a rerun finds it there. `with_init_from_model` gives a
pretraining config the checkpoint's model and tokenizer (continued pretraining, configs/continue.py).
"""
from __future__ import annotations

import dataclasses
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
from etils import epath
from jax.experimental import multihost_utils

from bert_jax import params_checkpoint, workdir
from bert_jax.conversion import common, hf, native, tf_checkpoint
from bert_jax.conversion import sentence_transformers as st
from bert_jax.data_pipelines import hf_tokenizer, tokenizer_kinds, tokenizers
from bert_jax.data_pipelines.tokenizers import kind_of_file
from bert_jax.errors import UserError
from bert_jax.models import families
from bert_jax.models.config import LAYOUT_FAMILIES, ModelConfig
from bert_jax.ops import finite


def source_kind(path: str) -> str:
  """"bert_jax", "hf" or "tf" for a checkpoint path; UserError when it is none of them."""
  workdir.check_bucket(path)
  if native.is_native(path):
    return "bert_jax"
  location = epath.Path(path)
  if not location.exists() and tf_checkpoint.find_prefix(path) is None:
    raise UserError(f"{path} does not exist")
  model_dir = epath.Path(_hf_dir(path))
  if (model_dir / "config.json").exists():
    keys = workdir.read_json(model_dir / "config.json")
    if isinstance(keys, dict) and ("model_type" in keys or "architectures" in keys):
      return "hf"
  if tf_checkpoint.find_prefix(path) is not None:
    return "tf"
  raise UserError(f"{path}: not a Hugging Face directory (config.json with model_type), an original TF "
                  "checkpoint (*.ckpt*.index) or a bert_jax checkpoint (params/ or checkpoints/)")


def _hf_dir(path: str) -> str:
  """The HF model directory at `path`: itself, or a sentence-transformers folder's Transformer module."""
  return st.transformer_dir(path) if st.is_sentence_transformers(path) else path


def _read_hf(path: str, scan_layers: bool) -> common.Converted:
  """A HF directory; a sentence-transformers folder also gives its pooling, normalisation and length."""
  converted = hf.read(_hf_dir(path), scan_layers)
  if not st.is_sentence_transformers(path):
    return converted
  return dataclasses.replace(converted, pooling=st.read(path, converted.config.max_position_embeddings),
                             tokenizer=st.check_lower_case(converted.tokenizer, path))


_FOREIGN = {"hf": "a Hugging Face folder", "tf": "an original TF checkpoint"}


def check_init_from(config: ml_collections.ConfigDict) -> None:
  """UserError naming config.init_from when it is set and not a checkpoint (or not there at all), or unset
where the config takes its model from it (init_from_model: configs/continue.py). A bert_jax checkpoint is
read whole (damaged files, NaN: params_checkpoint.check_intact) and its family checked against the run's
model (`check_family`); a foreign one is checked when `native_init_from` converts it."""
  if not config.init_from:
    if config.get("init_from_model", False):
      raise UserError("init_from is empty: continued pretraining (init_from_model) needs the checkpoint to continue: "
                      "--config.init_from=DIR (a Hugging Face folder, an original TF checkpoint or a bert_jax one)")
    return
  location = workdir.path(config.init_from)
  workdir.check_bucket(location)
  if not location.exists() and tf_checkpoint.find_prefix(config.init_from) is None:
    raise UserError(f"init_from: {location} does not exist; give a bert_jax workdir or "
                    "params checkpoint, a Hugging Face folder or an original TF checkpoint")
  try:
    kind = source_kind(config.init_from)
  except UserError as e:
    raise UserError(f"init_from: {e}") from None
  if kind == "bert_jax":
    saved = params_checkpoint.check_intact(config.init_from, "init_from")
    if "model" not in saved:
      raise UserError(f"init_from: {config.init_from} has no model section in its config.json")
    check_family(config, families.model_config(saved["model"]), config.init_from)


# The jobs whose model is config.model (init_from fills it); the others take init_from's architecture.
_MODEL_FROM_CONFIG = ("pretrain", "general_distill")


def _layout(model: families.Config) -> str:
  """What decides a model's parameter tree: its family, or for BertModel's families (ModelConfig) the layout
  its switches make (CamemBERT and XLM-R are RoBERTa's: models/config.py, ModelConfig.layout_family)."""
  return model.layout_family() if isinstance(model, ModelConfig) else model.family


def check_family(config: ml_collections.ConfigDict, saved: families.Config, location: str) -> None:
  """UserError when init_from's model (`saved`, from its config.json) is of another family than the run's.

  A pretraining run (general distillation's student too) builds config.model and fills it from init_from:
  both must have one parameter layout (`_layout`), or the tensors whose names happen to agree would load
  into a model of another family. The other jobs take init_from's architecture: there only a model.family
  that the run sets explicitly is checked against it."""
  ours = config.model.to_dict()
  if config.get("job", "pretrain") in _MODEL_FROM_CONFIG and not config.get("init_from_model", False):
    model = families.model_config(ours)
    if _layout(model) == _layout(saved):
      return
    raise UserError(f"init_from: {location} holds a model of family {saved.family!r}, and this run trains one of "
                    f"family {model.family!r}: only the tensors whose names agree would load; give a checkpoint of "
                    "the run's family, or leave init_from empty for a fresh init")
  name = ours.get("family") or ""
  if not name or name == saved.family:
    return
  record = families.get(name)
  if record.config is type(saved) and (name not in LAYOUT_FAMILIES or name == _layout(saved)):
    return
  raise UserError(f"init_from: {location} holds a model of family {saved.family!r}, and model.family={name!r}: this "
                  "job takes init_from's architecture; leave model.family empty, or give a checkpoint of that family")


def native_init_from(config: ml_collections.ConfigDict, run_dir: epath.Path) -> ml_collections.ConfigDict:
  """`config` with init_from a bert_jax checkpoint: a Hugging Face folder or an original TF checkpoint is
  converted into run_dir/init_from first, as `bert-jax convert --from hf|tf` does (every process takes
  part: orbax saves collectively), and its family checked against the run's (`check_family`)."""
  if not config.init_from:
    return config
  kind = source_kind(config.init_from)
  if kind == "bert_jax":
    return config
  target = run_dir / workdir.CONVERTED_INIT
  if not (target / workdir.CONFIG).exists():  # config.json is written last: a complete conversion
    converted = read_checkpoint(config.init_from, scan_layers=config.model.get("scan_layers"))
    native.write(os.fspath(target), converted)
    if jax.process_index() == 0:
      print(f"init_from={config.init_from} is {_FOREIGN[kind]}: converted it to {target} (as `bert-jax convert "
            f"--from {kind} {config.init_from} {target}` does)", flush=True)
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices("bert_jax init_from converted")
  check_family(config, families.model_config(workdir.read_config(target)["model"]), config.init_from)
  config = ml_collections.ConfigDict(config.to_dict())  # a copy; locked again below
  config.init_from = os.fspath(target)
  config.lock()
  return config


# Model fields that say how a run computes, not what the checkpoint is: continued pretraining takes them
# from the run's config, the rest from the checkpoint.
RUN_FIELDS = ("dtype", "param_dtype", "remat", "attention", "scan_unroll")
# The rows each sentence head trains on (a model without one: config's builder, unless it needs a head).
_SENTENCE_ROWS = {"nsp": "nsp", "sop": "sop"}


def with_init_from_model(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """`config` (a pretraining config; init_from a bert_jax checkpoint, after `native_init_from`) with the
  checkpoint's architecture (config.model's RUN_FIELDS kept), its tokenizer and vocabulary (data.vocab,
  data.tokenizer, data.lower_case) and its heads: its MLM head, or a fresh one when it has none (said on
  stdout), and its sentence head (NSP or SOP rows), if any. Continued pretraining (BioBERT; Lee et al. 2019)."""
  saved = workdir.read_config(config.init_from)
  if "model" not in saved:
    raise UserError(f"init_from: {config.init_from} has no model section in its config.json")
  info = native.tokenizer(config.init_from)
  if info is None or tokenizer_kinds.get(info.kind).load is None:  # a kind read from checkpoints only (byte-level BPE)
    raise UserError(f"init_from: {config.init_from} has "
                    + ("no vocabulary" if info is None else f"a {info.kind} tokenizer, which pretraining does not "
                       "read yet") + "; continued pretraining trains on the checkpoint's own vocabulary")
  if config.data.vocab:
    raise UserError(f"data.vocab={config.data.vocab!r}: continued pretraining keeps init_from's vocabulary; leave "
                    "data.vocab empty (to add domain words, extend the checkpoint first: bert-jax vocab extend)")
  values = dict(saved["model"])
  values.update({k: config.model[k] for k in RUN_FIELDS if k in values and k in config.model})
  model = families.model_config(values)
  family = families.of(model)
  heads = family.heads_of(model)
  if "mlm" not in heads:
    model = family.with_heads(model, (*heads, "mlm"))
    print(f"init_from: {config.init_from} has no MLM head (e.g. a sentence-transformers model): continued "
          "pretraining starts a fresh one", flush=True)
  sentence = getattr(model, "sentence_head", "none")
  builder = _SENTENCE_ROWS.get(sentence) or (
      "full_sentences" if config.data.example_builder in ("nsp", "sop", "sso") else config.data.example_builder)
  out = ml_collections.ConfigDict(config.to_dict())
  out.model = ml_collections.ConfigDict(model.to_dict())
  out.data.update(vocab=str(next(iter(info.files.values()))), tokenizer=info.kind, lower_case=info.lower_case,
                  example_builder=builder)
  print(f"continued pretraining of {config.init_from}: its {model.family or family.name} model "
        f"({model.num_layers} layers, {model.vocab_size} token ids), {info.kind} tokenizer, heads "
        f"{', '.join(family.heads_of(model))}; {builder} rows", flush=True)
  out.lock()
  return out


def read_checkpoint(path: str, *, scan_layers: bool | None = None, electra_part: str | None = None,
                    task: str | None = None) -> common.Converted:
  """Family, config, params and tokenizer of any supported checkpoint (params as stored); task: the head of
  a multi-task bert_jax checkpoint to take."""
  kind = source_kind(path)
  if kind == "bert_jax":
    return native.read(path, scan_layers, task)
  if task:
    raise UserError(f"{path} is a {kind} checkpoint: --task takes a multi-task bert_jax workdir")
  scan = True if scan_layers is None else scan_layers
  converted = _read_hf(path, scan) if kind == "hf" else tf_checkpoint.read(path, scan, electra_part)
  finite.check_params_finite(converted.params, path)
  return converted


def _add_fresh_heads(converted: common.Converted, seed: int) -> common.Converted:
  family = converted.record
  config = family.with_heads(converted.config, family.heads_of(converted.config) + converted.missing_heads)
  ids = jnp.zeros((1, 1), jnp.int32)
  fresh = nn.meta.unbox(jax.jit(families.build(config).init)(jax.random.key(seed), ids)["params"])
  # Heads are top-level modules, so the loaded embeddings and encoder replace their fresh copies whole.
  return common.Converted(converted.family, config, {**fresh, **converted.params}, converted.tokenizer)


def load_pretrained(path: str, *, init_missing_heads: bool = False, scan_layers: bool | None = None,
                    electra_part: str | None = None, seed: int = 0) -> tuple[nn.Module, dict]:
  """(model, params) from a HF directory, an original TF checkpoint or a bert_jax checkpoint; the model
  is the checkpoint family's Flax module (BertModel for BERT, RoBERTa, ALBERT and ELECTRA; ModernBertModel
  for ModernBERT, the same call and outputs).

  The heads the checkpoint holds are loaded. A pretraining head it lacks (a bare BertModel has no MLM
  or NSP head) is named on stdout and left off the model, or initialised from `seed` when
  `init_missing_heads`. scan_layers: stacked (True) or unrolled layers; None keeps a bert_jax
  checkpoint's layout and stacks foreign ones. electra_part: "discriminator" or "generator" for an
  original ELECTRA checkpoint holding both. The config is `model.config`.
  """
  converted = read_checkpoint(path, scan_layers=scan_layers, electra_part=electra_part)
  for note in converted.notes:
    print(note, flush=True)
  if converted.task_head:
    print(f"{path}: a fine-tuned {converted.task_head.kind} model; the encoder leaves params['head'] unused "
          "(bert_jax.Predictor.load runs the whole model)", flush=True)
  if converted.missing_heads:
    missing = ", ".join(converted.missing_heads)
    if init_missing_heads:
      converted = _add_fresh_heads(converted, seed)
      print(f"{path}: no weights for {missing}; initialised fresh (seed {seed})", flush=True)
    else:
      print(f"{path}: no weights for {missing}; the model has them turned off "
            "(init_missing_heads=True initialises them)", flush=True)
  return families.build(converted.config), converted.params


def _tokenizer_info(path: str) -> common.Tokenizer | None:
  kind = source_kind(path)
  if kind == "bert_jax":
    return native.tokenizer(path)
  if kind == "hf":
    found = hf.tokenizer(_hf_dir(path))
    return st.check_lower_case(found, path) if st.is_sentence_transformers(path) else found
  location = epath.Path(path)
  return tf_checkpoint.tokenizer(os.fspath(location if location.is_dir() else location.parent))


def build_tokenizer(info: common.Tokenizer):
  """The tokenizer object (data_pipelines' WordPiece/SentencePiece, or byte-level BPE) for `info`."""
  files = list(info.files.values())
  if info.kind == "bpe":
    from bert_jax.conversion.bpe import ByteLevelBPETokenizer  # pylint: disable=import-outside-toplevel
    return ByteLevelBPETokenizer(*files)
  return tokenizers.load_tokenizer(files[0], info.lower_case, kind=info.kind,  # a kind with no word limit ignores it
                                   max_chars_per_word=info.max_chars_per_word or tokenizers.GOOGLE_MAX_CHARS_PER_WORD)


def load_tokenizer(path: str):
  """The tokenizer that travels with a checkpoint (converted dir, HF dir, TF dir, bert_jax workdir).

  A vocabulary file itself (vocab.txt, *.model; a tokenizer.json, any kind) loads lower-casing where its kind
  can, as data_pipelines does; so does a folder holding a tokenizer.json and no checkpoint.
  """
  location = epath.Path(path)
  if (location.is_dir() and (location / hf_tokenizer.FILE).exists() and not (location / "config.json").exists()
      and not native.is_native(path) and not st.is_sentence_transformers(path)):  # a tokenizer's folder alone
    location = location / hf_tokenizer.FILE
  if location.is_file():
    kind = kind_of_file(location.name)
    if location.name == hf_tokenizer.FILE:  # as the tokenizer class named beside it reads it (transformers)
      kind = hf_tokenizer.class_kind(location.parent) or kind
    return build_tokenizer(common.Tokenizer(kind, True, {"vocab": os.fspath(location)}))
  info = _tokenizer_info(path)
  if info is None:
    family = family_name(path)
    files = common.tokenizer_file_names(families.get(family).tokenizer if family else None)
    raise UserError(f"{path}: no tokenizer files found; " + (f"a {family} model reads {files}" if family else
                    f"bert_jax reads {files}") + ": put its tokenizer there, or give it as data.vocab=PATH")
  return build_tokenizer(info)


def family_name(path: str) -> str | None:
  """The family of the checkpoint at `path` (a bert_jax checkpoint's or a Hugging Face folder's), None where
  it does not say."""
  try:
    if native.is_native(path):
      return workdir.read_config(path).get("model", {}).get("family") or None
    return hf.family_of(hf.read_config_json(_hf_dir(path)), path).name
  except (UserError, OSError):
    return None
