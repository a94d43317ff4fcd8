"""ModernBERT (Warner et al. 2024): answerdotai's release, in HF's ModernBert* classes (no original TF checkpoint).

Its own config and module (models/modernbert.py): rotary positions, pre-LN layers with a final norm,
GeGLU, no biases, alternating global and local attention. HF stores Linear weights [out, in]: our
fused q/k/v [H, 3, N, D] and GeGLU input [H, 2, F] kernels flatten to [in, out] and transpose. Layer 0
has no attention norm in HF (an identity; ours is unused there): read as ones, not written. The MLM
decoder is tied to the token embeddings; its bias is mlm_head/output_bias.

Fine-tuning heads read the pooler (HF's ModernBertPredictionHead over the [CLS] vector or the mean of
the real tokens, `pooling`) for sequence-level heads, and the same head at every position
(`TokenTransform`) for token and span heads: HF's ModernBertFor{SequenceClassification,
TokenClassification, QuestionAnswering}, whose `head.*` tensors these are on export.
"""
from __future__ import annotations

from typing import Iterable

from bert_jax.errors import UserError
from bert_jax.models.families import Architecture, Row, dense_rows, hf_only
from bert_jax.models import families, hf_config as hf_config_lib, modernbert
from bert_jax.models.modernbert import ModernBertConfig, ModernBertModel, TokenTransform

HEADS = ("pooler", "mlm")


def heads_of(config: ModernBertConfig) -> tuple[str, ...]:
  return tuple(h for h, on in (("pooler", config.use_pooler), ("mlm", config.mlm_head)) if on)


def with_heads(config: ModernBertConfig, heads: Iterable[str]) -> ModernBertConfig:
  heads = set(heads)
  return config.replace(mlm_head="mlm" in heads, use_pooler="pooler" in heads)


def _copy(part: str, ours: str, hf: str) -> Row:
  return Row(part, ours, hf, None, "copy")


_GLOBAL = (
    _copy("backbone", "embeddings/word_embeddings/embedding", "{b}embeddings.tok_embeddings.weight"),
    _copy("backbone", "embeddings/norm/scale", "{b}embeddings.norm.weight"),
    _copy("backbone", "encoder/final_norm/scale", "{b}final_norm.weight"),
    # The MLM head's first row is the one only ModernBertForMaskedLM has (the task classes' head.* too).
    _copy("mlm", "mlm_head/output_bias", "decoder.bias"),
    Row("mlm", "mlm_head/transform/kernel", "head.dense.weight", None, "kernel"),
    _copy("mlm", "mlm_head/transform/norm/scale", "head.norm.weight"),
)
_LAYER = (
    _copy("backbone", "attention_norm/scale", "{b}layers.{i}.attn_norm.weight"),
    Row("backbone", "attention/qkv", "{b}layers.{i}.attn.Wqkv.weight", None, "flat_in"),
    Row("backbone", "attention/out", "{b}layers.{i}.attn.Wo.weight", None, "heads_out"),
    _copy("backbone", "mlp_norm/scale", "{b}layers.{i}.mlp_norm.weight"),
    Row("backbone", "mlp/wi", "{b}layers.{i}.mlp.Wi.weight", None, "flat_in"),
    Row("backbone", "mlp/wo", "{b}layers.{i}.mlp.Wo.weight", None, "kernel"),
)


def _task_rows(head: str, classifier: str, ours: str) -> tuple[Row, ...]:
  """HF's head (the prediction head: our pooler or token transform) and its classifier."""
  return (Row("task", f"{head}/kernel", "head.dense.weight", None, "kernel"),
          _copy("task", f"{head}/norm/scale", "head.norm.weight"),
          *hf_only(dense_rows(ours, classifier, None), part="task"))


_SEQUENCE = _task_rows("pooler", "classifier", "head/classifier")

# --- Hugging Face config.json <-> ModernBertConfig --------------------------------------------------------

