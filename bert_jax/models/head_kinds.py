"""The fine-tuning head kinds (classification, regression, token, span), one `HeadKind` record each.

A kind maps to its Flax module (its parameters under `head/`), its loss as an additive sum and the
count that divides it, SMART's divergence between two of its outputs, the records a prediction
becomes, and its Hugging Face class, default rows and config keys. finetune/ (model, objective,
SMART, predict) and conversion/ (export) read the record; a new kind is one `register` here.

  classification / regression: the family's summary of the sequence (`Family.summary`; BERT: the
    pooled [CLS] vector) or, with pooling=layer_mix, a learned mix of every layer's [CLS] vector,
    dropout, dense -> logits [B, C] (regression: one value [B])
  token: every position's vector (through `Family.token_transform` where the family has one),
    dropout, dense -> logits [B, T, C]
  span: every position's vector (the same), dense -> start and end logits [B, T], padding masked out
  xlnet_beam: XLNet's SQuAD v2 head (models/xlnet_qa.py, Hugging Face's XLNetForQuestionAnswering): start
    logits, end logits conditioned on a start, an answer-class logit; in training the end is conditioned on
    the gold start (the batch's start_positions), at inference on each of the start_n_top best starts
  ranking: the sequence summary as classification reads it, dropout, dense -> one relevance score per
    (question, candidate) row, Rel = w^T x [B]; in training the rows come in groups [G, K] (MT-DNN's
    pairwise ranking, finetune/ranking.py)
Token and span heads with pooling=layer_mix read the same mix of every layer's vector at each position
instead of the last layer's (the BERT paper's feature-based NER mixes layers this way).

Losses are sums over rows (or labelled tokens) divided by a count that depends on the data only, so
micro-batches give exactly the full batch's gradient (training/step.py):
  classification: cross-entropy / rows; regression: squared error / rows;
  token: cross-entropy / labelled tokens; span: (start + end cross-entropy) / 2 / rows;
  xlnet_beam: ((start + end cross-entropy) / 2 + 0.5 * the answer class's binary cross-entropy against
    is_impossible) / rows (transformers' total_loss; XLNet's run_squad.py);
  ranking: -log softmax_k(scale * Rel_k)[positive] over each group's unmasked candidates / groups.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from bert_jax.errors import UserError
from bert_jax.models import bert, families, isobn, xlnet_qa
from bert_jax.models.dropout import Dropout
from bert_jax.models.families import Row, dense_rows, hf_only, norm_rows
from bert_jax.ops import distill_losses

Array = jax.Array
Batch = Mapping[str, Array]
POOLINGS = ("pooled", "layer_mix")
CLS_NORMS = ("none", "isobn")  # head.cls_norm: models/isobn.py


class LayerMix(nn.Module):
  """[L+1, B, ..., H] -> [B, ..., H]: gamma * sum_l softmax(w)_l h_l ([CLS] vectors or every token's)."""

  @nn.compact
  def __call__(self, layers: Array) -> Array:
    # Not named "layers": that logical name marks scanned, stacked layer weights.
    weights = self.param("layer_weights", nn.with_logical_partitioning(nn.initializers.zeros_init(),
                                                                       (None,)), (layers.shape[0],))
    gamma = self.param("gamma", nn.with_logical_partitioning(nn.initializers.ones_init(), ()), ())
    mixed = jnp.tensordot(jax.nn.softmax(weights), layers.astype(jnp.float32), axes=1)
    return (gamma * mixed).astype(layers.dtype)


class _Head(nn.Module):
  """The fields every head module takes (FinetuneModel builds it as `head`)."""
  config: Any
  num_labels: int
  pooling: str = "pooled"
  dropout: float = 0.1

  def tokens(self, out: bert.ModelOutput, attention_mask: Array, deterministic: bool) -> Array:
    """[B, T, H]: the layer mix of every layer's vectors, or the family's token transform of the last
    layer's (its own module under head/token_transform), or the last layer's as they are."""
    if self.pooling == "layer_mix":
      return LayerMix(name="layer_mix")(out.hidden_states)
    transform = families.of(self.config).token_transform
    if transform is None:
      return out.last_hidden_state
    return transform(self.config, name="token_transform")(out, attention_mask, deterministic)


class SequenceHead(_Head):
  """classification (logits [B, C]) and, with regression=True, regression (one value [B]). cls_norm="isobn":
  the summary vector is normalised first (models/isobn.py); in training the outputs then carry
  `state_loss`, which the objective adds to the loss."""
  regression: bool = False
  cls_norm: str = "none"

  @nn.compact
  def __call__(self, out: bert.ModelOutput, attention_mask: Array, deterministic: bool) -> dict[str, Array]:
    drop = Dropout(self.dropout)
    if self.pooling == "layer_mix":
      h = LayerMix(name="layer_mix")(out.hidden_states[:, :, 0])
    else:
      h = summarize(self.config, out, attention_mask, deterministic)
    state_loss = None
    if self.cls_norm == "isobn":
      h, state_loss = isobn.IsoBN(name="cls_norm")(h, deterministic)
    logits = bert.dense(self.config, self.num_labels, ("embed", "classes"), "classifier")(
        drop(h, deterministic=deterministic)).astype(jnp.float32)
    outputs = {"logits": logits[:, 0] if self.regression else logits}
    return outputs if state_loss is None else {**outputs, "state_loss": state_loss}


def summarize(config: Any, out: bert.ModelOutput, attention_mask: Array, deterministic: bool) -> Array:
  """[B, H]: the family's summary of each row (its own module under head/summary, or the pooled output)."""
  summary = families.of(config).summary
  if summary is None:
    return out.pooled_output
  return summary(config, name="summary")(out, attention_mask, deterministic)


class TokenHead(_Head):
  @nn.compact
  def __call__(self, out: bert.ModelOutput, attention_mask: Array, deterministic: bool) -> dict[str, Array]:
    drop = Dropout(self.dropout)
    h = drop(self.tokens(out, attention_mask, deterministic), deterministic=deterministic)
    return {"logits": bert.dense(self.config, self.num_labels, ("embed", "classes"), "classifier")(h)
                      .astype(jnp.float32)}


class SpanHead(_Head):
  @nn.compact
  def __call__(self, out: bert.ModelOutput, attention_mask: Array, deterministic: bool) -> dict[str, Array]:
    tokens = self.tokens(out, attention_mask, deterministic)
    logits = bert.dense(self.config, 2, ("embed", "classes"), "span")(tokens).astype(jnp.float32)
    logits = jnp.where(attention_mask[..., None] > 0, logits, -1e9)
    return {"start_logits": logits[..., 0], "end_logits": logits[..., 1]}


def symmetric_kl(p_logits: Array, q_logits: Array) -> Array:
  """KL(P||Q) + KL(Q||P) over the last axis, from logits: [..., C] -> [...]."""
  log_p, log_q = jax.nn.log_softmax(p_logits, axis=-1), jax.nn.log_softmax(q_logits, axis=-1)
  return jnp.sum((jnp.exp(log_p) - jnp.exp(log_q)) * (log_p - log_q), axis=-1)


def _per_row(batch: Batch) -> Array:
  # attention_mask: the padded batch's rows, also where input_ids are packed rows (models/unpad.py); a batch
  # without one (a ranking group's scores alone) counts its input_ids' rows
  return jnp.asarray(batch.get("attention_mask", batch["input_ids"]).shape[0], jnp.float32)


def _per_labelled_token(batch: Batch) -> Array:
  return jnp.maximum(jnp.sum(batch["label_weights"]), 1.0)


def _xent(logits: Array, labels: Array) -> Array:
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels)


