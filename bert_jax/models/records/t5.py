"""T5 and T5 v1.1 (Raffel et al. 2020): Hugging Face's T5ForConditionalGeneration (no original TF layout here:
mesh-tensorflow's checkpoints convert through transformers first).

Its own config and module (models/t5.py). Two kinds of layer, so the layer slots carry their stack
(`slot_rows`): encoder blocks hold layer.0 (self-attention) and layer.1 (feed-forward); decoder blocks
layer.0 (causal self-attention), layer.1 (cross-attention) and layer.2 (feed-forward). Each stack's
relative-position table lives in its block 0 in HF and once per stack here. The token table is HF's
`shared` (encoder.embed_tokens and decoder.embed_tokens repeat it). The LM head is the one optional
"head": `lm_head` when the model has its own output kernel (v1.1, tie_word_embeddings=False), absent when
it reads the token table (original T5; transformers 5 writes v1.1 configs tied too, without lm_head.weight).
"""
from __future__ import annotations

from typing import Iterable, Mapping

from bert_jax.errors import UserError
from bert_jax.models import families, hf_config as hf_config_lib, t5
from bert_jax.models.families import Architecture, LayerSlot, Row
from bert_jax.models.t5 import T5Config, T5Model

HEADS = ("lm_head",)
_STACKS = ("encoder", "decoder")


def heads_of(config: T5Config) -> tuple[str, ...]:
  return () if config.tie_word_embeddings else ("lm_head",)


def with_heads(config: T5Config, heads: Iterable[str]) -> T5Config:
  return config.replace(tie_word_embeddings="lm_head" not in set(heads))


def _layers(config: T5Config, stack: str) -> int:
  return config.num_layers if stack == "encoder" else config.decoder_layers


def layer_slots(config: T5Config) -> list[LayerSlot]:
  return [slot for stack in _STACKS for slot in families.stack_slots(stack, _layers(config, stack), config.scan_layers)]


def relayout(params: Mapping, config: T5Config, scan_layers: bool) -> dict:
  """`params` re-arranged for stacked (scan_layers) or unrolled layer_{i} layers, in both stacks."""
  if config.scan_layers == scan_layers:
    return dict(params)
  return {**params, **{stack: families.restack(params[stack], _layers(config, stack), config.scan_layers)
                       for stack in _STACKS}}


def _copy(ours: str, hf: str, part: str = "backbone") -> Row:
  return Row(part, ours, hf, None, "copy")


def _attention(ours: str, hf: str) -> tuple[Row, ...]:
  return (*(Row("backbone", f"{ours}/{name}", f"{hf}.{letter}.weight", None, "heads_in")
            for name, letter in (("query", "q"), ("key", "k"), ("value", "v"))),
          Row("backbone", f"{ours}/out", f"{hf}.o.weight", None, "heads_out"))


def _feed_forward(config: T5Config, hf: str) -> tuple[Row, ...]:
  ins = ("wi_0", "wi_1") if config.gated else ("wi",)
  return tuple(Row("backbone", f"mlp/{name}", f"{hf}.DenseReluDense.{name}.weight", None, "kernel")
               for name in (*ins, "wo"))


def _encoder_rows(config: T5Config) -> tuple[Row, ...]:
  block = "encoder.block.{i}.layer"
  return (_copy("attention_norm/scale", f"{block}.0.layer_norm.weight"),
          *_attention("attention", f"{block}.0.SelfAttention"),
          _copy("mlp_norm/scale", f"{block}.1.layer_norm.weight"),
          *_feed_forward(config, f"{block}.1"))


def _decoder_rows(config: T5Config) -> tuple[Row, ...]:
  block = "decoder.block.{i}.layer"
  return (_copy("self_attention_norm/scale", f"{block}.0.layer_norm.weight"),
          *_attention("self_attention", f"{block}.0.SelfAttention"),
          _copy("cross_attention_norm/scale", f"{block}.1.layer_norm.weight"),
          *_attention("cross_attention", f"{block}.1.EncDecAttention"),
          _copy("mlp_norm/scale", f"{block}.2.layer_norm.weight"),
          *_feed_forward(config, f"{block}.2"))


def slot_rows(config: T5Config, prefix: str) -> tuple[Row, ...]:
  return _encoder_rows(config) if prefix.startswith("encoder/") else _decoder_rows(config)


_GLOBAL = (
    _copy("shared/embedding", "shared.weight"),
    _copy("encoder/relative_bias/embedding", "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"),
    _copy("encoder/final_norm/scale", "encoder.final_layer_norm.weight"),
    _copy("decoder/relative_bias/embedding", "decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"),
    _copy("decoder/final_norm/scale", "decoder.final_layer_norm.weight"),
    Row("lm_head", "lm_head", "lm_head.weight", None, "kernel"),
)