# Hugging Face switches bert_jax's ModernBERT does not have (it has no biases but the decoder's and the
# fine-tuning classifiers').
_FIXED = {"attention_bias": False, "mlp_bias": False, "norm_bias": False, "classifier_bias": False}
_ACTS_TO_OURS = {"gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh", "relu": "relu"}
_ACTS_TO_HF = {"gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "relu": "relu"}


def _layer_period(layer_types: list[str], source: str) -> int:
  """global_attn_every_n_layers from Hugging Face's per-layer list (layers 0, n, 2n, ... global)."""
  globals_ = [i for i, kind in enumerate(layer_types) if kind == "full_attention"]
  period = globals_[1] if len(globals_) > 1 else len(layer_types)
  if [i % period == 0 for i in range(len(layer_types))] != [kind == "full_attention" for kind in layer_types]:
    raise UserError(f"{source}: layer_types {layer_types} is not global attention every n layers from layer 0, "
                    "the only pattern bert_jax's ModernBERT has")
  return period


def _rope_theta(hf: hf_config_lib.HFConfig, kind: str, fallback: float, source: str) -> float:
  params = hf_config_lib.HFConfig(hf.dict("rope_parameters", {}).get(kind) or {},
                                  f"{hf.file}: rope_parameters.{kind}")
  if params.str("rope_type", "default") != "default":
    raise UserError(f"{source}: rope_type={params['rope_type']!r} for {kind}; only the default rotary embedding "
                    "converts")
  return params.float("rope_theta", fallback)


def read_hf_config(hf_config, heads, scan_layers: bool, source: str) -> ModernBertConfig:
  """The ModernBertConfig of a Hugging Face config.json, with `heads` switched on."""
  hf = hf_config_lib.of(hf_config, f"{source}/config.json")
  for key, value in _FIXED.items():
    if hf.bool(key, value) != value:
      raise UserError(f"{source}: {key}={hf[key]!r}; bert_jax's ModernBERT has no biases there")
  layers = hf.int("num_hidden_layers")
  every = hf.int("global_attn_every_n_layers", 3)
  types = hf.list("layer_types", None) or [
      "full_attention" if i % every == 0 else "sliding_attention" for i in range(layers)]
  acts = {key: hf.str(key, "gelu") for key in ("hidden_activation", "classifier_activation")}
  for key, act in acts.items():
    if act not in _ACTS_TO_OURS:
      raise UserError(f"{source}: {key}={act!r} is not one of {sorted(_ACTS_TO_OURS)}")
  config = ModernBertConfig(
      vocab_size=hf.int("vocab_size"), hidden_size=hf.int("hidden_size"), num_layers=layers,
      num_heads=hf.int("num_attention_heads"), intermediate_size=hf.int("intermediate_size"),
      max_position_embeddings=hf.int("max_position_embeddings", 8192), local_window=hf.int("local_attention", 128),
      global_every=_layer_period(types, source),
      global_rope_theta=_rope_theta(hf, "full_attention", hf.float("global_rope_theta", 160_000.0), source),
      local_rope_theta=_rope_theta(hf, "sliding_attention", hf.float("local_rope_theta", 10_000.0), source),
      norm_eps=hf.float("norm_eps", 1e-5), hidden_act=_ACTS_TO_OURS[acts["hidden_activation"]],
      head_act=_ACTS_TO_OURS[acts["classifier_activation"]],
      embedding_dropout=hf.float("embedding_dropout", 0.0), attention_dropout=hf.float("attention_dropout", 0.0),
      mlp_dropout=hf.float("mlp_dropout", 0.0), initializer_range=hf.float("initializer_range", 0.02),
      initializer_cutoff_factor=hf.float("initializer_cutoff_factor", 2.0) or 2.0,
      pad_token_id=hf.int("pad_token_id", 0), pooling=hf.str("classifier_pooling", "cls"), scan_layers=scan_layers)
  return with_heads(config, heads)


def write_hf_config(config: ModernBertConfig) -> dict:
  """config.json's keys (besides architectures and model_type) as Hugging Face's ModernBertConfig reads them."""
  types = ["full_attention" if config.is_global(i) else "sliding_attention" for i in range(config.num_layers)]
  return {**_FIXED, "decoder_bias": True,
          "vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
          "num_hidden_layers": config.num_layers, "num_attention_heads": config.num_heads,
          "intermediate_size": config.intermediate_size, "max_position_embeddings": config.max_position_embeddings,
          "local_attention": config.local_window, "global_attn_every_n_layers": config.global_every,
          "layer_types": types,
          "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": config.global_rope_theta},
                              "sliding_attention": {"rope_type": "default", "rope_theta": config.local_rope_theta}},
          "norm_eps": config.norm_eps, "hidden_activation": _ACTS_TO_HF[config.hidden_act],
          "classifier_activation": _ACTS_TO_HF[config.head_act], "classifier_pooling": config.pooling,
          "embedding_dropout": config.embedding_dropout, "attention_dropout": config.attention_dropout,
          "mlp_dropout": config.mlp_dropout, "initializer_range": config.initializer_range,
          "initializer_cutoff_factor": config.initializer_cutoff_factor, "pad_token_id": config.pad_token_id,
          "tie_word_embeddings": True}


def with_dropout(config: ModernBertConfig, hidden: float, attention: float) -> ModernBertConfig:
  """Fine-tuning's hidden dropout goes to the embeddings and the MLPs (ModernBERT has no single one)."""
  return config.replace(embedding_dropout=hidden, mlp_dropout=hidden, attention_dropout=attention)


FAMILY = families.register(families.Family(
    name="modernbert",
    packs=True, unpad_refusal=lambda config: "",
    config=ModernBertConfig,
    module=ModernBertModel,
    heads=HEADS,
    heads_of=heads_of,
    with_heads=with_heads,
    pretrained_heads=lambda present: ("mlm",),
    tokenizer="tokenizer_json",  # its releases' byte-level BPE (data_pipelines/hf_tokenizer.py)
    layout=families.Layout(global_rows=_GLOBAL, layer_rows=_LAYER,
                           parts=lambda config: frozenset({"backbone", *heads_of(config)}),
                           layer_slots=families.encoder_slots, relayout=families.encoder_relayout),
    hf=families.HFNames(
        model_type="modernbert", class_prefix="ModernBert", base_prefix="model.",
        architectures=(Architecture("ModernBertForMaskedLM", frozenset({"mlm"}), True),
                       Architecture("ModernBertModel", frozenset(), False)),
        read_config=read_hf_config, write_config=write_hf_config,
        tied={"decoder.weight": "{b}embeddings.tok_embeddings.weight"},
        task_rows={"classification": _SEQUENCE, "regression": _SEQUENCE,
                   "token": _task_rows("head/token_transform", "classifier", "head/classifier"),
                   "span": _task_rows("head/token_transform", "classifier", "head/span")},
        absent={"{b}layers.0.attn_norm.weight": 1.0},
        tokenizer_class="PreTrainedTokenizerFast", lower_case=False,
        token_ids={"cls_token_id": "[CLS]", "sep_token_id": "[SEP]", "bos_token_id": "[CLS]",
                   "eos_token_id": "[SEP]"}),
    token_transform=TokenTransform,
    with_dropout=with_dropout,
    backbone_params=modernbert.backbone_params,
    flops=families.Flops(modernbert.forward_flops, modernbert.attention_forward_flops),
))
