"""BERT (Devlin et al. 2019): the google-research/bert release and HF's Bert* classes.

BertModel with absolute positions, unshared layers and E == H; pretrained with MLM and NSP on the
pooled output.
"""
from __future__ import annotations

import functools

from bert_jax.models import families
from bert_jax.models.bert import BertModel
from bert_jax.models.config import ModelConfig
from bert_jax.models.families import Architecture, dense_rows
from bert_jax.models.records import bert_layout as bl

with_heads = bl.heads_switch("nsp")

FAMILY = families.register(families.Family(
    name="bert",
    packs=True,
    config=ModelConfig, adapters=True, unpad_refusal=bl.unpad_refusal,
    module=BertModel,
    heads=bl.HEADS,
    heads_of=bl.heads_of,
    with_heads=with_heads,
    pretrained_heads=lambda present: ("pooler", "mlm", "sentence"),
    tokenizer="wordpiece",
    layout=families.Layout(
        global_rows=tuple(bl.embedding_rows("{b}embeddings")
                          + dense_rows("pooler", "{b}pooler.dense", "{t}/pooler/dense", part="pooler")
                          + bl.mlm_rows("cls.predictions.", "cls/predictions/transform/", "transform.dense",
                                        "transform.LayerNorm", "cls.predictions.bias", "cls/predictions/output_bias")
                          + bl.sentence_rows("cls.seq_relationship")),
        layer_rows=bl.BERT_LAYER, adapter_rows=bl.BERT_ADAPTERS, parts=bl.parts, layer_slots=bl.layer_slots,
        relayout=bl.relayout),
    hf=families.HFNames(
        model_type="bert", class_prefix="Bert", base_prefix="bert.",
        architectures=(Architecture("BertForPreTraining", frozenset({"pooler", "mlm", "sentence"}), True),
                       Architecture("BertForMaskedLM", frozenset({"mlm"}), True),
                       Architecture("BertForNextSentencePrediction", frozenset({"pooler", "sentence"}), True),
                       Architecture("BertModel", frozenset({"pooler"}), False)),
        read_config=functools.partial(bl.read_hf_config, with_heads=with_heads),
        write_config=bl.write_hf_config,
        tied={"cls.predictions.decoder.weight": "{b}embeddings.word_embeddings.weight",
              "cls.predictions.decoder.bias": "cls.predictions.bias"},
        buffers=bl.HF_BUFFERS, tokenizer_class="BertTokenizer"),
    tf=families.TFNames(
        config_file="bert_config.json",
        detect=lambda tensors: "bert/encoder/layer_0/output/LayerNorm/gamma" in tensors,
        scopes=lambda tensors, part, source: (bl.BERT_SCOPES, []),
        read_config=functools.partial(bl.read_tf_config, with_heads=with_heads, config_file="bert_config.json",
                                      query_kernel="{t}/encoder/layer_0/attention/self/query/kernel"),
        write_scopes=lambda config: bl.BERT_SCOPES,
        write_config=bl.write_tf_config),
))
