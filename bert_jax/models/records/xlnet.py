"""XLNet (Yang et al. 2019): Hugging Face's XLNetModel, XLNetLMHeadModel and XLNetFor{SequenceClassification,
TokenClassification} (bert_jax/models/xlnet.py).

Its own module and config (Transformer-XL relative attention, two streams, memory); the LM head is the
word embeddings tied, plus a bias (lm_loss); a SentencePiece vocabulary, padded on the left. Hugging
Face keeps q, k, v, o and r as [H, N, D] tensors, as bert_jax does, so they copy as they are. Sequence
heads read the last real token's summary (models/xlnet.py:LastTokenSummary); the span head is
XLNetForQuestionAnsweringSimple's, and head kind xlnet_beam is XLNetForQuestionAnswering's (beam search over
start and end, the answer class: models/xlnet_qa.py), which `convert --from hf` reads too.
Its tokenizer kind, xlnet_spm, lays the fine-tuning inputs out as XLNet does (a <sep> b <sep> <cls>, left padding).
"""
from __future__ import annotations

from bert_jax.errors import UserError
from bert_jax.models import families, hf_config as hf_config_lib
from bert_jax.models.families import Architecture, Row, dense_rows, hf_only, norm_rows
from bert_jax.models import xlnet
from bert_jax.models.xlnet import LastTokenSummary, XLNetConfig, XLNetModel

_ATTENTION = {"query": "q", "key": "k", "value": "v", "output": "o", "position_key": "r",
              "content_bias": "r_w_bias", "position_bias": "r_r_bias", "segment_bias": "r_s_bias",
              "segment_embedding": "seg_embed"}
_L = "{b}layer.{i}"
_LAYER = tuple(
    tuple(Row("backbone", f"attention/{ours}", f"{_L}.rel_attn.{hf}", None, "copy") for ours, hf in _ATTENTION.items())
    + hf_only(norm_rows("attention/layer_norm", f"{_L}.rel_attn.layer_norm", None))
    + hf_only(dense_rows("feed_forward/intermediate", f"{_L}.ff.layer_1", None))
    + hf_only(dense_rows("feed_forward/output", f"{_L}.ff.layer_2", None))
    + hf_only(norm_rows("feed_forward/layer_norm", f"{_L}.ff.layer_norm", None)))
_GLOBAL = (Row("backbone", "embeddings/word_embeddings/embedding", "{b}word_embedding.weight", None, "copy"),
           Row("backbone", "embeddings/mask_emb", "{b}mask_emb", None, "copy"),
           Row("mlm", "mlm_head/output_bias", "lm_loss.bias", None, "copy"))

# Fine-tuning heads: the sequence summary's dense + tanh and the classifier (logits_proj); token
# classification's classifier keeps the kinds' default names.
_SUMMARY = hf_only(dense_rows("head/summary/dense", "sequence_summary.summary", None)
                   + dense_rows("head/classifier", "logits_proj", None), part="task")

_ACTS_TO_OURS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu"}
_ACTS_TO_HF = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu"}


def heads_of(config: XLNetConfig) -> tuple[str, ...]:
  return ("mlm",) if config.mlm_head else ()


def with_heads(config: XLNetConfig, heads) -> XLNetConfig:
  return config.replace(mlm_head="mlm" in set(heads))


def read_hf_config(hf_config, heads, scan_layers: bool, source: str) -> XLNetConfig:
  hf = hf_config_lib.of(hf_config, f"{source}/config.json")
  refused = {"attn_type": ("bi", "attn_type='uni' (causal attention)"), "same_length": (False, "same_length=True")}
  for key, (wanted, what) in refused.items():
    if hf.typed(key, type(wanted), wanted) != wanted:
      raise UserError(f"{source}: XLNet with {what} has no bert_jax counterpart")
  act = hf.str("ff_activation", "gelu")
  if act not in _ACTS_TO_OURS:
    raise UserError(f"{source}: ff_activation={act!r} is not one of {sorted(_ACTS_TO_OURS)}")
  dropout = hf.float("dropout", 0.1)
  config = XLNetConfig(
      vocab_size=hf.int("vocab_size"), hidden_size=hf.int("d_model"), num_layers=hf.int("n_layer"),
      num_heads=hf.int("n_head"), intermediate_size=hf.int("d_inner"), hidden_act=_ACTS_TO_OURS[act],
      layer_norm_eps=hf.float("layer_norm_eps", 1e-12), hidden_dropout=dropout, attention_dropout=dropout,
      mem_len=hf.int("mem_len", 0), reuse_len=hf.int("reuse_len", 0),
      clamp_len=hf.int("clamp_len", -1), bi_data=hf.bool("bi_data", False),
      initializer_range=hf.float("initializer_range", 0.02),
      pad_token_id=hf.int("pad_token_id", 5), start_n_top=hf.int("start_n_top", 5),
      end_n_top=hf.int("end_n_top", 5), scan_layers=scan_layers)
  return with_heads(config, heads)


def write_hf_config(config: XLNetConfig) -> dict:
  return {"vocab_size": config.vocab_size, "d_model": config.hidden_size, "n_layer": config.num_layers,
          "n_head": config.num_heads, "d_inner": config.intermediate_size,
          "ff_activation": _ACTS_TO_HF[config.hidden_act], "untie_r": True, "attn_type": "bi",
          "initializer_range": config.initializer_range, "layer_norm_eps": config.layer_norm_eps,
          "dropout": config.hidden_dropout, "mem_len": config.mem_len or None, "reuse_len": config.reuse_len or None,
          "bi_data": config.bi_data, "clamp_len": config.clamp_len, "same_length": False, "pad_token_id": config.pad_token_id,
          "start_n_top": config.start_n_top, "end_n_top": config.end_n_top,
          "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": True, "dtype": "float32"}


FAMILY = families.register(families.Family(
    name="xlnet",
    config=XLNetConfig,
    module=XLNetModel,
    heads=("mlm",),
    heads_of=heads_of,
    with_heads=with_heads,
    pretrained_heads=lambda present: ("mlm",),
    tokenizer="xlnet_spm",
    layout=families.Layout(global_rows=_GLOBAL, layer_rows=_LAYER,
                           parts=lambda config: frozenset({"backbone", *heads_of(config)}),
                           layer_slots=families.encoder_slots, relayout=families.encoder_relayout),
    hf=families.HFNames(
        model_type="xlnet", class_prefix="XLNet", base_prefix="transformer.",
        architectures=(Architecture("XLNetLMHeadModel", frozenset({"mlm"}), True),
                       Architecture("XLNetModel", frozenset(), False)),
        read_config=read_hf_config, write_config=write_hf_config,
        tied={"lm_loss.weight": "{b}word_embedding.weight"},
        task_rows={"classification": _SUMMARY, "regression": _SUMMARY},
        # span: qa_outputs; xlnet_beam: start_logits, end_logits, answer_class (models/xlnet_qa.py)
        task_classes={"span": "ForQuestionAnsweringSimple", "xlnet_beam": "ForQuestionAnswering"},
        tokenizer_class="XLNetTokenizer", tokenizer_settings={"padding_side": "left"}, lower_case=False),
    summary_heads=(),
    summary=LastTokenSummary,
    backbone_params=xlnet.backbone_params,
))
