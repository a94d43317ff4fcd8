"""What BertModel's four families (BERT, RoBERTa, ALBERT, ELECTRA) share: BertModel's parameter names
abroad, its pretraining heads, and its config translated to and from Hugging Face's and the original TF
code's. Each family's record (bert.py, roberta.py, albert.py, electra.py) assembles these pieces with
its own names; a family that only renames them (another RoBERTa-layout model) can too.

TF name templates use `{t}` for the encoder's scope and `{e}` for the embeddings' (they differ for
ELECTRA's generator, which shares the discriminator's embeddings).
"""
from __future__ import annotations

import re
from typing import Any, Callable, Iterable, Mapping

from bert_jax.errors import UserError
from bert_jax.models import families, hf_config as hf_config_lib
from bert_jax.models.config import ModelConfig
from bert_jax.models.families import LayerSlot, Row, dense_rows, hf_only, norm_rows

HEADS = ("pooler", "mlm", "sentence", "rtd")


def heads_of(config: ModelConfig) -> tuple[str, ...]:
  on = {"pooler": config.use_pooler, "mlm": config.mlm_head, "sentence": config.sentence_head != "none",
        "rtd": config.rtd_head}
  return tuple(h for h in HEADS if on[h])


def heads_switch(sentence: str | None) -> Callable[[ModelConfig, Iterable[str]], ModelConfig]:
  """with_heads for a family whose sentence head is `sentence` ("nsp", "sop"; None: it has none).
  A sentence head brings the pooler it reads."""
  def with_heads(config: ModelConfig, heads: Iterable[str]) -> ModelConfig:
    heads = set(heads)
    has_sentence = "sentence" in heads and sentence is not None
    return config.replace(use_pooler="pooler" in heads or has_sentence, mlm_head="mlm" in heads,
                          sentence_head=sentence if has_sentence else "none", rtd_head="rtd" in heads)
  return with_heads


def unpad_refusal(config: ModelConfig) -> str:
  """BertModel restores packed rows (models/unpad.py) unless ERNIE-THU's entity layers read its padded tokens."""
  return "ERNIE-THU's entity layers read each padded token" if config.entity_layers else ""


def parts(config: ModelConfig) -> frozenset[str]:
  return frozenset({"backbone", *heads_of(config)}
                   | ({"projection"} if config.embed_dim != config.hidden_size else set())
                   | ({"adapters"} if config.adapter_size else set()))


def _shared_prefix(config: ModelConfig) -> str:
  return "encoder/layers" if config.scan_layers else "encoder/layer"


def layer_slots(config: ModelConfig) -> list[LayerSlot]:
  """One foreign layer per layer: stacked (scan_layers), unrolled (layer_i), or one shared layer
  written as every layer."""
  if config.share_layers == "all":
    return [(i, _shared_prefix(config), False) for i in range(config.num_layers)]
  if config.share_layers != "none":
    raise UserError(f"model.share_layers={config.share_layers!r} has no Hugging Face or TF layout; "
                    "only 'none' and 'all' (ALBERT) convert")
  return families.encoder_slots(config)


def one_shared_layer(config: ModelConfig) -> list[LayerSlot]:
  """ALBERT's layout: the one shared layer, stored once."""
  return [(0, _shared_prefix(config), False)]


def relayout(params: Mapping, config: ModelConfig, scan_layers: bool) -> dict:
  """`params` of `config` re-arranged for scan_layers (stacked layers) or unrolled layer_i."""
  if config.scan_layers == scan_layers:
    return dict(params)
  if scan_layers and config.pruned_heads:
    raise UserError("a pruned model (model.pruned_heads) has layers of different widths, which cannot be "
                    "stacked: load it with scan_layers=False")
  encoder = dict(params["encoder"])
  if config.share_layers == "all":
    old, new = ("layers", "layer") if config.scan_layers else ("layer", "layers")
    encoder[new] = encoder.pop(old)
  else:
    encoder = families.restack(encoder, config.num_layers, config.scan_layers)
  return {**params, "encoder": encoder}


# --- The mapping table's rows -----------------------------------------------------------------------

def attention_rows(hf_q: str, hf_out: str, tf_q: str, tf_out: str) -> list[Row]:
  """q/k/v ([H, N, D] kernels; `{name}` in hf_q/tf_q is query, key, value) and the output projection."""
  rows = []
  for name in ("query", "key", "value"):
    rows += dense_rows(f"attention/{name}", hf_q.replace("{name}", name), tf_q.replace("{name}", name),
                       kind="heads_in", bias_kind="heads_bias")
  return rows + dense_rows("attention/out", hf_out, tf_out, kind="heads_out")