# --- Hugging Face config.json <-> T5Config ---------------------------------------------------------------------


def read_hf_config(hf_config, heads, scan_layers: bool, source: str) -> T5Config:
  """The T5Config of a Hugging Face config.json; `heads` holds lm_head when the weights have their own."""
  hf = hf_config_lib.of(hf_config, f"{source}/config.json")
  proj = hf.str("feed_forward_proj", "relu")
  if proj not in t5._CHOICES["feed_forward"]:  # pylint: disable=protected-access
    raise UserError(f"{source}: feed_forward_proj={proj!r} is not one of {t5._CHOICES['feed_forward']}")  # pylint: disable=protected-access
  tied = hf.bool("tie_word_embeddings", True) is not False
  layers = hf.int("num_layers", 6)
  config = T5Config(
      vocab_size=hf.int("vocab_size"), hidden_size=hf.int("d_model"), num_layers=layers,
      num_decoder_layers=hf.int("num_decoder_layers", layers) if hf.get("num_decoder_layers") is not None else 0,
      num_heads=hf.int("num_heads"), head_dim=hf.int("d_kv"), intermediate_size=hf.int("d_ff"),
      feed_forward=proj, tie_word_embeddings=tied,
      scale_decoder_outputs=hf.bool("scale_decoder_outputs", tied),
      relative_buckets=hf.int("relative_attention_num_buckets", 32),
      relative_max_distance=hf.int("relative_attention_max_distance", 128),
      norm_eps=hf.float("layer_norm_epsilon", 1e-6), dropout=hf.float("dropout_rate", 0.1),
      initializer_factor=hf.float("initializer_factor", 1.0), pad_token_id=hf.int("pad_token_id", 0),
      eos_token_id=_first(hf.get("eos_token_id"), 1), decoder_start_token_id=hf.int("decoder_start_token_id", 0),
      scan_layers=scan_layers)
  if config.num_decoder_layers == config.num_layers:
    config = config.replace(num_decoder_layers=0)
  return with_heads(config, heads)


def _first(value, default: int) -> int:
  if isinstance(value, list):
    value = value[0] if value else None
  return default if value is None else int(value)


def write_hf_config(config: T5Config) -> dict:
  """config.json's keys (besides architectures and model_type) as Hugging Face's T5Config reads them."""
  act = config.feed_forward.split("-")[-1]
  return {"vocab_size": config.vocab_size, "d_model": config.hidden_size, "d_kv": config.head_dim,
          "d_ff": config.intermediate_size, "num_layers": config.num_layers,
          "num_decoder_layers": config.decoder_layers, "num_heads": config.num_heads,
          "relative_attention_num_buckets": config.relative_buckets,
          "relative_attention_max_distance": config.relative_max_distance, "dropout_rate": config.dropout,
          "layer_norm_epsilon": config.norm_eps, "initializer_factor": config.initializer_factor,
          "feed_forward_proj": config.feed_forward, "dense_act_fn": "gelu_new" if act == "gelu" else act,
          "is_gated_act": config.gated, "is_encoder_decoder": True,
          "tie_word_embeddings": config.tie_word_embeddings, "scale_decoder_outputs": config.scale_decoder_outputs,
          "pad_token_id": config.pad_token_id, "eos_token_id": config.eos_token_id,
          "decoder_start_token_id": config.decoder_start_token_id}


FAMILY = families.register(families.Family(
    name="t5",
    config=T5Config,
    module=T5Model,
    heads=HEADS,
    heads_of=heads_of,
    with_heads=with_heads,
    pretrained_heads=lambda present: tuple(present),
    tokenizer="t5_spm",  # SentencePiece with 100 sentinels (data_pipelines/t5_spm.py)
    finetune_config="configs/t5_finetune.py",  # text to text (finetune/seq2seq.py)
    layout=families.Layout(global_rows=_GLOBAL,
                           layer_rows=lambda config: _encoder_rows(config) + _decoder_rows(config),
                           parts=lambda config: frozenset({"backbone", *heads_of(config)}),
                           layer_slots=layer_slots, relayout=relayout, slot_rows=slot_rows),
    hf=families.HFNames(
        model_type="t5", class_prefix="T5", base_prefix="",
        # The same class with and without its own LM head kernel: the exact match is taken.
        architectures=(Architecture("T5ForConditionalGeneration", frozenset({"lm_head"}), False),
                       Architecture("T5ForConditionalGeneration", frozenset(), False)),
        read_config=read_hf_config, write_config=write_hf_config,
        tied={"encoder.embed_tokens.weight": "shared.weight", "decoder.embed_tokens.weight": "shared.weight"},
        tokenizer_class="T5Tokenizer", lower_case=False),
    summary_heads=(),
    with_dropout=lambda config, hidden, attention: config.replace(dropout=hidden),
    backbone_params=t5.backbone_params,
))
