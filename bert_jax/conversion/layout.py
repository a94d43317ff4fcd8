"""The mapping table: where each bert_jax parameter lives in Hugging Face and original TF checkpoints.

This is the only place that knows foreign names. A row is (head, bert_jax path, HF name, TF name,
kind). Paths inside a layer are relative to the layer; `{i}` is the layer index, `{b}` the HF base
prefix ("bert.", "" for a bare model saved without it), `{t}` the TF scope of the encoder and `{e}` the
TF scope of the embeddings (they differ for ELECTRA's generator, which shares the discriminator's).

Kinds say how the bert_jax array relates to the *canonical* 2-D/1-D matrix stored abroad: `copy`
(same shape), `kernel` ([in, out]), `heads_in` ([H, N, D] <-> [H, N*D]), `heads_bias` ([N, D] <->
[N*D]), `heads_out` ([N, D, H] <-> [N*D, H]). HF stores Linear weights as [out, in]; TF stores
kernels as [in, out] except the NSP/SOP `output_weights`, which are [out, in].
"""
from __future__ import annotations

import dataclasses

FAMILIES = ("bert", "roberta", "albert", "electra")
HEADS = ("pooler", "mlm", "sentence", "rtd")


@dataclasses.dataclass(frozen=True)
class Row:
  head: str  # "backbone", "projection" or one of HEADS
  ours: str
  hf: str
  tf: str | None
  kind: str


def _norm(ours: str, hf: str, tf: str, head: str = "backbone") -> list[Row]:
  return [Row(head, f"{ours}/scale", f"{hf}.weight", f"{tf}/gamma", "copy"),
          Row(head, f"{ours}/bias", f"{hf}.bias", f"{tf}/beta", "copy")]


def _dense(ours: str, hf: str, tf: str, head: str = "backbone", kind: str = "kernel",
           bias_kind: str = "copy", hf_weight: str = ".weight", tf_kernel: str = "/kernel") -> list[Row]:
  return [Row(head, f"{ours}/kernel", f"{hf}{hf_weight}", f"{tf}{tf_kernel}", kind),
          Row(head, f"{ours}/bias", f"{hf}.bias", f"{tf}/bias", bias_kind)]


def _attention(hf_q: str, hf_out: str, tf_q: str, tf_out: str) -> list[Row]:
  rows = []
  for name in ("query", "key", "value"):
    rows += _dense(f"attention/{name}", hf_q.replace("{name}", name), tf_q.replace("{name}", name),
                   kind="heads_in", bias_kind="heads_bias")
  return rows + _dense("attention/out", hf_out, tf_out, kind="heads_out")


def _embeddings(hf: str) -> list[Row]:
  rows = [Row("backbone", f"embeddings/{name}/embedding", f"{hf}.{name}.weight", f"{{e}}/embeddings/{name}",
              "copy") for name in ("word_embeddings", "position_embeddings", "token_type_embeddings")]
  return rows + _norm("embeddings/layer_norm", f"{hf}.LayerNorm", "{e}/embeddings/LayerNorm")


# BERT, RoBERTa and ELECTRA share the encoder layout; ALBERT's one shared layer is named differently.
_BERT_LAYER = (
    _attention("{b}encoder.layer.{i}.attention.self.{name}", "{b}encoder.layer.{i}.attention.output.dense",
               "{t}/encoder/layer_{i}/attention/self/{name}", "{t}/encoder/layer_{i}/attention/output/dense")
    + _norm("attention_layer_norm", "{b}encoder.layer.{i}.attention.output.LayerNorm",
            "{t}/encoder/layer_{i}/attention/output/LayerNorm")
    + _dense("feed_forward/intermediate", "{b}encoder.layer.{i}.intermediate.dense",
             "{t}/encoder/layer_{i}/intermediate/dense")
    + _dense("feed_forward/output", "{b}encoder.layer.{i}.output.dense", "{t}/encoder/layer_{i}/output/dense")
    + _norm("output_layer_norm", "{b}encoder.layer.{i}.output.LayerNorm", "{t}/encoder/layer_{i}/output/LayerNorm"))

