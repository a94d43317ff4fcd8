"""ModernBERT checkpoints of Hugging Face (ModernBertModel, ModernBertForMaskedLM) <-> bert_jax params;
hf.py hands ModernBERT directories to `read` and `write` here.

The mapping table below is the only place that knows ModernBERT's Hugging Face names. A row is
(bert_jax path, HF name, the number of leading input axes of our kernel or None for a copy): HF
stores Linear weights as [out, in], so our kernel [in..., out...] is flattened to [in, out] and
transposed. Layer 0 has no attention norm in Hugging Face (an identity): ours is read as ones and not
written. The MLM decoder is tied to the token embeddings; its bias is our mlm_head/output_bias.
"""
from __future__ import annotations

import math
from typing import Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import safetensors.numpy
from flax import traverse_util

from bert_jax import workdir
from bert_jax.conversion import common
from bert_jax.errors import UserError
from bert_jax.models.modernbert import ModernBertConfig, ModernBertModel

MODEL_TYPE = "modernbert"
BASE = "model."
# (architecture, its heads, whether its state dict prefixes the base model), preferred first.
ARCHITECTURES = (("ModernBertForMaskedLM", {"mlm"}, True), ("ModernBertModel", set(), False))

_GLOBAL = (
    ("backbone", "embeddings/word_embeddings/embedding", "{b}embeddings.tok_embeddings.weight", None),
    ("backbone", "embeddings/norm/scale", "{b}embeddings.norm.weight", None),
    ("backbone", "encoder/final_norm/scale", "{b}final_norm.weight", None),
    ("mlm", "mlm_head/transform/kernel", "head.dense.weight", 1),
    ("mlm", "mlm_head/transform/norm/scale", "head.norm.weight", None),
    ("mlm", "mlm_head/output_bias", "decoder.bias", None),
)
_LAYER = (
    ("attention_norm/scale", "{b}layers.{i}.attn_norm.weight", None),
    ("attention/qkv", "{b}layers.{i}.attn.Wqkv.weight", 1),
    ("attention/out", "{b}layers.{i}.attn.Wo.weight", 2),
    ("mlp_norm/scale", "{b}layers.{i}.mlp_norm.weight", None),
    ("mlp/wi", "{b}layers.{i}.mlp.Wi.weight", 1),
    ("mlp/wo", "{b}layers.{i}.mlp.Wo.weight", 1),
)
TIED = {"decoder.weight": "{b}embeddings.tok_embeddings.weight"}
# Hugging Face switches bert_jax's ModernBERT does not have (it has no biases but the decoder's).
_FIXED = {"attention_bias": False, "mlp_bias": False, "norm_bias": False, "classifier_bias": False}


def _layer_period(layer_types: list[str], source: str) -> int:
  """global_attn_every_n_layers from Hugging Face's per-layer list (layers 0, n, 2n, ... global)."""
  globals_ = [i for i, kind in enumerate(layer_types) if kind == "full_attention"]
  period = globals_[1] if len(globals_) > 1 else len(layer_types)
  if [i % period == 0 for i in range(len(layer_types))] != [kind == "full_attention" for kind in layer_types]:
    raise UserError(f"{source}: layer_types {layer_types} is not global attention every n layers from layer 0, "
                    "the only pattern bert_jax's ModernBERT has")
  return period


def _rope_theta(hf: dict, kind: str, fallback: float, source: str) -> float:
  params = (hf.get("rope_parameters") or {}).get(kind) or {}
  if params.get("rope_type", "default") != "default":
    raise UserError(f"{source}: rope_type={params['rope_type']!r} for {kind}; only the default rotary embedding "
                    "converts")
  return float(params.get("rope_theta", fallback))


def model_config(hf: dict, heads, scan_layers: bool, source: str) -> ModernBertConfig:
  """The ModernBertConfig of a Hugging Face config.json, with `heads` switched on."""
  for key, value in _FIXED.items():
    if hf.get(key, value) != value:
      raise UserError(f"{source}: {key}={hf[key]!r}; bert_jax's ModernBERT has no biases there")
  layers = hf["num_hidden_layers"]
  every = hf.get("global_attn_every_n_layers", 3)
  types = hf.get("layer_types") or ["full_attention" if i % every == 0 else "sliding_attention" for i in range(layers)]
  acts = {"gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh"}
  for key in ("hidden_activation", "classifier_activation"):
    if hf.get(key, "gelu") not in acts:
      raise UserError(f"{source}: {key}={hf[key]!r} is not one of {sorted(acts)}")
  return ModernBertConfig(
      vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], num_layers=layers,
      num_heads=hf["num_attention_heads"], intermediate_size=hf["intermediate_size"],
      max_position_embeddings=hf.get("max_position_embeddings", 8192), local_window=hf.get("local_attention", 128),
      global_every=_layer_period(types, source),
      global_rope_theta=_rope_theta(hf, "full_attention", hf.get("global_rope_theta", 160_000.0), source),
      local_rope_theta=_rope_theta(hf, "sliding_attention", hf.get("local_rope_theta", 10_000.0), source),
      norm_eps=hf.get("norm_eps", 1e-5), hidden_act=acts[hf.get("hidden_activation", "gelu")],
      head_act=acts[hf.get("classifier_activation", "gelu")],
      embedding_dropout=hf.get("embedding_dropout", 0.0), attention_dropout=hf.get("attention_dropout", 0.0),
      mlp_dropout=hf.get("mlp_dropout", 0.0), initializer_range=hf.get("initializer_range", 0.02),
      initializer_cutoff_factor=hf.get("initializer_cutoff_factor") or 2.0,
      pad_token_id=hf.get("pad_token_id") or 0, mlm_head="mlm" in heads,
      pooling=hf.get("classifier_pooling", "cls"), scan_layers=scan_layers)