def embedding_rows(hf: str) -> list[Row]:
  rows = [Row("backbone", f"embeddings/{name}/embedding", f"{hf}.{name}.weight", f"{{e}}/embeddings/{name}",
              "copy") for name in ("word_embeddings", "position_embeddings", "token_type_embeddings")]
  return rows + norm_rows("embeddings/layer_norm", f"{hf}.LayerNorm", "{e}/embeddings/LayerNorm")


def mlm_rows(hf: str, tf: str | None, hf_transform: str, hf_norm: str, hf_bias: str, tf_bias: str | None
             ) -> list[Row]:
  """BertModel's MLM head (transform dense, LayerNorm, output bias; the decoder is the tied embeddings)."""
  return (dense_rows("mlm_head/transform", f"{hf}{hf_transform}", tf and f"{tf}dense", part="mlm")
          + norm_rows("mlm_head/layer_norm", f"{hf}{hf_norm}", tf and f"{tf}LayerNorm", part="mlm")
          + [Row("mlm", "mlm_head/output_bias", hf_bias, tf_bias, "copy")])


def sentence_rows(hf: str) -> list[Row]:
  """The NSP/SOP classifier on the pooled output (TF: cls/seq_relationship, kernel stored [out, in])."""
  return [Row("sentence", "sentence_classifier/kernel", f"{hf}.weight", "cls/seq_relationship/output_weights",
              "kernel"),
          Row("sentence", "sentence_classifier/bias", f"{hf}.bias", "cls/seq_relationship/output_bias", "copy")]


# BERT, RoBERTa and ELECTRA share the encoder layer; ALBERT's one shared layer is named differently.
BERT_LAYER = tuple(
    attention_rows("{b}encoder.layer.{i}.attention.self.{name}", "{b}encoder.layer.{i}.attention.output.dense",
               "{t}/encoder/layer_{i}/attention/self/{name}", "{t}/encoder/layer_{i}/attention/output/dense")
    + norm_rows("attention_layer_norm", "{b}encoder.layer.{i}.attention.output.LayerNorm",
                "{t}/encoder/layer_{i}/attention/output/LayerNorm")
    + dense_rows("feed_forward/intermediate", "{b}encoder.layer.{i}.intermediate.dense",
                 "{t}/encoder/layer_{i}/intermediate/dense")
    + dense_rows("feed_forward/output", "{b}encoder.layer.{i}.output.dense", "{t}/encoder/layer_{i}/output/dense")
    + norm_rows("output_layer_norm", "{b}encoder.layer.{i}.output.LayerNorm",
                "{t}/encoder/layer_{i}/output/LayerNorm"))

# Houlsby adapters (fine-tuning's train.mode=adapters) in each layer. Hugging Face names only: those of the
# modeling code an adapter export ships (conversion/hf_adapter_modeling.py). Original TF BERT has no place
# for them.
BERT_ADAPTERS = hf_only(r for block, hf in (("attention_adapter", "attention.output"), ("output_adapter", "output"))
                        for part in ("down", "up")
                        for r in dense_rows(f"{block}/{part}", f"{{b}}encoder.layer.{{i}}.{hf}.adapter.{part}",
                                            None, part="adapters"))

# Fine-tuning heads (bert_jax/models/head_kinds.py, parameters under head/) whose HF names differ from the
# kinds' defaults: RoBERTa's classification head holds the dense + tanh that BertModel's pooler is
# (classifier.dense), so our pooler goes there.
ROBERTA_CLASSIFIER = hf_only(dense_rows("pooler", "classifier.dense", None)
                             + dense_rows("head/classifier", "classifier.out_proj", None), part="task")
HF_BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")


# --- Hugging Face config.json <-> ModelConfig ----------------------------------------------------------

_HF_DEFAULTS = {"hidden_act": "gelu", "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
                "max_position_embeddings": 512, "type_vocab_size": 2, "initializer_range": 0.02,
                "layer_norm_eps": 1e-12, "pad_token_id": 0, "embedding_size": 128}
_HF_REQUIRED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
_ACTS_TO_OURS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                 "gelu_fast": "gelu_tanh", "relu": "relu"}
_ACTS_TO_HF = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu"}


def hf_activation(name: str, source: str) -> str:
  """bert_jax's name for a HF hidden_act."""
  if name not in _ACTS_TO_OURS:
    raise UserError(f"{source}: hidden_act={name!r} is not supported; known: {sorted(_ACTS_TO_OURS)}")
  return _ACTS_TO_OURS[name]