_ALBERT_HF = "{b}encoder.albert_layer_groups.0.albert_layers.0"
_ALBERT_TF = "{t}/encoder/transformer/group_0/inner_group_0"
_ALBERT_LAYER = (
    _attention(f"{_ALBERT_HF}.attention.{{name}}", f"{_ALBERT_HF}.attention.dense",
               f"{_ALBERT_TF}/attention_1/self/{{name}}", f"{_ALBERT_TF}/attention_1/output/dense")
    + _norm("attention_layer_norm", f"{_ALBERT_HF}.attention.LayerNorm", f"{_ALBERT_TF}/LayerNorm")
    + _dense("feed_forward/intermediate", f"{_ALBERT_HF}.ffn", f"{_ALBERT_TF}/ffn_1/intermediate/dense")
    + _dense("feed_forward/output", f"{_ALBERT_HF}.ffn_output", f"{_ALBERT_TF}/ffn_1/intermediate/output/dense")
    + _norm("output_layer_norm", f"{_ALBERT_HF}.full_layer_layer_norm", f"{_ALBERT_TF}/LayerNorm_1"))


def _bert_mlm(hf: str, tf: str, hf_transform: str, hf_norm: str, hf_bias: str, tf_bias: str) -> list[Row]:
  return (_dense("mlm_head/transform", f"{hf}{hf_transform}", f"{tf}dense", head="mlm")
          + _norm("mlm_head/layer_norm", f"{hf}{hf_norm}", f"{tf}LayerNorm", head="mlm")
          + [Row("mlm", "mlm_head/output_bias", hf_bias, tf_bias, "copy")])


_SENTENCE_TF = dict(tf_kernel="/output_weights")

GLOBAL_ROWS = {
    "bert": (_embeddings("{b}embeddings")
             + _dense("pooler", "{b}pooler.dense", "{t}/pooler/dense", head="pooler")
             + _bert_mlm("cls.predictions.", "cls/predictions/transform/", "transform.dense",
                         "transform.LayerNorm", "cls.predictions.bias", "cls/predictions/output_bias")
             + [Row("sentence", "sentence_classifier/kernel", "cls.seq_relationship.weight",
                    "cls/seq_relationship/output_weights", "kernel"),
                Row("sentence", "sentence_classifier/bias", "cls.seq_relationship.bias",
                    "cls/seq_relationship/output_bias", "copy")]),
    "roberta": (_embeddings("{b}embeddings")
                + [Row(r.head, r.ours, r.hf, None, r.kind)
                   for r in _dense("pooler", "{b}pooler.dense", "", head="pooler")
                   + _bert_mlm("lm_head.", "", "dense", "layer_norm", "lm_head.bias", "")]),
    "albert": (_embeddings("{b}embeddings")
               + _dense("embeddings/projection", "{b}encoder.embedding_hidden_mapping_in",
                        "{t}/encoder/embedding_hidden_mapping_in", head="projection")
               + _dense("pooler", "{b}pooler", "{t}/pooler/dense", head="pooler")
               + _bert_mlm("predictions.", "cls/predictions/transform/", "dense", "LayerNorm",
                           "predictions.bias", "cls/predictions/output_bias")
               + [Row("sentence", "sentence_classifier/kernel", "sop_classifier.classifier.weight",
                      "cls/seq_relationship/output_weights", "kernel"),
                  Row("sentence", "sentence_classifier/bias", "sop_classifier.classifier.bias",
                      "cls/seq_relationship/output_bias", "copy")]),
    "electra": (_embeddings("{b}embeddings")
                + _dense("embeddings/projection", "{b}embeddings_project", "{t}/embeddings_project",
                         head="projection")
                + _bert_mlm("generator_predictions.", "generator_predictions/", "dense", "LayerNorm",
                            "generator_lm_head.bias", "generator_predictions/output_bias")
                + _dense("rtd_head/dense", "discriminator_predictions.dense", "discriminator_predictions/dense",
                         head="rtd")
                + _dense("rtd_head/prediction", "discriminator_predictions.dense_prediction",
                         "discriminator_predictions/dense_1", head="rtd")),
}