def ranking_logits(outputs: dict[str, Array], batch: Batch) -> Array:
  """[G, K]: scale * Rel per candidate, the padded candidates (candidate_mask 0) at -1e30 (weight 0)."""
  scaled = batch["scale"][:, None] * outputs["logits"]
  return jnp.where(batch["candidate_mask"] > 0, scaled, -1e30)


def ranking_loss(outputs: dict[str, Array], batch: Batch) -> Array:
  """The sum over groups of -log(exp(g Rel(Q, A+)) / sum_{A' in the group} exp(g Rel(Q, A'))); label [G]: the
  positive's index in its group."""
  log_p = jax.nn.log_softmax(ranking_logits(outputs, batch), axis=-1)
  return -jnp.sum(jnp.take_along_axis(log_p, batch["label"][:, None], axis=-1))


def _class_records(outputs: dict[str, np.ndarray], labels: tuple[str, ...]) -> list[dict]:
  logits = outputs["logits"].astype(np.float64)
  probabilities = np.exp(logits - logits.max(axis=-1, keepdims=True))
  probabilities /= probabilities.sum(axis=-1, keepdims=True)
  return [{"label": labels[int(i)], "score": float(p[i]), "scores": dict(zip(labels, map(float, p)))}
          for i, p in zip(np.argmax(logits, axis=-1), probabilities)]


