"""MobileBERT (Sun et al. 2020): Hugging Face's MobileBert* classes (models/mobilebert.py is the network).

Hugging Face names only: the original release is a TF2/TFLite export with its own layout. The layer's
rows depend on the config (how many stacked feed-forward networks, which bottlenecks); NoNorm's scale
and bias are stored as a LayerNorm's weight and bias. The MLM decoder is the tied word embeddings plus
`cls.predictions.dense.weight` ([H - E, V], stored as it is).
"""
from __future__ import annotations

from typing import Iterable

from bert_jax.errors import UserError
from bert_jax.models import families, hf_config as hf_config_lib
from bert_jax.models.families import Architecture, Row, dense_rows, hf_only, norm_rows
from bert_jax.models import mobilebert
from bert_jax.models.mobilebert import MobileBertConfig, MobileBertModel
from bert_jax.models.records import bert_layout as bl

HEADS = ("pooler", "mlm", "sentence")


def heads_of(config: MobileBertConfig) -> tuple[str, ...]:
  on = {"pooler": config.use_pooler, "mlm": config.mlm_head, "sentence": config.sentence_head != "none"}
  return tuple(h for h in HEADS if on[h])


def with_heads(config: MobileBertConfig, heads: Iterable[str]) -> MobileBertConfig:
  """`config` with exactly these heads on; NSP brings the pooler it reads."""
  heads = set(heads)
  return config.replace(use_pooler="pooler" in heads or "sentence" in heads, mlm_head="mlm" in heads,
                        sentence_head="nsp" if "sentence" in heads else "none")


def _projects(config: MobileBertConfig) -> bool:
  return config.trigram_input or config.embedding_size != config.hidden_size


def parts(config: MobileBertConfig) -> frozenset[str]:
  """The row groups the model has: the pooler only with its dense layer (classifier_activation)."""
  heads = set(heads_of(config))
  if not config.classifier_activation:
    heads.discard("pooler")
  return frozenset({"backbone", *heads} | ({"projection"} if _projects(config) else set()))


def _rows(ours: str, hf: str, norm: bool = False, part: str = "backbone") -> list[Row]:
  return list(hf_only(norm_rows(ours, hf, None, part) if norm else dense_rows(ours, hf, None, part)))


_GLOBAL = tuple(
    [Row("backbone", f"embeddings/{name}/embedding", f"{{b}}embeddings.{name}.weight", None, "copy")
     for name in ("word_embeddings", "position_embeddings", "token_type_embeddings")]
    + _rows("embeddings/transformation", "{b}embeddings.embedding_transformation", part="projection")
    + _rows("embeddings/norm", "{b}embeddings.LayerNorm", norm=True)
    + _rows("pooler", "{b}pooler.dense", part="pooler")
    + _rows("mlm_head/transform", "cls.predictions.transform.dense", part="mlm")
    + _rows("mlm_head/layer_norm", "cls.predictions.transform.LayerNorm", norm=True, part="mlm")
    + [Row("mlm", "mlm_head/extra_decoder", "cls.predictions.dense.weight", None, "copy"),
       Row("mlm", "mlm_head/output_bias", "cls.predictions.bias", None, "copy")]
    + _rows("sentence_classifier", "cls.seq_relationship", part="sentence"))


def layer_rows(config: MobileBertConfig) -> tuple[Row, ...]:
  """One layer's rows: its bottlenecks (as the config has them) and its stacked feed-forward networks."""
  at = "{b}encoder.layer.{i}."
  rows = []
  if config.use_bottleneck:
    rows += _rows("input_bottleneck/dense", at + "bottleneck.input.dense")
    rows += _rows("input_bottleneck/norm", at + "bottleneck.input.LayerNorm", norm=True)
    if config.key_query_shared_bottleneck and not config.use_bottleneck_attention:
      rows += _rows("attention_bottleneck/dense", at + "bottleneck.attention.dense")
      rows += _rows("attention_bottleneck/norm", at + "bottleneck.attention.LayerNorm", norm=True)
  for name in ("query", "key", "value"):
    rows += _rows(f"attention/{name}", f"{at}attention.self.{name}")
  rows += _rows("attention_output", at + "attention.output.dense")
  rows += _rows("attention_norm", at + "attention.output.LayerNorm", norm=True)
  for j in range(config.num_feedforward_networks - 1):
    rows += _rows(f"ffn_{j}/intermediate", f"{at}ffn.{j}.intermediate.dense")
    rows += _rows(f"ffn_{j}/output", f"{at}ffn.{j}.output.dense")
    rows += _rows(f"ffn_{j}/norm", f"{at}ffn.{j}.output.LayerNorm", norm=True)
  rows += _rows("intermediate", at + "intermediate.dense") + _rows("output", at + "output.dense")
  rows += _rows("output_norm", at + "output.LayerNorm", norm=True)
  if config.use_bottleneck:
    rows += _rows("output_bottleneck", at + "output.bottleneck.dense")
    rows += _rows("output_bottleneck_norm", at + "output.bottleneck.LayerNorm", norm=True)
  return tuple(rows)