def read_hf_config(hf_config: Mapping, heads: tuple[str, ...], scan_layers: bool, source: str, *,
                   with_heads: Callable, defaults: Mapping[str, Any] | None = None, factorised: bool = False,
                   gelu_mlm: str = "", **fixed) -> ModelConfig:
  """The ModelConfig of a BERT-layout config.json with `heads` on. defaults: the family's own defaults of
  HF keys; factorised: it has embedding_size; gelu_mlm: the family's name when its HF MLM head hard-codes
  GELU (other activations are refused); fixed: ModelConfig fields the family sets."""
  hf = hf_config_lib.of(hf_config, f"{source}/config.json")

  def get(key, kind=int):
    return hf.typed(key, kind, hf_config_lib.REQUIRED if key in _HF_REQUIRED
                    else (defaults or {}).get(key, _HF_DEFAULTS[key]))

  if hf.str("position_embedding_type", "absolute") != "absolute":
    raise UserError(f"{source}: position_embedding_type={hf['position_embedding_type']!r}; "
                    "only 'absolute' position embeddings convert")
  act = hf_activation(get("hidden_act", str), source)
  if gelu_mlm and "mlm" in heads and act != "gelu":
    # Their HF MLM heads hard-code exact GELU; bert_jax's head uses the encoder's activation.
    raise UserError(f"{source}: the {gelu_mlm} MLM head uses GELU but hidden_act={get('hidden_act', str)!r}")
  embedding_size = get("embedding_size") if factorised else 0
  # Pruned layers differ in width, so they cannot be stacked: such a model comes unrolled.
  pruned = hf.dict("pruned_heads", {})
  config = ModelConfig(
      vocab_size=get("vocab_size"), hidden_size=get("hidden_size"), num_layers=get("num_hidden_layers"),
      num_heads=get("num_attention_heads"), intermediate_size=get("intermediate_size"),
      max_position_embeddings=get("max_position_embeddings"), type_vocab_size=get("type_vocab_size"),
      embedding_size=0 if embedding_size == get("hidden_size") else embedding_size,
      hidden_dropout=get("hidden_dropout_prob", float), attention_dropout=get("attention_probs_dropout_prob", float),
      layer_norm_eps=get("layer_norm_eps", float), initializer_range=get("initializer_range", float), hidden_act=act,
      pad_token_id=hf.int("pad_token_id", 0) if "pad_token_id" in hf else get("pad_token_id"), scan_layers=scan_layers and not pruned, pruned_heads=pruned,
      **fixed)
  return with_heads(config, heads)


def write_hf_config(config: ModelConfig, *, factorised: bool = False, **extra) -> dict:
  """config.json for a BERT-layout model; factorised: the family writes embedding_size; extra: its own keys."""
  d = {"vocab_size": config.vocab_size,
       "hidden_size": config.hidden_size, "num_hidden_layers": config.num_layers,
       "num_attention_heads": config.num_heads, "intermediate_size": config.intermediate_size,
       "hidden_act": _ACTS_TO_HF[config.hidden_act], "hidden_dropout_prob": config.hidden_dropout,
       "attention_probs_dropout_prob": config.attention_dropout,
       "max_position_embeddings": config.max_position_embeddings, "type_vocab_size": config.type_vocab_size,
       "initializer_range": config.initializer_range, "layer_norm_eps": config.layer_norm_eps,
       "pad_token_id": config.pad_token_id, "position_embedding_type": "absolute",
       "tie_word_embeddings": True, "dtype": "float32"}
  if config.pruned_heads:
    d["pruned_heads"] = {str(i): heads for i, heads in config.pruned_heads_dict().items()}
  if factorised:
    d["embedding_size"] = config.embed_dim
  return {**d, **extra}


# --- Original TF checkpoints <-> ModelConfig -------------------------------------------------------------

TF_LAYER_NORM_EPS = 1e-12  # tf.contrib.layers.layer_norm's, which all three code bases use
# The original TF code computes "gelu" with the tanh approximation.
_TF_ACTS = {"gelu": "gelu_tanh", "relu": "relu"}
BERT_SCOPES = {"t": "bert", "e": "bert"}