def hf_config(config: ModernBertConfig, architecture: str) -> dict:
  """config.json for `config` as Hugging Face's ModernBertConfig reads it."""
  acts = {"gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh"}
  types = ["full_attention" if config.is_global(i) else "sliding_attention" for i in range(config.num_layers)]
  return {"architectures": [architecture], "model_type": MODEL_TYPE, **_FIXED, "decoder_bias": True,
          "vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
          "num_hidden_layers": config.num_layers, "num_attention_heads": config.num_heads,
          "intermediate_size": config.intermediate_size, "max_position_embeddings": config.max_position_embeddings,
          "local_attention": config.local_window, "global_attn_every_n_layers": config.global_every,
          "layer_types": types,
          "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": config.global_rope_theta},
                              "sliding_attention": {"rope_type": "default", "rope_theta": config.local_rope_theta}},
          "norm_eps": config.norm_eps, "hidden_activation": acts[config.hidden_act],
          "classifier_activation": acts[config.head_act], "classifier_pooling": config.pooling,
          "embedding_dropout": config.embedding_dropout, "attention_dropout": config.attention_dropout,
          "mlp_dropout": config.mlp_dropout, "initializer_range": config.initializer_range,
          "initializer_cutoff_factor": config.initializer_cutoff_factor, "pad_token_id": config.pad_token_id,
          "tie_word_embeddings": True}


def _rows(config: ModernBertConfig, prefix: str):
  """(bert_jax path, layer index or None, HF name or None (not stored), input axes) of every tensor."""
  for head, ours, hf, inputs in _GLOBAL:
    if head == "backbone" or (head == "mlm" and config.mlm_head):
      yield ours, None, hf.format(b=prefix), inputs
  for i in range(config.num_layers):
    where = "encoder/layers/" if config.scan_layers else f"encoder/layer_{i}/"
    for ours, hf, inputs in _LAYER:
      stored = not (i == 0 and ours.startswith("attention_norm"))
      yield where + ours, (i if config.scan_layers else None), hf.format(b=prefix, i=i) if stored else None, inputs


def _to_hf(value: np.ndarray, inputs: int | None) -> np.ndarray:
  if inputs is None:
    return value
  return value.reshape(math.prod(value.shape[:inputs]), -1).T


def prefix_of(tensors: Mapping[str, np.ndarray]) -> str:
  return BASE if any(k.startswith(BASE) for k in tensors) else ""


def heads_in(tensors: Mapping[str, np.ndarray]) -> set[str]:
  return {"mlm"} if "head.dense.weight" in tensors and "decoder.bias" in tensors else set()


def to_params(config: ModernBertConfig, shapes: Mapping[str, tuple], tensors: Mapping[str, np.ndarray],
              source: str) -> tuple[dict, set[str]]:
  """(params as float32 numpy, the HF names used) for `config` from HF `tensors`. shapes: {path: shape} of
  the params `config` describes (stacked layers included)."""
  prefix, flat, used, problems = prefix_of(tensors), {}, set(), []
  for ours, layer, name, inputs in _rows(config, prefix):
    shape = shapes[ours][1:] if layer is not None else shapes[ours]
    if name is None:
      value = np.ones(shape, np.float32)
    elif name not in tensors:
      problems.append(f"missing {name}")
      continue
    else:
      value, used = np.asarray(tensors[name], np.float32), used | {name}
      want = _to_hf(np.empty(shape, np.float32), inputs).shape
      if value.shape != want:
        problems.append(f"{name}: checkpoint {value.shape} vs config {want}")
        continue
      value = (value if inputs is None else value.T).reshape(shape)
    if layer is None:
      flat[ours] = value
    else:
      flat.setdefault(ours, []).append(value)
  if problems:
    raise UserError(f"{source} does not fit its config: {'; '.join(problems[:6])}")
  for name, target in TIED.items():
    name, target = name.format(b=prefix), target.format(b=prefix)
    if name in tensors and not np.array_equal(tensors[name], tensors.get(target)):
      raise UserError(f"{source}: {name} differs from {target}; bert_jax ties the MLM decoder to the token "
                      "embeddings, so untied decoders do not convert")
    used.add(name)
  flat = {k: np.stack(v) if isinstance(v, list) else v for k, v in flat.items()}
  return traverse_util.unflatten_dict(flat, sep="/"), used