def _labelled(problem_type: str | None = None) -> Callable[[tuple[str, ...]], dict]:
  """HF config keys for a head with these class names (regression: one output, HF's default name)."""
  def keys(labels: tuple[str, ...]) -> dict:
    names = labels or ("LABEL_0",)
    d = dict(num_labels=len(names), id2label=dict(enumerate(names)), label2id={n: i for i, n in enumerate(names)})
    return {**d, "problem_type": problem_type} if problem_type else d
  return keys


@dataclasses.dataclass(frozen=True, eq=False)
class HeadKind:
  """One head kind (see the module docstring).

  module: the Flax module class (config, num_labels, pooling, dropout), called as
  (out: ModelOutput, attention_mask, deterministic) -> outputs; reads_summary: it reads the family's
  sequence summary (so the encoder keeps `Family.summary_heads`). loss(outputs, batch) -> the summed
  loss; count(batch) -> what divides it; divergence(a, b, batch) -> SMART's l_s between two outputs,
  summed like the loss. records(outputs, labels) -> one prediction record per row (None: the task
  module decodes, as token and span outputs need the featurization). hf_class: the suffix of the HF
  class (Bert + ForSequenceClassification); hf_rows: its head's rows (a family may override them,
  `HFNames.task_rows`); hf_config(labels) -> the keys its config.json adds. distill_soft(student logits,
  teacher logits, temperature, soft_loss) -> the summed soft-target loss of task distillation and Theseus
  (a kind with one logits row per example; None: such jobs refuse the kind).
  """
  name: str
  module: Callable[..., nn.Module]
  reads_summary: bool
  loss: Callable[[dict[str, Array], Batch], Array]
  count: Callable[[Batch], Array]
  divergence: Callable[[dict[str, Array], dict[str, Array], Batch], Array]
  hf_class: str
  hf_rows: tuple[Row, ...]
  hf_config: Callable[[tuple[str, ...]], dict]
  records: Callable[[dict[str, np.ndarray], tuple[str, ...]], list[dict]] | None = None
  hf_read: bool = False
  label_inputs: tuple[str, ...] = ()
  distill_soft: Callable[[Array, Array, float, str], Array] | None = None

  def build(self, config: Any, num_labels: int, pooling: str, dropout: float, cls_norm: str = "none") -> nn.Module:
    """The head module; cls_norm (head.cls_norm: none | isobn) only for the kinds that read the summary."""
    if cls_norm not in CLS_NORMS:
      raise UserError(f"head.cls_norm={cls_norm!r} is not one of {CLS_NORMS}")
    if cls_norm == "none":
      return self.module(config=config, num_labels=num_labels, pooling=pooling, dropout=dropout)
    if not self.reads_summary:
      raise UserError(f"head.cls_norm={cls_norm!r} normalises the [CLS] vector of sequence heads; a {self.name} "
                      "head reads every token")
    return self.module(config=config, num_labels=num_labels, pooling=pooling, dropout=dropout, cls_norm=cls_norm)

  def encoder_config(self, config: Any, pooling: str) -> Any:
    """The encoder without pretraining heads; the summary's heads (BERT's pooler) only where this head
    reads them."""
    family = families.of(config)
    return family.with_heads(config, family.summary_heads if self.reads_summary and pooling == "pooled" else ())


_KINDS: dict[str, HeadKind] = {}


def register(kind: HeadKind) -> HeadKind:
  if kind.name in _KINDS:
    raise ValueError(f"head kind {kind.name!r} is registered twice")
  _KINDS[kind.name] = kind
  return kind


def names() -> tuple[str, ...]:
  return tuple(_KINDS)


def get(name: str) -> HeadKind:
  if name not in _KINDS:
    raise UserError(f"head kind {name!r} is not one of {names()}")
  return _KINDS[name]


def distillable() -> str:
  """The kinds task distillation and Theseus take (a `distill_soft`), as a message names them."""
  return " and ".join(k for k, v in _KINDS.items() if v.distill_soft is not None)


_CLASSIFIER = hf_only(dense_rows("head/classifier", "classifier", None), part="task")

register(HeadKind(
    name="classification", module=SequenceHead, reads_summary=True,
    loss=lambda outputs, batch: jnp.sum(_xent(outputs["logits"], batch["label"])),
    count=_per_row,
    divergence=lambda a, b, batch: jnp.sum(symmetric_kl(a["logits"], b["logits"])),
    records=_class_records,
    hf_class="ForSequenceClassification", hf_rows=_CLASSIFIER,
    hf_config=_labelled("single_label_classification"),
    distill_soft=lambda s, t, temperature, soft_loss: (distill_losses.logit_mse_sum(s, t) if soft_loss == "logit_mse"
                                                       else distill_losses.soft_target_sum(s, t, temperature))))

