"""The frozen model config passed down the module tree (built from the `model` section of a run config)."""
from __future__ import annotations

import dataclasses
import json
import numbers
from typing import Any, Mapping

import jax.numpy as jnp

from bert_jax import config_schema
from bert_jax.errors import UserError
from bert_jax.models import activations, attention

# The families whose layout BertModel's switches decide (ModelConfig.family is read off the switches).
LAYOUT_FAMILIES = ("bert", "roberta", "albert", "electra")

# The choices every family's config has; a family's own come on top, their names read from the one table of
# their kind (models/activations.py: activations and remat policies; models/attention.py: attention backends).
SHARED_CHOICES = {
    "dtype": ("float32", "bfloat16", "float16"),
    "param_dtype": ("float32", "bfloat16"),
    "remat": activations.REMAT,
}
_CHOICES = {
    "hidden_act": activations.NAMES,
    "position_style": ("absolute", "roberta"),
    "share_layers": ("none", "all", "attention", "ffn"),
    "sentence_head": ("nsp", "sop", "none"),
    "attention": attention.BACKENDS,
    "entity_fusion": ("paper", "residual"),
}


def check_choices(config: Any, choices: Mapping[str, tuple[str, ...]]) -> None:
  """UserError naming the first field of `config` (SHARED_CHOICES' and `choices`') whose value is not allowed."""
  for name, allowed in {**SHARED_CHOICES, **choices}.items():
    if getattr(config, name) not in allowed:
      raise UserError(f"model.{name}={getattr(config, name)!r} is not one of {allowed}")


# A key older configs wrote, and what its values became (`attention`).
_LEGACY_ATTENTION = {"auto": "dot", "xla": "dot", "cudnn": "cudnn"}


class Dtypes:
  """compute_dtype and weight_dtype: the dtypes of a config's `dtype` and `param_dtype` fields."""

  @property
  def compute_dtype(self):
    return jnp.dtype(self.dtype)

  @property
  def weight_dtype(self):
    return jnp.dtype(self.param_dtype)