# config.json keys that are MobileBertConfig fields under the same name.
_SAME = ("vocab_size", "hidden_size", "intermediate_size", "embedding_size", "intra_bottleneck_size",
         "num_feedforward_networks", "use_bottleneck", "use_bottleneck_attention", "key_query_shared_bottleneck",
         "trigram_input", "normalization_type", "max_position_embeddings", "type_vocab_size", "layer_norm_eps",
         "initializer_range", "classifier_activation")
_RENAMED = {"num_hidden_layers": "num_layers", "num_attention_heads": "num_heads",
            "hidden_dropout_prob": "hidden_dropout", "attention_probs_dropout_prob": "attention_dropout"}
_ACTS_TO_HF = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu"}


def read_hf_config(hf_config, heads: tuple[str, ...], scan_layers: bool, source: str) -> MobileBertConfig:
  """The config of a MobileBERT config.json (transformers' MobileBertConfig defaults where a key is absent),
  each field of the type of MobileBertConfig's default."""
  hf = hf_config_lib.of(hf_config, f"{source}/config.json")
  fields = {**{key: key for key in _SAME}, **_RENAMED}
  values = {ours: hf.typed(key, type(getattr(MobileBertConfig, ours)))
            for key, ours in fields.items() if hf.get(key) is not None}
  if "hidden_act" in hf:
    values["hidden_act"] = bl.hf_activation(hf.str("hidden_act"), source)
  values.update(pad_token_id=hf.int("pad_token_id", 0), scan_layers=scan_layers)
  return with_heads(MobileBertConfig(**values), heads)


def write_hf_config(config: MobileBertConfig) -> dict:
  if (config.use_bottleneck and not (config.key_query_shared_bottleneck or config.use_bottleneck_attention)
      and config.intra_bottleneck_size != config.hidden_size):
    # transformers builds query and key intra_bottleneck_size wide on the input, but feeds them the
    # hidden_size-wide block input there (IB-BERT's attention, configs/mobilebert.py:ib_bert).
    raise UserError("a MobileBERT whose query and key read the block input through an inverted bottleneck "
                    f"(intra_bottleneck_size {config.intra_bottleneck_size} != hidden_size {config.hidden_size}, "
                    "key_query_shared_bottleneck=False: IB-BERT) has no Hugging Face layout; keep it in "
                    "bert_jax's format")
  d = {key: getattr(config, key) for key in _SAME}
  d.update({key: getattr(config, ours) for key, ours in _RENAMED.items()})
  return {**d, "hidden_act": _ACTS_TO_HF[config.hidden_act], "pad_token_id": config.pad_token_id,
          "tie_word_embeddings": True, "dtype": "float32"}


FAMILY = families.register(families.Family(
    name="mobilebert",
    packs=True,
    config=MobileBertConfig,
    module=MobileBertModel,
    heads=HEADS,
    heads_of=heads_of,
    with_heads=with_heads,
    pretrained_heads=lambda present: HEADS,
    tokenizer="wordpiece",
    layout=families.Layout(global_rows=_GLOBAL, layer_rows=layer_rows, parts=parts, layer_slots=bl.layer_slots,
                           relayout=bl.relayout),
    hf=families.HFNames(
        model_type="mobilebert", class_prefix="MobileBert", base_prefix="mobilebert.",
        architectures=(Architecture("MobileBertForPreTraining", frozenset(HEADS), True),
                       Architecture("MobileBertForMaskedLM", frozenset({"mlm"}), True),
                       Architecture("MobileBertModel", frozenset({"pooler"}), False)),
        read_config=read_hf_config, write_config=write_hf_config,
        tied={"cls.predictions.decoder.weight": "{b}embeddings.word_embeddings.weight",
              "cls.predictions.decoder.bias": "cls.predictions.bias"},
        buffers=bl.HF_BUFFERS, tokenizer_class="MobileBertTokenizer"),
    backbone_params=mobilebert.backbone_params,
))
