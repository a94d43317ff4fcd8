"""Model families: one record per family, and the registry every other part of bert_jax reads.

A *family* is everything bert_jax knows about one kind of encoder, in one `Family` record: the Flax
module and its config dataclass, the pretraining heads it can carry, where each parameter lives in
Hugging Face and original TF checkpoints (its mapping table), how its config translates to and from
theirs, the tokenizer its checkpoints ship, and how its sequence-level fine-tuning heads pool. Each
family's record is one module in bert_jax/models/records/ that calls `register(Family(...))`; conversion,
loading, fine-tuning and prediction read the record and never name a family themselves.

What the rest of the code calls:

  families.get("roberta")                    the Family (UserError naming the registered ones)
  families.by_model_type("roberta", source)  the Family of a HF config.json's model_type
  families.model_config(saved["model"])      the config object of a config.json "model" dict: the
                                             dict's "family" picks the config class ("" or no key:
                                             ModelConfig, whose family is read off its switches)
  families.of(config)                        the Family of a config object (config.family)
  families.build(config)                     the Flax module, instead of BertModel(config)

config.to_dict() is the "model" dict to save; its "family" names the family.

The module contract (BertModel's): `families.build(config).init(rng, input_ids)` and
`apply(params, input_ids, attention_mask=None, token_type_ids=None, *, deterministic=True,
output_hidden_states=False, head_mask=None) -> ModelOutput` (models/bert.py: last_hidden_state
[B, T, H]; pooled_output and the pretraining heads' logits where the config switches them on;
hidden_states [L+1, B, T, H] when asked for). The config contract (ModelConfig's): a frozen dataclass
with `family`, `vocab_size`, `hidden_size`, `num_layers`, `max_position_embeddings`, `scan_layers`,
`initializer_range`, `compute_dtype` and `weight_dtype` (what the fine-tuning heads build with),
dropout rates that the record's `with_dropout` sets (BERT's `hidden_dropout` and `attention_dropout`),
`from_dict(dict)` (UserError on unknown keys), `to_dict()` and `replace(**changes)`.

Adding a family, e.g. ModernBERT (its record is models/records/modernbert.py; see ARCHITECTURE.md):

  bert_jax/models/modernbert.py          its Flax module and config dataclass, if BertModel's
                                         switches do not describe it (or in the record's file)
  bert_jax/models/records/modernbert.py  FAMILY = families.register(families.Family(
                                             name="modernbert", config=ModernBertConfig,
                                             module=ModernBertModel, heads=("pooler", "mlm"), heads_of=...,
                                             with_heads=..., layout=families.Layout(...),
                                             hf=families.HFNames(model_type="modernbert", ...)))
                                         (models/records/__init__.py imports every module there)
  configs/modernbert.py                  presets whose model section sets family="modernbert"

tests/test_family_record.py registers a toy family (its own config, module, mapping table and
summary) in a test and runs it through conversion, loading, fine-tuning and export: a worked example.

Rows of a mapping table (`Row`) relate one bert_jax parameter to its HF and TF names; `dense_rows`,
`norm_rows` build the usual pairs. Row kinds say how the bert_jax array relates to the canonical 2-D/1-D
matrix stored abroad: `copy` (same shape), `kernel` ([in, out]), `heads_in` ([H, N, D] <-> [H, N*D]),
`heads_bias` ([N, D] <-> [N*D]), `heads_out` ([N, D, H] <-> [N*D, H]), `flat_in` ([in, ...] <-> [in, the
rest flattened]: ModernBERT's fused q/k/v [H, 3, N, D] and GeGLU input [H, 2, F] kernels). HF stores Linear weights as
[out, in]; TF stores kernels as [in, out] except the NSP/SOP `output_weights`, which are [out, in].
Names are templates: `{i}` the layer index, `{b}` the HF base-model prefix ("bert." inside the head
classes, "" in a bare model), and whatever else the family's scopes fill in (BERT's TF names use `{t}`
for the encoder's scope and `{e}` for the embeddings').
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Mapping

import flax.linen as nn
import jax
import numpy as np

from bert_jax.errors import UserError
from bert_jax.models.config import ModelConfig

Config = Any  # a family's frozen config dataclass (ModelConfig for BertModel's families)


@dataclasses.dataclass(frozen=True)
class Row:
  """One parameter: `part` (the group it belongs to: "backbone", a pretraining head, "projection",
  "adapters", "task"), its bert_jax path, its HF and TF name templates (None: no such name), its kind."""
  part: str
  ours: str
  hf: str | None
  tf: str | None
  kind: str


def norm_rows(ours: str, hf: str, tf: str | None, part: str = "backbone") -> list[Row]:
  """A LayerNorm: scale/bias <-> HF weight/bias, TF gamma/beta."""
  return [Row(part, f"{ours}/scale", f"{hf}.weight", tf and f"{tf}/gamma", "copy"),
          Row(part, f"{ours}/bias", f"{hf}.bias", tf and f"{tf}/beta", "copy")]


def dense_rows(ours: str, hf: str, tf: str | None, part: str = "backbone", kind: str = "kernel",
               bias_kind: str = "copy", hf_weight: str = ".weight", tf_kernel: str = "/kernel") -> list[Row]:
  """A dense layer: kernel/bias <-> HF weight/bias, TF kernel/bias."""
  return [Row(part, f"{ours}/kernel", f"{hf}{hf_weight}", tf and f"{tf}{tf_kernel}", kind),
          Row(part, f"{ours}/bias", f"{hf}.bias", tf and f"{tf}/bias", bias_kind)]


def hf_only(rows: Iterable[Row], part: str | None = None) -> tuple[Row, ...]:
  """`rows` without TF names (and moved to `part`, when given)."""
  return tuple(Row(part or r.part, r.ours, r.hf, None, r.kind) for r in rows)


LayerSlot = tuple[int, str, bool]  # (foreign layer index, bert_jax path prefix, stacked on a leading axis)


def _no_constants(config: Config) -> list[tuple[Row, np.ndarray]]:
  del config
  return []


def _no_unpad(config: Config) -> str:
  del config
  return "its encoder takes no unpad_index"


@dataclasses.dataclass(frozen=True, eq=False)
class Layout:
  """A family's mapping table and how it lays over a config.

  global_rows: the parameters outside the layers; layer_rows: one layer's (paths relative to the
  layer's prefix), or a function of the config giving them (a layer whose parts the config counts,
  as MobileBERT's stacked feed-forward networks); adapter_rows: Houlsby adapters in one layer (HF names only; () where the family has
  no adapter export). parts(config): the row parts the config has (always "backbone"; the pretraining
  heads switched on; "adapters" where it has adapters). layer_slots(config): where each foreign layer
  sits in the params. constants(config): foreign tensors without a bert_jax parameter, fixed by the
  config (written as these values, checked on read: ALBERT's E -> H projection is the identity when
  E == H). relayout(params, config, scan_layers): the params re-arranged for stacked or unrolled
  layers (None: the family has one arrangement). slot_rows(config, prefix): the rows of the layer at a
  slot's prefix, for a family with more than one kind of layer (T5's encoder and decoder layers; None:
  every slot has `layer_rows`, which then lists every kind's rows).
  """
  global_rows: tuple[Row, ...]
  layer_rows: tuple[Row, ...] | Callable[[Config], tuple[Row, ...]]
  parts: Callable[[Config], frozenset[str]]
  layer_slots: Callable[[Config], list[LayerSlot]]
  adapter_rows: tuple[Row, ...] = ()
  constants: Callable[[Config], list[tuple[Row, np.ndarray]]] = _no_constants
  relayout: Callable[[dict, Config, bool], dict] | None = None
  slot_rows: Callable[[Config, str], tuple[Row, ...]] | None = None

  def rows_at(self, config: Config, prefix: str) -> tuple[Row, ...]:
    """The rows of the layer at the slot `prefix`."""
    return self.rows_in_layer(config) if self.slot_rows is None else tuple(self.slot_rows(config, prefix))

  def rows_in_layer(self, config: Config) -> tuple[Row, ...]:
    """One layer's rows for `config`, adapters included where it has them."""
    rows = self.layer_rows(config) if callable(self.layer_rows) else self.layer_rows
    return tuple(rows) + (self.adapter_rows if "adapters" in self.parts(config) else ())