def _tf_sizes(tensors, names: dict, settings: dict, query_kernel: str, layered: bool, source: str) -> dict:
  """The encoder's sizes: from the config json when it describes this encoder, else off the shapes.

  An original ELECTRA checkpoint's json describes the discriminator only; its generator's sizes come
  from the shapes, with the original code's 64-dim heads. layered: the checkpoint stores every layer
  (layer_<i>), so their count must agree with the json.
  """
  hidden = tensors.shape(query_kernel.format(**names))[0]
  layers = {m.group(1) for n in tensors for m in [re.match(rf"{names['t']}/encoder/layer_(\d+)/", n)] if m}
  if settings and (names["t"] in ("bert", "electra") or settings.get("hidden_size") == hidden):
    fields = hf_config_lib.of(settings, f"{source}: the config json")
    if layered and len(layers) != fields.int("num_hidden_layers"):
      raise UserError(f"{source}: the config json says num_hidden_layers={settings['num_hidden_layers']} but "
                      f"the checkpoint holds {len(layers)} layers ({names['t']}/encoder/layer_*)")
    embedding = fields.int("embedding_size", fields.int("hidden_size"))
    return dict(vocab_size=fields.int("vocab_size"), hidden_size=fields.int("hidden_size"),
                embedding_size=0 if embedding == fields.int("hidden_size") else embedding,
                num_layers=fields.int("num_hidden_layers"), num_heads=fields.int("num_attention_heads"),
                intermediate_size=fields.int("intermediate_size"),
                max_position_embeddings=fields.int("max_position_embeddings", 512),
                type_vocab_size=fields.int("type_vocab_size", 2))
  if not layered:
    raise UserError(f"{source}: an ALBERT checkpoint needs albert_config.json (for num_hidden_layers)")
  vocab, embed = tensors.shape(f"{names['e']}/embeddings/word_embeddings")
  return dict(vocab_size=vocab, embedding_size=0 if embed == hidden else embed, hidden_size=hidden,
              num_layers=len(layers), num_heads=max(1, hidden // 64),
              intermediate_size=tensors.shape(f"{names['t']}/encoder/layer_0/intermediate/dense/kernel")[1],
              max_position_embeddings=tensors.shape(f"{names['e']}/embeddings/position_embeddings")[0],
              type_vocab_size=tensors.shape(f"{names['e']}/embeddings/token_type_embeddings")[0])


def read_tf_config(tensors, names: dict, settings: dict, heads: tuple[str, ...], scan_layers: bool, source: str,
                   *, with_heads: Callable, config_file: str, query_kernel: str, layered: bool = True,
                   **fixed) -> tuple[ModelConfig, list[str]]:
  """The ModelConfig of an original TF checkpoint (`settings`: its config json, {} when absent) and notes.
  query_kernel: the TF name of layer 0's query kernel (the hidden size is read off it)."""
  fields = hf_config_lib.of(settings, f"{source}: the config json")
  act = fields.str("hidden_act", "gelu")
  if act not in _TF_ACTS:
    raise UserError(f"{source}: hidden_act={act!r} is not one of {sorted(_TF_ACTS)}")
  config = ModelConfig(
      **_tf_sizes(tensors, names, settings, query_kernel, layered, source), hidden_act=_TF_ACTS[act],
      hidden_dropout=fields.float("hidden_dropout_prob", 0.1),
      attention_dropout=fields.float("attention_probs_dropout_prob", 0.1),
      initializer_range=fields.float("initializer_range", 0.02), layer_norm_eps=TF_LAYER_NORM_EPS,
      scan_layers=scan_layers, **fixed)
  notes = [] if settings else [f"{source}: no {config_file}; sizes read off the tensors, 64-dim attention "
                               "heads assumed"]
  return with_heads(config, heads), notes


def write_tf_config(config: ModelConfig, *, factorised: bool = False, **extra) -> tuple[dict, list[str]]:
  """The config json of an original TF checkpoint, and notes on where the TF code computes otherwise."""
  if config.pruned_heads:
    raise UserError("a pruned model (model.pruned_heads) has no original TF checkpoint layout: the TF code "
                    "builds every head; use --to hf (transformers 4.x prunes on load)")
  d = {"vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
       "num_hidden_layers": config.num_layers, "num_attention_heads": config.num_heads,
       "intermediate_size": config.intermediate_size, "hidden_act": "relu" if config.hidden_act == "relu" else "gelu",
       "hidden_dropout_prob": config.hidden_dropout, "attention_probs_dropout_prob": config.attention_dropout,
       "max_position_embeddings": config.max_position_embeddings, "type_vocab_size": config.type_vocab_size,
       "initializer_range": config.initializer_range}
  if factorised:
    d["embedding_size"] = config.embed_dim
  notes = []
  if config.hidden_act == "gelu":
    notes.append("the original TF code computes 'gelu' with the tanh approximation; this model uses exact GELU")
  if config.layer_norm_eps != TF_LAYER_NORM_EPS:
    notes.append(f"the original TF code uses LayerNorm epsilon 1e-12; this model uses {config.layer_norm_eps}")
  return {**d, **extra}, notes
