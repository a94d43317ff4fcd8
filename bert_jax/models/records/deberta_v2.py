"""DeBERTa-v2/v3 (He et al.): microsoft's releases in Hugging Face's DebertaV2* classes (no original TF checkpoint).

Its own config and module (models/deberta.py): disentangled attention over LayerNorm'd, log-bucketed relative
embeddings, post-LN layers with biases. Dense layers are [in, out] here and [out, in] in Hugging Face ("kernel"
rows). The MLM head is DebertaV2ForMaskedLM's default (legacy) one, cls.predictions.*, its decoder tied to the word
embeddings. Sequence heads read Hugging Face's ContextPooler (`pooler.dense`, under head/summary); token and span
heads the last hidden states, as DebertaV2For{TokenClassification,QuestionAnswering} do. The RTD head of bert_jax's
pretraining has no Hugging Face class: it stays in bert_jax's checkpoints. Its tokenizer is the release's spm.model
(kind deberta_spm: data_pipelines/deberta_spm.py).
"""
from __future__ import annotations

from typing import Iterable

from bert_jax.errors import UserError
from bert_jax.models import deberta, families, hf_config as hf_config_lib
from bert_jax.models.deberta import ContextPooler, DebertaConfig, DebertaModel
from bert_jax.models.families import Architecture, Row, dense_rows, hf_only, norm_rows

HEADS = ("mlm", "rtd")


def heads_of(config: DebertaConfig) -> tuple[str, ...]:
  return tuple(h for h, on in (("mlm", config.mlm_head), ("rtd", config.rtd_head)) if on)


def with_heads(config: DebertaConfig, heads: Iterable[str]) -> DebertaConfig:
  heads = set(heads)
  return config.replace(mlm_head="mlm" in heads, rtd_head="rtd" in heads)


def parts(config: DebertaConfig) -> frozenset[str]:
  """The backbone, the heads on, and the embeddings the config has (absolute positions, token types, the relative
  embeddings' norm)."""
  extra = {name for name, on in (("positions", config.position_biased_input), ("types", config.type_vocab_size > 0),
                                 ("rel_norm", config.norm_rel_ebd == "layer_norm")) if on}
  return frozenset({"backbone", *heads_of(config), *extra})


def _copy(part: str, ours: str, hf: str) -> Row:
  return Row(part, ours, hf, None, "copy")


def _hf(rows, part: str | None = None) -> tuple[Row, ...]:
  return hf_only(rows, part)


_GLOBAL = (
    _copy("backbone", "embeddings/word_embeddings/embedding", "{b}embeddings.word_embeddings.weight"),
    _copy("positions", "embeddings/position_embeddings/embedding", "{b}embeddings.position_embeddings.weight"),
    _copy("types", "embeddings/token_type_embeddings/embedding", "{b}embeddings.token_type_embeddings.weight"),
    *_hf(norm_rows("embeddings/layer_norm", "{b}embeddings.LayerNorm", None)),
    _copy("backbone", "encoder/rel_embeddings", "{b}encoder.rel_embeddings.weight"),
    *_hf(norm_rows("encoder/rel_norm", "{b}encoder.LayerNorm", None), part="rel_norm"),
    # The MLM head's first row is the one only DebertaV2ForMaskedLM has.
    _copy("mlm", "mlm_head/output_bias", "cls.predictions.bias"),
    *_hf(dense_rows("mlm_head/transform", "cls.predictions.transform.dense", None, part="mlm")),
    *_hf(norm_rows("mlm_head/layer_norm", "cls.predictions.transform.LayerNorm", None, part="mlm")),
    Row("rtd", "rtd_head/dense/kernel", None, None, "kernel"),
    Row("rtd", "rtd_head/dense/bias", None, None, "copy"),
    Row("rtd", "rtd_head/prediction/kernel", None, None, "kernel"),
    Row("rtd", "rtd_head/prediction/bias", None, None, "copy"),
)
_L = "{b}encoder.layer.{i}"
_LAYER = _hf(
    dense_rows("attention/query", f"{_L}.attention.self.query_proj", None)
    + dense_rows("attention/key", f"{_L}.attention.self.key_proj", None)
    + dense_rows("attention/value", f"{_L}.attention.self.value_proj", None)
    + dense_rows("attention/output", f"{_L}.attention.output.dense", None)
    + norm_rows("attention/output_norm", f"{_L}.attention.output.LayerNorm", None)
    + dense_rows("intermediate", f"{_L}.intermediate.dense", None)
    + dense_rows("output", f"{_L}.output.dense", None)
    + norm_rows("output_norm", f"{_L}.output.LayerNorm", None))

# DebertaV2ForSequenceClassification: the ContextPooler's dense layer and the classifier.
_SEQUENCE = _hf(dense_rows("head/summary/dense", "pooler.dense", None) + dense_rows("head/classifier", "classifier", None),
                part="task")

# --- Hugging Face config.json <-> DebertaConfig ------------------------------------------------------------

_ACTS_TO_OURS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu",
                 "tanh": "tanh"}
_ACTS_TO_HF = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "tanh": "tanh"}


def _act(hf: hf_config_lib.HFConfig, key: str, source: str, allowed: tuple[str, ...]) -> str:
  act = hf.str(key, "gelu")
  if _ACTS_TO_OURS.get(act) not in allowed:
    raise UserError(f"{source}: {key}={act!r} is not one of {sorted(a for a in _ACTS_TO_OURS if _ACTS_TO_OURS[a] in allowed)}")
  return _ACTS_TO_OURS[act]