@dataclasses.dataclass(frozen=True)
class Architecture:
  """A HF class of the family: its name, the pretraining heads it holds, and whether its state dict
  prefixes the base model (BertForMaskedLM: "bert.embeddings..."; BertModel: "embeddings...")."""
  name: str
  heads: frozenset[str]
  prefixed: bool


@dataclasses.dataclass(frozen=True, eq=False)
class HFNames:
  """The family in Hugging Face transformers.

  model_type: config.json's model_type; class_prefix: of its classes (Bert -> BertForMaskedLM,
  BertForSequenceClassification); base_prefix: the base model's prefix in the head classes' state
  dicts ("bert."); architectures: the pretraining classes, preferred first. read_config(hf_config,
  heads, scan_layers, source) -> the family's config with those heads on (`family` set to this
  family's name where the config does not read it off its fields); write_config(config) -> the keys
  of config.json besides "architectures" and "model_type". tied: {name: the name it repeats} (an MLM decoder tied to the
  word embeddings); buffers: suffixes of non-parameter tensors to ignore. task_rows: per head kind,
  the rows of a fine-tuned head that replace the kind's default ones (bert_jax/models/head_kinds.py);
  no_task_export: per head kind, why the family's HF class for it differs from bert_jax's head.
  task_classes: per head kind, the class suffix that replaces the kind's (XLNet's span head exports as
  XLNetForQuestionAnsweringSimple, not the beam-search XLNetForQuestionAnswering).
  absent: {HF name template: value} of parameters bert_jax has and HF's classes leave out because the
  module never reads them (ModernBERT's layer-0 attention norm, an identity in HF): filled with the
  value on read, not written. tokenizer_class, tokenizer_settings: tokenizer_config.json's for a
  tokenizer of the family's kind (another kind gets its generic class); lower_case: the default when a
  checkpoint's tokenizer_config.json does not say. token_ids: {config.json key: the exported tokenizer's
  role} for the special token ids the HF config keeps (ModernBERT's cls/sep/bos/eos_token_id).
  """
  model_type: str
  class_prefix: str
  base_prefix: str
  architectures: tuple[Architecture, ...]
  read_config: Callable[[dict, tuple[str, ...], bool, str], Config]
  write_config: Callable[[Config], dict]
  tokenizer_class: str
  tied: Mapping[str, str] = dataclasses.field(default_factory=dict)
  buffers: tuple[str, ...] = ()
  task_rows: Mapping[str, tuple[Row, ...]] = dataclasses.field(default_factory=dict)
  no_task_export: Mapping[str, str] = dataclasses.field(default_factory=dict)
  task_classes: Mapping[str, str] = dataclasses.field(default_factory=dict)
  absent: Mapping[str, float] = dataclasses.field(default_factory=dict)
  tokenizer_settings: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  lower_case: bool = True
  token_ids: Mapping[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, eq=False)