def from_params(config: ModernBertConfig, params: Mapping, prefixed: bool) -> dict[str, np.ndarray]:
  """HF tensors {name: float32 array} for bert_jax `params` of `config` (the decoder weight is tied: not
  written, as Hugging Face saves it)."""
  flat = traverse_util.flatten_dict(nn.meta.unbox(params), sep="/")
  tensors = {}
  for ours, layer, name, inputs in _rows(config, BASE if prefixed else ""):
    if name is not None:
      value = np.asarray(flat[ours], np.float32)
      tensors[name] = np.ascontiguousarray(_to_hf(value if layer is None else value[layer], inputs))
  return tensors


def param_shapes(config: ModernBertConfig) -> dict[str, tuple[int, ...]]:
  """{bert_jax path: shape} of the model `config` describes, without allocating it."""
  ids = jnp.zeros((1, 1), jnp.int32)
  abstract = jax.eval_shape(lambda: ModernBertModel(config).init(jax.random.key(0), ids))["params"]
  return {k: tuple(v.shape) for k, v in traverse_util.flatten_dict(nn.meta.unbox(abstract), sep="/").items()}


def heads_of(config: ModernBertConfig) -> tuple[str, ...]:
  """The pretraining heads `config` switches on, in the order BERT's family names them."""
  return tuple(h for h, on in (("pooler", config.use_pooler), ("mlm", config.mlm_head)) if on)


def with_heads(config: ModernBertConfig, heads) -> ModernBertConfig:
  return config.replace(mlm_head="mlm" in heads, use_pooler="pooler" in heads)


def read(directory: str, hf: dict, tensors: Mapping[str, np.ndarray], scan_layers: bool,
         tokenizer: common.Tokenizer | None) -> common.Converted:
  """A Hugging Face ModernBERT directory's config.json and tensors as bert_jax params."""
  heads = heads_in(tensors)
  config = model_config(hf, heads, scan_layers, directory)
  params, used = to_params(config, param_shapes(config), tensors, directory)
  ignored = sorted(set(tensors) - used)
  notes = [f"{directory}: ignored tensors without a bert_jax counterpart: {', '.join(ignored[:6])}"
           + (f" (+{len(ignored) - 6} more)" if len(ignored) > 6 else "")] if ignored else []
  if tokenizer is None:
    notes.append(f"{directory}: no tokenizer files bert_jax reads (vocab.txt, *.model, vocab.json + merges.txt); "
                 "ModernBERT's own ships as tokenizer.json only")
  return common.Converted(MODEL_TYPE, config, params, tokenizer, tuple(h for h in ("mlm",) if h not in heads), notes)


_TOKENIZER_CLASS = {"wordpiece": "BertTokenizer", "bpe": "RobertaTokenizer", "sentencepiece": "AlbertTokenizer"}


def write(directory: str, converted: common.Converted) -> list[str]:
  """config.json, model.safetensors and the tokenizer files of a Hugging Face ModernBERT directory."""
  if converted.task_head is not None:
    raise UserError(f"a fine-tuned ModernBERT ({converted.task_head.kind} head) has no Hugging Face export yet; "
                    "use bert-jax predict")
  config = converted.config
  architecture, _, prefixed = ARCHITECTURES[0] if config.mlm_head else ARCHITECTURES[1]
  tensors = from_params(config, converted.params, prefixed)
  out = workdir.create(directory)
  (out / "model.safetensors").write_bytes(safetensors.numpy.save(tensors, metadata={"format": "pt"}))
  workdir.write_json(out / "config.json", hf_config(config, architecture))
  if converted.tokenizer:
    tok = converted.tokenizer
    workdir.write_tokenizer(out, tok.files)
    workdir.write_json(out / "tokenizer_config.json", {"tokenizer_class": _TOKENIZER_CLASS[tok.kind],
                                                        "do_lower_case": tok.lower_case})
  return [f"the pooled prediction head (pooler) has no place in {architecture}: not written"] if config.use_pooler else []


def relayout(params: Mapping, config: ModernBertConfig, scan_layers: bool) -> dict:
  """`params` re-arranged for stacked (scan_layers) or unrolled layer_{i} layers."""
  if config.scan_layers == scan_layers:
    return dict(params)
  encoder = dict(params["encoder"])
  if config.scan_layers:
    stacked = encoder.pop("layers")
    encoder.update({f"layer_{i}": jax.tree.map(lambda x, i=i: np.asarray(x)[i], stacked)
                    for i in range(config.num_layers)})
  else:
    layers = [encoder.pop(f"layer_{i}") for i in range(config.num_layers)]
    encoder["layers"] = jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *layers)
  return {**params, "encoder": encoder}