@dataclasses.dataclass(frozen=True)
class ModelConfig(Dtypes):
  """Encoder hyper-parameters. Defaults are BERT-base.

  embedding_size: width of the token embeddings; 0 means hidden_size. When it differs, a projection
    E -> H follows the embedding LayerNorm (ALBERT's factorisation, ELECTRA-small) and the MLM head
    projects back to E before the tied output layer.
  position_style: "absolute" uses positions 0..T-1; "roberta" counts only non-pad tokens and starts at
    pad_token_id + 1, as the released RoBERTa checkpoints do.
  share_layers: cross-layer parameter sharing (ALBERT): none, all, attention, ffn.
  rtd_head: ELECTRA's replaced-token-detection head (dense, activation, dense -> one logit per token).
  remat: activation checkpointing per layer: none, full (save nothing), dots (save matmul outputs),
    dots_no_batch (save matmuls without batch dims).
  scan_layers: stacked layer parameters and one nn.scan over the layers (compile time independent of
    depth); False: layer_0..layer_{L-1}, unrolled.
  scan_unroll: layers per iteration of the scanned loop; num_layers unrolls it completely (parameters
    stay stacked). Fully unrolled, the 4-layer `mini` step is faster on CPU (no stacked residual
    buffers; BENCHMARKS.md, "model.scan_unroll"), for a longer compile; the small presets do that
    (configs/common.py).
  pruned_heads: the heads removed from each layer, as HF's `config.pruned_heads` ({layer: [head, ...]},
    original head indices; on the command line as that dict in JSON, "" for none); stored as one sorted
    tuple per layer, or () when nothing is pruned. Those layers' q/k/v/out kernels hold only the kept
    heads, so the layers differ in shape: pruned models need scan_layers=False and unshared layers. A
    layer keeps at least one head.
  adapter_size: the bottleneck width of Houlsby adapters after each layer's attention and feed-forward
    sublayers (fine-tuning's train.mode=adapters sets it); 0: no adapters.
  family: the family record (bert_jax/models/records/) that names this model's parameters abroad. For
    the four layouts BertModel's switches make, it is read off the switches (as for checkpoints saved
    before the key existed): "albert" when every layer is shared, "roberta" with RoBERTa's positions,
    "electra" with the RTD head or factorised embeddings, else "bert". "" reads it; one of those four
    must agree with the switches; `replace` reads it again. Any other name (a family registered with
    ModelConfig as its config, such as one that differs from these only in its tokenizer) is kept.
  attention: the backend of the attention (bert_jax/models/attention.py): dot, splash (TPU), cudnn
    (GPU) or auto (splash where the step is compiled for TPU at 512 tokens or more, a multiple of 128, and
    attention_dropout is 0; dot elsewhere). splash and cudnn have no dropout on the attention
    probabilities: attention_dropout must be 0.
  sublayer_order: a sandwich transformer's order of sublayers (Press et al. 2020, "Improving Transformer
    Models by Reordering their Sublayers"): "s" a self-attention sublayer, "f" a feed-forward one, each
    post-LN, e.g. "sssssfsfsfsfsfsfffff" for 20 sublayers. "" (or "sf" * num_layers, the same model): the
    interleaved layers; any other order is unrolled, unshared, unpruned, and has no per-layer outputs.
  causal: each token attends only to itself and the tokens before it (a left-to-right model: BERT's
    "LTR & No NSP" ablation, Devlin et al. 2019, Table 5; objective="ltr"), in pretraining and fine-tuning.
  num_tasks: ERNIE 2.0's task embeddings (Sun et al. 2019, section 3.2): a table of this many rows, the
    row of each row's task (`task_ids`, int32[B]; task 0 when not given) added to the word, position and
    token-type embeddings; 0: none (no parameter, the model as without the switch).
  entity_layers: ERNIE-THU's knowledgeable encoder (Zhang et al. 2019, "ERNIE: Enhanced Language
    Representation with Informative Entities"): the top `entity_layers` of the num_layers layers are
    aggregators (models/bert.py:KnowledgeLayer) that fuse the token stream with a stream of frozen entity
    vectors (`entity_vectors` [B, T, entity_dim] at the first token of each mention, `entity_mask`), with
    `entity_heads` heads of self-attention over the entities; 0: none (no parameter, the model as without).
  entity_fusion: "paper": the aggregator's outputs are the paper's equations, w' = act(W_t' h + b_t) and
    e' = act(W_e' h + b_e); "residual": LN(w~ + W_t' h + b_t) and LN(e~ + W_e' h + b_e), as ERNIE-THU's
    released code (thunlp/ERNIE) writes them.
  """
  vocab_size: int = 30522
  hidden_size: int = 768
  num_layers: int = 12
  num_heads: int = 12
  intermediate_size: int = 3072
  max_position_embeddings: int = 512
  type_vocab_size: int = 2
  embedding_size: int = 0
  hidden_dropout: float = 0.1
  attention_dropout: float = 0.1
  layer_norm_eps: float = 1e-12
  initializer_range: float = 0.02
  hidden_act: str = "gelu"
  position_style: str = "absolute"
  pad_token_id: int = 0
  share_layers: str = "none"
  use_pooler: bool = True
  mlm_head: bool = True
  sentence_head: str = "nsp"
  rtd_head: bool = False
  dtype: str = "float32"
  param_dtype: str = "float32"
  remat: str = "none"
  scan_layers: bool = True
  scan_unroll: int = 1
  attention: str = "dot"
  pruned_heads: Any = ""
  adapter_size: int = 0
  family: str = ""
  sublayer_order: str = ""
  causal: bool = False
  num_tasks: int = 0
  entity_layers: int = 0
  entity_dim: int = 100
  entity_heads: int = 4
  entity_fusion: str = "paper"

  def __post_init__(self):
    config_schema.check_block("model", self)  # the plain fields' ranges
    check_choices(self, _CHOICES)
    if self.hidden_size % self.num_heads:
      raise UserError(f"model.hidden_size={self.hidden_size} is not divisible by "
                      f"model.num_heads={self.num_heads}")
    if self.scan_layers and self.share_layers in ("attention", "ffn"):
      # nn.scan lifts per collection, so a module shared by part of each layer would be stacked per
      # layer (silently unshared). Full sharing scans fine: one layer applied num_layers times.
      raise UserError(f"model.share_layers={self.share_layers!r} needs model.scan_layers=False "
                      "(only 'all' and 'none' sharing can be scanned)")
    object.__setattr__(self, "pruned_heads", _per_layer(self.pruned_heads, self.num_layers, self.num_heads))
    if self.pruned_heads and (self.scan_layers or self.share_layers != "none"):
      raise UserError("model.pruned_heads needs model.scan_layers=False and model.share_layers='none' "
                      "(pruned layers differ in shape)")
    attention.check_dropout(self.attention, self.attention_dropout)
    if not 0 <= self.entity_layers < self.num_layers:
      raise UserError(f"model.entity_layers={self.entity_layers} must be >= 0 (0: no entity fusion) and below "
                      f"model.num_layers={self.num_layers} (at least one text layer under the fusion layers)")
    if self.entity_layers:
      if self.entity_dim <= 0 or self.entity_heads <= 0 or self.entity_dim % self.entity_heads:
        raise UserError(f"model.entity_dim={self.entity_dim} must be a positive multiple of model.entity_heads="
                        f"{self.entity_heads}")
      if self.share_layers != "none" or self.pruned_heads or self.sublayer_order or self.adapter_size:
        raise UserError("model.entity_layers needs model.share_layers='none', no pruned heads, no sublayer_order "
                        "and no adapters")
    if self.adapter_size < 0:
      raise UserError(f"model.adapter_size must be >= 0 (0: no adapters), got {self.adapter_size}")
    if self.sublayer_order == "sf" * self.num_layers:
      object.__setattr__(self, "sublayer_order", "")
    if self.sublayer_order:
      if set(self.sublayer_order) - set("sf"):
        raise UserError(f"model.sublayer_order={self.sublayer_order!r}: use only 's' (self-attention) and 'f' "
                        "(feed-forward), e.g. 'sssfsfff'; '' for the interleaved layers")
      if self.scan_layers or self.share_layers != "none" or self.pruned_heads or self.adapter_size:
        raise UserError("model.sublayer_order needs model.scan_layers=False, model.share_layers='none', no "
                        "pruned heads and no adapters (its sublayers are unrolled one by one)")
    layout = self.layout_family()
    if self.family in LAYOUT_FAMILIES and self.family != layout:
      raise UserError(f"model.family={self.family!r}, but these switches make a {layout!r} model (see "
                      "ModelConfig.layout_family); leave model.family empty to read it off them")
    if not self.family:
      object.__setattr__(self, "family", layout)

  @classmethod
  def from_dict(cls, values: Mapping[str, Any]) -> "ModelConfig":
    names = {f.name for f in dataclasses.fields(cls)}
    values = dict(values)
    if "attention_impl" in values:  # configs saved before `attention` replaced it
      values.setdefault("attention", _LEGACY_ATTENTION.get(values.pop("attention_impl"), "dot"))
    unknown = sorted(set(values) - names)
    if unknown:
      raise UserError(f"unknown model config keys {unknown}; known: {sorted(names)}")
    return cls(**dict(values))

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)

  def replace(self, **changes) -> "ModelConfig":
    """A copy with `changes`; a family read off the switches is read again off the new ones."""
    family = "" if self.family in LAYOUT_FAMILIES else self.family
    return dataclasses.replace(self, **{"family": family, **changes})

  def layout_family(self) -> str:
    """Which of LAYOUT_FAMILIES these switches describe (the rule `family` follows for those four)."""
    if self.share_layers == "all":
      return "albert"
    if self.position_style == "roberta":
      return "roberta"
    if self.rtd_head or self.embed_dim != self.hidden_size:
      return "electra"
    return "bert"

  def kept_heads(self, layer: int | None) -> tuple[int, ...]:
    """The original indices of the heads that layer `layer` keeps (all of them for None)."""
    pruned = self.pruned_heads[layer] if self.pruned_heads and layer is not None else ()
    return tuple(h for h in range(self.num_heads) if h not in pruned)

  def pruned_heads_dict(self) -> dict[int, list[int]]:
    """HF's form: {layer: [heads]} for the layers with pruned heads."""
    return {i: list(heads) for i, heads in enumerate(self.pruned_heads) if heads}

  def text_config(self) -> "ModelConfig":
    """The layers under the entity fusion layers (entity_layers): a plain encoder of the others."""
    return self.replace(num_layers=self.num_layers - self.entity_layers, entity_layers=0)

  def entity_config(self) -> "ModelConfig":
    """The entity stream's width and heads, for its self-attention and layer norms."""
    return self.replace(hidden_size=self.entity_dim, num_heads=self.entity_heads, intermediate_size=self.entity_dim,
                        entity_layers=0, attention="dot", num_tasks=0)

  @property
  def embed_dim(self) -> int:
    return self.embedding_size or self.hidden_size

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads


def _per_layer(pruned: Any, num_layers: int, num_heads: int) -> tuple[tuple[int, ...], ...]:
  """pruned_heads as one sorted tuple per layer (() when none), from HF's {layer: [heads]} dict
  (keys may be strings, as in JSON), that dict as a JSON string (a command-line override), or a
  per-layer list; out-of-range indices are errors."""
  if isinstance(pruned, str) and pruned.strip():
    text = pruned
    try:
      pruned = json.loads(text)
    except json.JSONDecodeError as e:
      raise UserError(f"model.pruned_heads={text!r} is not JSON ({e.msg}); write it as HF's "
                      "config.pruned_heads, e.g. '{\"0\": [2, 5], \"3\": [1]}'") from None
    if not isinstance(pruned, (dict, list)):
      raise UserError(f"model.pruned_heads={text!r} must be a JSON object {{layer: [heads]}}")
  if not pruned:
    return ()
  items = pruned.items() if isinstance(pruned, Mapping) else enumerate(pruned)
  layers = [set() for _ in range(num_layers)]
  for layer, heads in items:
    if not 0 <= int(layer) < num_layers:
      raise UserError(f"model.pruned_heads: layer {layer} is out of range (num_layers={num_layers})")
    if not isinstance(heads, (list, tuple, set)) or not all(isinstance(h, numbers.Integral) for h in heads):
      raise UserError(f"model.pruned_heads: layer {layer} must map to a list of head indices, got {heads!r}")
    bad = [h for h in heads if not 0 <= int(h) < num_heads]
    if bad:
      raise UserError(f"model.pruned_heads: head {bad[0]} of layer {layer} is out of range "
                      f"(num_heads={num_heads}, heads 0..{num_heads - 1})")
    layers[int(layer)] |= {int(h) for h in heads}
  for layer, heads in enumerate(layers):
    if len(heads) == num_heads:
      raise UserError(f"model.pruned_heads: pruning every head of layer {layer} would leave it no attention "
                      "(its output would be the output bias alone); keep at least one head per layer")
  if not any(layers):
    return ()
  return tuple(tuple(sorted(heads)) for heads in layers)


class FamilyConfig(Dtypes):
  """from_dict / to_dict / replace (and Dtypes') for a family's own
  frozen config dataclass (ModernBERT, MobileBERT, XLNet, BiLSTM); `FAMILY_NAME` names the family in the
  unknown-key error."""
  FAMILY_NAME = "model"

  @classmethod
  def from_dict(cls, values: Mapping[str, Any]):
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
      raise UserError(f"unknown {cls.FAMILY_NAME} model config keys {unknown}; known: {sorted(names)}")
    return cls(**values)

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)

  def replace(self, **changes):
    return dataclasses.replace(self, **changes)