class TFNames:
  """The family in original TF1 checkpoints (google-research/bert, albert, electra).

  config_file: the json beside the checkpoint; detect(tensors): whether a checkpoint holds this
  family; scopes(tensors, part, source) -> (the names that fill the TF templates, notes): `part`
  picks one model of a checkpoint holding several (ELECTRA's "discriminator"/"generator");
  own_heads(names, heads): the heads that belong to the model read (default: all found);
  read_config(tensors, names, settings, heads, scan_layers, source) -> (config, notes): `settings`
  is the config json ({} when there is none), `tensors` also answers .shape(name);
  write_scopes(config): the names to write under; write_config(config) -> (the json, notes).
  """
  config_file: str
  detect: Callable[[Mapping], bool]
  scopes: Callable[[Mapping, str | None, str], tuple[dict[str, str], list[str]]]
  read_config: Callable[[Mapping, dict, dict, tuple[str, ...], bool, str], tuple[Config, list[str]]]
  write_scopes: Callable[[Config], dict[str, str]]
  write_config: Callable[[Config], tuple[dict, list[str]]]
  own_heads: Callable[[dict, tuple[str, ...]], tuple[str, ...]] = lambda names, heads: heads


@dataclasses.dataclass(frozen=True)
class Flops:
  """A family's analytic FLOP counts (training/benchmark.py, `bert-jax compile`'s MFU) where BERT's formula
  over ModelConfig's fields does not describe it."""
  forward: Callable[[Config, int, int, int], float]  # (config, batch, seq, predictions): one forward pass
  attention: Callable[[Config, int, int], float]  # (config, batch, seq): the scores and weighted sums


