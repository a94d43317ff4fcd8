"""ALBERT (Lan et al. 2020): google-research/albert's release and HF's Albert* classes.

BertModel with every layer sharing one set of weights (stored once abroad), factorised embeddings
(E -> H, a projection HF and TF always hold: the identity when E == H), pretrained with MLM and SOP;
a SentencePiece vocabulary.
"""
from __future__ import annotations

import functools

import numpy as np

from bert_jax.errors import UserError
from bert_jax.models import families, hf_config as hf_config_lib
from bert_jax.models.bert import BertModel
from bert_jax.models.config import ModelConfig
from bert_jax.models.families import Architecture, Row, dense_rows, norm_rows
from bert_jax.models.records import bert_layout as bl

with_heads = bl.heads_switch("sop")

_HF = "{b}encoder.albert_layer_groups.0.albert_layers.0"
_TF = "{t}/encoder/transformer/group_0/inner_group_0"
_LAYER = tuple(
    bl.attention_rows(f"{_HF}.attention.{{name}}", f"{_HF}.attention.dense", f"{_TF}/attention_1/self/{{name}}",
                      f"{_TF}/attention_1/output/dense")
    + norm_rows("attention_layer_norm", f"{_HF}.attention.LayerNorm", f"{_TF}/LayerNorm")
    + dense_rows("feed_forward/intermediate", f"{_HF}.ffn", f"{_TF}/ffn_1/intermediate/dense")
    + dense_rows("feed_forward/output", f"{_HF}.ffn_output", f"{_TF}/ffn_1/intermediate/output/dense")
    + norm_rows("output_layer_norm", f"{_HF}.full_layer_layer_norm", f"{_TF}/LayerNorm_1"))

_GLOBAL = tuple(bl.embedding_rows("{b}embeddings")
                + dense_rows("embeddings/projection", "{b}encoder.embedding_hidden_mapping_in",
                             "{t}/encoder/embedding_hidden_mapping_in", part="projection")
                + dense_rows("pooler", "{b}pooler", "{t}/pooler/dense", part="pooler")
                + bl.mlm_rows("predictions.", "cls/predictions/transform/", "dense", "LayerNorm",
                              "predictions.bias", "cls/predictions/output_bias")
                + bl.sentence_rows("sop_classifier.classifier"))


def identity_projection(config: ModelConfig) -> list[tuple[Row, np.ndarray]]:
  """ALBERT always projects E -> H; bert_jax only when E != H, where ALBERT's projection is the identity."""
  if config.embed_dim != config.hidden_size:
    return []
  eye, zeros = np.eye(config.hidden_size, dtype=np.float32), np.zeros(config.hidden_size, np.float32)
  return [(row, eye if row.ours.endswith("kernel") else zeros) for row in _GLOBAL if row.part == "projection"]


def read_hf_config(hf_config, heads, scan_layers: bool, source: str) -> ModelConfig:
  hf = hf_config_lib.of(hf_config, f"{source}/config.json")
  if (hf.int("num_hidden_groups", 1), hf.int("inner_group_num", 1)) != (1, 1):
    raise UserError(f"{source}: ALBERT with num_hidden_groups/inner_group_num != 1 has no bert_jax layout")
  return bl.read_hf_config(hf, heads, scan_layers, source, with_heads=with_heads, factorised=True,
                           defaults={"hidden_act": "gelu_new", "hidden_dropout_prob": 0.0,
                                     "attention_probs_dropout_prob": 0.0}, share_layers="all")


FAMILY = families.register(families.Family(
    name="albert",
    packs=True,
    config=ModelConfig, adapters=True, unpad_refusal=bl.unpad_refusal,
    module=BertModel,
    heads=bl.HEADS,
    heads_of=bl.heads_of,
    with_heads=with_heads,
    pretrained_heads=lambda present: ("pooler", "mlm", "sentence"),
    tokenizer="sentencepiece",
    layout=families.Layout(global_rows=_GLOBAL, layer_rows=_LAYER, parts=bl.parts,
                           layer_slots=bl.one_shared_layer, constants=identity_projection, relayout=bl.relayout),
    hf=families.HFNames(
        model_type="albert", class_prefix="Albert", base_prefix="albert.",
        architectures=(Architecture("AlbertForPreTraining", frozenset({"pooler", "mlm", "sentence"}), True),
                       Architecture("AlbertForMaskedLM", frozenset({"mlm"}), True),
                       Architecture("AlbertModel", frozenset({"pooler"}), False)),
        read_config=read_hf_config,
        write_config=functools.partial(bl.write_hf_config, factorised=True,
                                       num_hidden_groups=1, inner_group_num=1),
        tied={"predictions.decoder.weight": "{b}embeddings.word_embeddings.weight",
              "predictions.decoder.bias": "predictions.bias"},
        buffers=bl.HF_BUFFERS, tokenizer_class="AlbertTokenizer"),
    tf=families.TFNames(
        config_file="albert_config.json",
        detect=lambda tensors: "bert/encoder/transformer/group_0/inner_group_0/LayerNorm/gamma" in tensors,
        scopes=lambda tensors, part, source: (bl.BERT_SCOPES, []),
        read_config=functools.partial(bl.read_tf_config, with_heads=with_heads, config_file="albert_config.json",
                                      query_kernel=f"{_TF}/attention_1/self/query/kernel", layered=False,
                                      share_layers="all"),
        write_scopes=lambda config: bl.BERT_SCOPES,
        write_config=functools.partial(bl.write_tf_config, factorised=True, num_hidden_groups=1, inner_group_num=1,
                                       net_structure_type=0, gap_size=0, num_memory_blocks=0, down_scale_factor=1)),
))