LAYER_ROWS = {"bert": _BERT_LAYER, "roberta": _BERT_LAYER, "albert": _ALBERT_LAYER, "electra": _BERT_LAYER}

# Houlsby adapters (fine-tuning's train.mode=adapters) in each layer. Hugging Face names only: those of the
# modeling code an adapter export ships (conversion/hf_adapter_modeling.py). Original TF BERT has no place
# for them; ALBERT's shared layer has no adapter export.
_BERT_ADAPTERS = [Row("adapters", r.ours, r.hf, None, r.kind)
                  for block, hf in (("attention_adapter", "attention.output"), ("output_adapter", "output"))
                  for part in ("down", "up")
                  for r in _dense(f"{block}/{part}", f"{{b}}encoder.layer.{{i}}.{hf}.adapter.{part}", "")]
ADAPTER_ROWS = {"bert": _BERT_ADAPTERS, "roberta": _BERT_ADAPTERS, "electra": _BERT_ADAPTERS}

# Fine-tuning heads (bert_jax/finetune/heads.py, parameters under head/) in HF's <Family>For<Task> classes.
# Classification and regression read the pooled [CLS] vector: BERT and ALBERT keep the pooler in the base
# model; RoBERTa's classification head holds that dense + tanh itself (classifier.dense), so our pooler
# goes there. ELECTRA's classification head applies GELU where our pooler applies tanh: no rows, no export.
TASK_CLASSES = {"classification": "ForSequenceClassification", "regression": "ForSequenceClassification",
                "token": "ForTokenClassification", "span": "ForQuestionAnswering"}


def _hf_only(rows: list[Row]) -> list[Row]:
  return [Row("task", r.ours, r.hf, None, r.kind) for r in rows]


_CLASSIFIER = _hf_only(_dense("head/classifier", "classifier", ""))
_SPAN = _hf_only(_dense("head/span", "qa_outputs", ""))
_ROBERTA_CLASSIFIER = _hf_only(_dense("pooler", "classifier.dense", "")
                               + _dense("head/classifier", "classifier.out_proj", ""))
TASK_ROWS = {
    "bert": {"classification": _CLASSIFIER, "regression": _CLASSIFIER, "token": _CLASSIFIER, "span": _SPAN},
    "albert": {"classification": _CLASSIFIER, "regression": _CLASSIFIER, "token": _CLASSIFIER, "span": _SPAN},
    "roberta": {"classification": _ROBERTA_CLASSIFIER, "regression": _ROBERTA_CLASSIFIER,
                "token": _CLASSIFIER, "span": _SPAN},
    "electra": {"token": _CLASSIFIER, "span": _SPAN},
}

# HF names that repeat another tensor (the MLM decoder tied to the word embeddings) or hold buffers.
HF_TIED = {
    "bert": {"cls.predictions.decoder.weight": "{b}embeddings.word_embeddings.weight",
             "cls.predictions.decoder.bias": "cls.predictions.bias"},
    "roberta": {"lm_head.decoder.weight": "{b}embeddings.word_embeddings.weight",
                "lm_head.decoder.bias": "lm_head.bias"},
    "albert": {"predictions.decoder.weight": "{b}embeddings.word_embeddings.weight",
               "predictions.decoder.bias": "predictions.bias"},
    "electra": {"generator_lm_head.weight": "{b}embeddings.word_embeddings.weight"},
}
HF_BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")

# The prefix of the base model in HF state dicts, and the TF scope of the encoder.
HF_BASE = {"bert": "bert.", "roberta": "roberta.", "albert": "albert.", "electra": "electra."}
TF_SCOPE = {"bert": "bert", "albert": "bert", "electra": "electra"}