@dataclasses.dataclass(frozen=True, eq=False)
class Family:
  """Everything bert_jax knows about one model family (see the module docstring).

  config: the config dataclass; module(config) -> the Flax module. heads: the pretraining heads the
  family can carry, in the order they are named; heads_of(config): those switched on;
  with_heads(config, heads): the config with exactly those on; pretrained_heads(present): the heads a
  checkpoint holding `present` was pretrained with (what it lacks is named to the user). tokenizer:
  the kind its checkpoints ship (wordpiece | sentencepiece | bpe). Fine-tuning heads
  (models/head_kinds.py): summary_heads: the pretraining heads a sequence-level head reads from the
  encoder (BERT: its pooler); summary: a Flax module class, summary(config)(out: ModelOutput,
  attention_mask, deterministic) -> [B, H], that such a head owns (params under head/summary; XLNet's
  last-token summary, ModernBERT's head), or None to read `out.pooled_output`; token_transform: the
  same for token-level heads, -> [B, T, H] (params under head/token_transform; ModernBERT's head
  before its token and span classifiers), or None to read `out.last_hidden_state`. with_dropout(config,
  hidden, attention): the config with the dropout rates a fine-tuning or inference run sets (BERT's
  `hidden_dropout` and `attention_dropout` by default; ModernBERT has embedding, MLP and attention
  dropouts instead). backbone_params(model section) -> int: the backbone's parameter count from a
  config's model section (`bert-jax presets`), for a family whose sizes BERT's formula does not describe;
  flops: its FLOP counts (`Flops`), for the same reason (None: BERT's formula, and BertModel's heads-only
  last layer). packs: the module takes several sentences per row (`document_ids` and `position_ids`;
  sbert/embed.py packs short sentences). layer_losses: its layers are transformer layers whose hidden states
  and attention a teacher's can be matched to (distillation's hidden, attention and PKD losses; not the
  BiLSTM student's, whose hidden_size is a ReLU layer's width). adapters: its layers take Houlsby adapters
  (`model.adapter_size`, fine-tuning's train.mode=adapters: BertModel's families). unpad_refusal(config): why
  the encoder cannot run a batch's real tokens packed into fewer rows (models/unpad.py, data.unpad), '' when it
  can (an encoder whose __call__ takes `unpad_index`: BertModel's families, ModernBERT).
  """
  name: str
  config: type
  module: Callable[[Config], nn.Module]
  heads: tuple[str, ...]
  heads_of: Callable[[Config], tuple[str, ...]]
  with_heads: Callable[[Config, Iterable[str]], Config]
  pretrained_heads: Callable[[tuple[str, ...]], tuple[str, ...]]
  layout: Layout
  tokenizer: str
  hf: HFNames | None = None
  tf: TFNames | None = None
  summary_heads: tuple[str, ...] = ("pooler",)
  summary: Callable[..., nn.Module] | None = None
  token_transform: Callable[..., nn.Module] | None = None
  with_dropout: Callable[[Config, float, float], Config] = (
      lambda config, hidden, attention: config.replace(hidden_dropout=hidden, attention_dropout=attention))
  backbone_params: Callable[[Mapping[str, Any]], int] | None = None
  flops: Flops | None = None
  packs: bool = False
  layer_losses: bool = True
  adapters: bool = False
  unpad_refusal: Callable[[Config], str] = _no_unpad
  # A pretraining run's params as conversion reads them: the encoder's tree out of a tree holding several
  # networks (DeBERTa-v3's generator and discriminator, models/deberta.py:from_pretraining); as they are by default.
  from_pretraining: Callable[[Mapping[str, Any]], Mapping[str, Any]] = lambda params: params
  # The config file a pretraining run's `done:` line names for fine-tuning it (its `embedded` preset offline).
  finetune_config: str = "configs/glue.py"



