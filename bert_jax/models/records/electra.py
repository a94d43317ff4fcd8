"""ELECTRA (Clark et al. 2020): google-research/electra's release and HF's Electra* classes.

Each of ELECTRA's two networks is a BertModel (models/electra.py): the discriminator with the
replaced-token-detection head, the generator with an MLM head; both have factorised embeddings where
E != H. An original checkpoint holds both (`part` picks one; they share the discriminator's word and
position embeddings); a HF directory holds one.
"""
from __future__ import annotations

import functools

from bert_jax.errors import UserError
from bert_jax.models import families
from bert_jax.models.bert import BertModel
from bert_jax.models.config import ModelConfig
from bert_jax.models.families import Architecture, dense_rows
from bert_jax.models.records import bert_layout as bl

with_heads = bl.heads_switch(None)
_PARTS = ("discriminator", "generator")


def scopes(tensors, part: str | None, source: str) -> tuple[dict[str, str], list[str]]:
  """The discriminator's (scope electra/) or the generator's (generator/) names; by default the
  discriminator when the checkpoint holds it."""
  chosen = part or ("discriminator" if "electra/encoder/layer_0/output/LayerNorm/gamma" in tensors else "generator")
  if chosen not in _PARTS:
    raise UserError(f"electra_part={chosen!r} is not 'discriminator' or 'generator'")
  scope = "electra" if chosen == "discriminator" else "generator"
  own_embeddings = f"{scope}/embeddings/word_embeddings" in tensors
  notes = []
  if part is None and {"electra/", "generator/"} <= {n[:n.find("/") + 1] for n in tensors}:
    notes.append(f"{source}: holds a discriminator and a generator; loaded the {chosen} "
                 "(electra_part= chooses)")
  return {"t": scope, "e": scope if own_embeddings else "electra"}, notes


def own_heads(names: dict[str, str], heads: tuple[str, ...]) -> tuple[str, ...]:
  """One original ELECTRA checkpoint holds both models; each keeps only its own head."""
  other = "rtd" if names["t"] == "generator" else "mlm"
  return tuple(h for h in heads if h != other)


def write_scopes(config: ModelConfig) -> dict[str, str]:
  generator = config.mlm_head and not config.rtd_head
  return {"t": "generator" if generator else "electra", "e": "electra"}


FAMILY = families.register(families.Family(
    name="electra",
    packs=True,
    config=ModelConfig, adapters=True, unpad_refusal=bl.unpad_refusal,
    module=BertModel,
    heads=bl.HEADS,
    heads_of=bl.heads_of,
    with_heads=with_heads,
    pretrained_heads=lambda present: ("mlm",) if "mlm" in present else ("rtd",),
    tokenizer="wordpiece",
    layout=families.Layout(
        global_rows=tuple(bl.embedding_rows("{b}embeddings")
                          + dense_rows("embeddings/projection", "{b}embeddings_project", "{t}/embeddings_project",
                                       part="projection")
                          + bl.mlm_rows("generator_predictions.", "generator_predictions/", "dense", "LayerNorm",
                                        "generator_lm_head.bias", "generator_predictions/output_bias")
                          + dense_rows("rtd_head/dense", "discriminator_predictions.dense",
                                       "discriminator_predictions/dense", part="rtd")
                          + dense_rows("rtd_head/prediction", "discriminator_predictions.dense_prediction",
                                       "discriminator_predictions/dense_1", part="rtd")),
        layer_rows=bl.BERT_LAYER, adapter_rows=bl.BERT_ADAPTERS, parts=bl.parts, layer_slots=bl.layer_slots,
        relayout=bl.relayout),
    hf=families.HFNames(
        model_type="electra", class_prefix="Electra", base_prefix="electra.",
        architectures=(Architecture("ElectraForPreTraining", frozenset({"rtd"}), True),
                       Architecture("ElectraForMaskedLM", frozenset({"mlm"}), True),
                       Architecture("ElectraModel", frozenset(), False)),
        read_config=functools.partial(bl.read_hf_config, with_heads=with_heads, factorised=True,
                                      gelu_mlm="electra"),
        write_config=functools.partial(bl.write_hf_config, factorised=True),
        tied={"generator_lm_head.weight": "{b}embeddings.word_embeddings.weight"},
        buffers=bl.HF_BUFFERS,
        no_task_export=dict.fromkeys(
            ("classification", "regression"),
            "applies GELU to its [CLS] dense layer where bert_jax's pooler applies tanh: this head has no exact "
            "Hugging Face equivalent; use bert-jax predict"),
        tokenizer_class="ElectraTokenizer"),
    tf=families.TFNames(
        config_file="bert_config.json",
        detect=lambda tensors: any(n.startswith(("electra/encoder/", "generator/encoder/")) for n in tensors),
        scopes=scopes, own_heads=own_heads,
        read_config=functools.partial(bl.read_tf_config, with_heads=with_heads, config_file="bert_config.json",
                                      query_kernel="{t}/encoder/layer_0/attention/self/query/kernel"),
        write_scopes=write_scopes,
        write_config=functools.partial(bl.write_tf_config, factorised=True)),
))