register(HeadKind(
    name="regression", module=lambda **fields: SequenceHead(**fields, regression=True), reads_summary=True,
    loss=lambda outputs, batch: jnp.sum(jnp.square(outputs["logits"] - batch["label"])),
    count=_per_row,
    divergence=lambda a, b, batch: jnp.sum(jnp.square(a["logits"] - b["logits"])),
    records=lambda outputs, labels: [{"value": float(v)} for v in outputs["logits"]],
    hf_class="ForSequenceClassification", hf_rows=_CLASSIFIER, hf_config=_labelled("regression"),
    distill_soft=lambda s, t, temperature, soft_loss: jnp.sum(jnp.square(s - t))))

register(HeadKind(
    name="token", module=TokenHead, reads_summary=False,
    loss=lambda outputs, batch: jnp.sum(_xent(outputs["logits"], batch["token_labels"]) * batch["label_weights"]),
    count=_per_labelled_token,
    divergence=lambda a, b, batch: jnp.sum(symmetric_kl(a["logits"], b["logits"]) * batch["label_weights"]),
    hf_class="ForTokenClassification", hf_rows=_CLASSIFIER, hf_config=_labelled()))

register(HeadKind(
    name="span", module=SpanHead, reads_summary=False,
    loss=lambda outputs, batch: jnp.sum(_xent(outputs["start_logits"], batch["start_positions"])
                                        + _xent(outputs["end_logits"], batch["end_positions"])) / 2,
    count=_per_row,
    divergence=lambda a, b, batch: jnp.sum(symmetric_kl(a["start_logits"], b["start_logits"])
                                           + symmetric_kl(a["end_logits"], b["end_logits"])) / 2,
    # HF's QA classes read num_labels=2 (start, end), its default.
    hf_class="ForQuestionAnswering", hf_rows=hf_only(dense_rows("head/span", "qa_outputs", None), part="task"),
    hf_config=lambda labels: {}))

register(HeadKind(
    name="ranking", module=lambda **fields: SequenceHead(**fields, regression=True), reads_summary=True,
    loss=ranking_loss, count=_per_row,  # rows: groups
    divergence=lambda a, b, batch: jnp.sum(symmetric_kl(ranking_logits(a, batch), ranking_logits(b, batch))),
    # The scores alone say nothing of a label: finetune/ranking.py converts each group's (predict too).
    # HF: a 1-label BertForSequenceClassification whose one logit is Rel(Q, A) (scale not applied).
    hf_class="ForSequenceClassification", hf_rows=_CLASSIFIER,
    hf_config=lambda labels: dict(num_labels=1, id2label={0: "relevance"}, label2id={"relevance": 0})))


def beam_loss(outputs: dict[str, Array], batch: Batch) -> Array:
  """Summed over rows: (start + end cross-entropy) / 2 + 0.5 * BCE(cls_logits, is_impossible), the end
  logits conditioned on the gold start (models/xlnet_qa.py's training outputs)."""
  spans = (_xent(outputs["start_logits"], batch["start_positions"])
           + _xent(outputs["end_logits"], batch["end_positions"])) / 2
  answer = optax.sigmoid_binary_cross_entropy(outputs["cls_logits"], batch["is_impossible"])
  return jnp.sum(spans + 0.5 * answer)


register(HeadKind(
    name="xlnet_beam", module=xlnet_qa.BeamSpanHead, reads_summary=False,
    loss=beam_loss, count=_per_row,
    divergence=lambda a, b, batch: jnp.sum(symmetric_kl(a["start_logits"], b["start_logits"])
                                           + symmetric_kl(a["end_logits"], b["end_logits"])) / 2,
    hf_class="",  # XLNet's record names XLNetForQuestionAnswering
    hf_rows=hf_only(dense_rows("head/start_logits", "start_logits.dense", None)
                    + dense_rows("head/end_logits/dense_0", "end_logits.dense_0", None)
                    + norm_rows("head/end_logits/layer_norm", "end_logits.LayerNorm", None)
                    + dense_rows("head/end_logits/dense_1", "end_logits.dense_1", None)
                    + dense_rows("head/answer_class/dense_0", "answer_class.dense_0", None)
                    + dense_rows("head/answer_class/dense_1", "answer_class.dense_1", None)[:1], part="task"),
    hf_config=lambda labels: {}, hf_read=True, label_inputs=("start_positions",)))
