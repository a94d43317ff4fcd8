"""RoBERTa (Liu et al. 2019): fairseq's release, in HF's Roberta* classes (no original TF checkpoint).

BertModel with RoBERTa's positions (counted from pad_token_id + 1), no NSP and no pooler in pretraining;
its byte-level BPE tokenizer (vocab.json + merges.txt).
"""
from __future__ import annotations

import functools

from bert_jax.models import families
from bert_jax.models.bert import BertModel
from bert_jax.models.config import ModelConfig
from bert_jax.models.families import Architecture, dense_rows, hf_only
from bert_jax.models.records import bert_layout as bl
from bert_jax.errors import UserError

with_heads = bl.heads_switch(None)


def write_hf_config(config: ModelConfig) -> dict:
  if config.mlm_head and config.hidden_act != "gelu":
    raise UserError(f"RoBERTa's HF MLM head hard-codes GELU; this model uses {config.hidden_act}")
  return bl.write_hf_config(config, bos_token_id=0, eos_token_id=2)


FAMILY = families.register(families.Family(
    name="roberta",
    packs=True,
    config=ModelConfig, adapters=True, unpad_refusal=bl.unpad_refusal,
    module=BertModel,
    heads=bl.HEADS,
    heads_of=bl.heads_of,
    with_heads=with_heads,
    pretrained_heads=lambda present: ("mlm",),
    tokenizer="bpe",
    layout=families.Layout(
        global_rows=tuple(bl.embedding_rows("{b}embeddings")
                          + list(hf_only(dense_rows("pooler", "{b}pooler.dense", None, part="pooler")
                                         + bl.mlm_rows("lm_head.", None, "dense", "layer_norm", "lm_head.bias",
                                                       None)))),
        layer_rows=bl.BERT_LAYER, adapter_rows=bl.BERT_ADAPTERS, parts=bl.parts, layer_slots=bl.layer_slots,
        relayout=bl.relayout),
    hf=families.HFNames(
        model_type="roberta", class_prefix="Roberta", base_prefix="roberta.",
        architectures=(Architecture("RobertaForMaskedLM", frozenset({"mlm"}), True),
                       Architecture("RobertaModel", frozenset({"pooler"}), False)),
        read_config=functools.partial(bl.read_hf_config, with_heads=with_heads, defaults={"pad_token_id": 1},
                                      gelu_mlm="roberta", position_style="roberta"),
        write_config=write_hf_config,
        tied={"lm_head.decoder.weight": "{b}embeddings.word_embeddings.weight",
              "lm_head.decoder.bias": "lm_head.bias"},
        buffers=bl.HF_BUFFERS,
        task_rows={"classification": bl.ROBERTA_CLASSIFIER, "regression": bl.ROBERTA_CLASSIFIER},
        tokenizer_class="RobertaTokenizer",
        tokenizer_settings=dict(bos_token="<s>", eos_token="</s>", unk_token="<unk>", sep_token="</s>",
                                cls_token="<s>", pad_token="<pad>", mask_token="<mask>", add_prefix_space=False),
        lower_case=False),
))