def stack_slots(stack: str, count: int, scanned: bool) -> list[LayerSlot]:
  """One slot per layer of a stack (e.g. "encoder"): its stacked `layers` (scanned) or unrolled `layer_{i}`."""
  return [(i, f"{stack}/layers" if scanned else f"{stack}/layer_{i}", scanned) for i in range(count)]


def restack(tree: Mapping, count: int, scanned: bool) -> dict:
  """A stack's params moved from stacked `layers` (scanned) to unrolled `layer_{i}`, or back."""
  tree = dict(tree)
  if scanned:
    stacked = tree.pop("layers")
    tree.update({f"layer_{i}": jax.tree.map(lambda x, i=i: np.asarray(x)[i], stacked) for i in range(count)})
  else:
    layers = [tree.pop(f"layer_{i}") for i in range(count)]
    tree["layers"] = jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *layers)
  return tree


def encoder_slots(config: Config) -> list[LayerSlot]:
  """The slots of a family whose layers are one `encoder` stack of config.num_layers."""
  return stack_slots("encoder", config.num_layers, config.scan_layers)


def encoder_relayout(params: Mapping, config: Config, scan_layers: bool) -> dict:
  """`params` re-arranged for stacked (scan_layers) or unrolled layer_{i} layers of the one `encoder` stack."""
  if config.scan_layers == scan_layers:
    return dict(params)
  return {**params, "encoder": restack(params["encoder"], config.num_layers, config.scan_layers)}

_FAMILIES: dict[str, Family] = {}
_BY_MODEL_TYPE: dict[str, Family] = {}


def register(family: Family) -> Family:
  """Adds `family` to the registry (its module calls this once, at import); returns it."""
  if family.name in _FAMILIES:
    raise ValueError(f"family {family.name!r} is registered twice")
  if family.hf is not None:
    if family.hf.model_type in _BY_MODEL_TYPE:
      raise ValueError(f"HF model_type {family.hf.model_type!r} is claimed by two families")
    _BY_MODEL_TYPE[family.hf.model_type] = family
  _FAMILIES[family.name] = family
  return family


def names() -> tuple[str, ...]:
  return tuple(_FAMILIES)


def all_families() -> tuple[Family, ...]:
  return tuple(_FAMILIES.values())


def get(name: str) -> Family:
  if name not in _FAMILIES:
    raise UserError(f"model.family={name!r} is not one of {names()}")
  return _FAMILIES[name]


def by_model_type(model_type: str | None, source: str, architecture: str = "?") -> Family:
  """The family of a HF config.json's model_type; UserError naming the supported ones."""
  if model_type not in _BY_MODEL_TYPE:
    raise UserError(f"{source}: unknown architecture {architecture} (model_type {model_type!r}); "
                    f"supported model types: {', '.join(_BY_MODEL_TYPE)}")
  return _BY_MODEL_TYPE[model_type]


def model_config(values: Mapping[str, Any]) -> Config:
  """The config object of a saved "model" dict (or a run config's model section, as a dict)."""
  name = values.get("family") or ""
  config_class = get(name).config if name else ModelConfig
  return config_class.from_dict(values)


def of(config: Config) -> Family:
  return get(config.family)


def build(config: Config) -> nn.Module:
  """The Flax module of `config`'s family (BertModel for BERT, RoBERTa, ALBERT and ELECTRA; ModernBertModel)."""
  return of(config).module(config)