def read_hf_config(hf_config, heads, scan_layers: bool, source: str) -> DebertaConfig:
  """The DebertaConfig of a Hugging Face config.json (DebertaV2Config), with `heads` switched on."""
  hf = hf_config_lib.of(hf_config, f"{source}/config.json")
  refused = {"relative_attention": (True, "relative_attention=False (no disentangled attention)"),
             "share_att_key": (True, "share_att_key=False (separate position projections, DeBERTa-v1 style)"),
             "legacy": (True, "legacy=False (the newer lm_predictions MLM head)")}
  defaults = {"relative_attention": False, "share_att_key": False, "legacy": True}  # DebertaV2Config's, when absent
  for key, (wanted, what) in refused.items():
    if hf.bool(key, defaults[key]) != wanted:
      raise UserError(f"{source}: DeBERTa with {what} has no bert_jax counterpart")
  if hf.int("conv_kernel_size", 0) > 0:
    raise UserError(f"{source}: conv_kernel_size={hf['conv_kernel_size']} (DeBERTa-v2's convolution layer) has no "
                    "bert_jax counterpart")
  hidden = hf.int("hidden_size")
  if hf.int("embedding_size", hidden) != hidden or hf.int("pooler_hidden_size", hidden) != hidden:
    raise UserError(f"{source}: embedding_size and pooler_hidden_size must equal hidden_size={hidden}")
  types = hf.get("pos_att_type") or []
  types = [t.strip() for t in types.lower().split("|")] if isinstance(types, str) else list(types)
  config = DebertaConfig(
      vocab_size=hf.int("vocab_size"), hidden_size=hidden, num_layers=hf.int("num_hidden_layers"),
      num_heads=hf.int("num_attention_heads"), intermediate_size=hf.int("intermediate_size"),
      hidden_act=_act(hf, "hidden_act", source, ("gelu", "gelu_tanh", "relu")),
      hidden_dropout=hf.float("hidden_dropout_prob", 0.1),
      attention_dropout=hf.float("attention_probs_dropout_prob", 0.1),
      max_position_embeddings=hf.int("max_position_embeddings", 512), type_vocab_size=hf.int("type_vocab_size", 0),
      initializer_range=hf.float("initializer_range", 0.02), layer_norm_eps=hf.float("layer_norm_eps", 1e-7),
      pos_att_type="|".join(types), position_buckets=max(hf.int("position_buckets", -1), 0),
      max_relative_positions=hf.int("max_relative_positions", -1),
      norm_rel_ebd="layer_norm" if "layer_norm" in hf.str("norm_rel_ebd", "none").lower() else "none",
      position_biased_input=hf.bool("position_biased_input", True), pad_token_id=hf.int("pad_token_id", 0),
      pooler_act=_act(hf, "pooler_hidden_act", source, ("gelu", "gelu_tanh", "relu", "tanh")),
      scan_layers=scan_layers)
  return with_heads(config, heads)


def write_hf_config(config: DebertaConfig) -> dict:
  """config.json's keys (besides architectures and model_type) as Hugging Face's DebertaV2Config reads them."""
  return {"vocab_size": config.vocab_size, "hidden_size": config.hidden_size, "num_hidden_layers": config.num_layers,
          "num_attention_heads": config.num_heads, "intermediate_size": config.intermediate_size,
          "hidden_act": _ACTS_TO_HF[config.hidden_act], "hidden_dropout_prob": config.hidden_dropout,
          "attention_probs_dropout_prob": config.attention_dropout,
          "max_position_embeddings": config.max_position_embeddings, "type_vocab_size": config.type_vocab_size,
          "initializer_range": config.initializer_range, "layer_norm_eps": config.layer_norm_eps,
          "relative_attention": True, "pos_att_type": list(config.position_terms),
          "position_buckets": config.position_buckets or -1, "max_relative_positions": config.max_relative_positions,
          "norm_rel_ebd": config.norm_rel_ebd, "share_att_key": True,
          "position_biased_input": config.position_biased_input, "pad_token_id": config.pad_token_id,
          "pooler_hidden_size": config.hidden_size, "pooler_dropout": 0, "pooler_hidden_act": _ACTS_TO_HF[config.pooler_act],
          "legacy": True, "tie_word_embeddings": True}


def with_dropout(config: DebertaConfig, hidden: float, attention: float) -> DebertaConfig:
  return config.replace(hidden_dropout=hidden, attention_dropout=attention)


FAMILY = families.register(families.Family(
    name="deberta",
    packs=True,
    config=DebertaConfig,
    module=DebertaModel,
    heads=HEADS,
    heads_of=heads_of,
    with_heads=with_heads,
    pretrained_heads=lambda present: ("rtd",) if "rtd" in present else ("mlm",),
    tokenizer="deberta_spm",  # the releases' spm.model, [CLS] text [SEP] (data_pipelines/deberta_spm.py)
    layout=families.Layout(global_rows=_GLOBAL, layer_rows=_LAYER, parts=parts, layer_slots=families.encoder_slots,
                           relayout=families.encoder_relayout),
    hf=families.HFNames(
        model_type="deberta-v2", class_prefix="DebertaV2", base_prefix="deberta.",
        architectures=(Architecture("DebertaV2ForMaskedLM", frozenset({"mlm"}), True),
                       Architecture("DebertaV2Model", frozenset(), False)),
        read_config=read_hf_config, write_config=write_hf_config,
        tied={"cls.predictions.decoder.weight": "{b}embeddings.word_embeddings.weight",
              "cls.predictions.decoder.bias": "cls.predictions.bias"},
        task_rows={"classification": _SEQUENCE, "regression": _SEQUENCE},
        tokenizer_class="DebertaV2Tokenizer", lower_case=False),
    summary_heads=(),
    summary=ContextPooler,
    with_dropout=with_dropout,
    backbone_params=deberta.backbone_params,
    from_pretraining=deberta.from_pretraining,
))
