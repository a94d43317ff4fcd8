"""MobileBERT's progressive knowledge transfer from an IB-BERT teacher (Sun et al. 2020, sec. 3.3-3.5 and 4.4),
then pre-training distillation: objective `mobilebert_pkt` (configs/mobilebert.py:pkt_tiny, pkt).

With L layers and S = distill.stage_steps, the step numbered s (0-based) is in stage min(s // S, L):
  stage l < L (progressive knowledge transfer): layer l (and, in stage 0, the embeddings) trains, every other
    parameter is frozen, on
      feature_weight x FMT_l + attention_weight x AT_l
    FMT_l: the mean over real tokens and the width of (h_l^teacher - h_l^student)^2, h_l the output of layer
           l (the inter-block width, the same in both; the paper's feature-map transfer, plain MSE);
    AT_l:  the mean over real queries and the heads of KL(a_l^teacher || a_l^student) of the attention rows
           (attention transfer: the teacher has the student's head count);
  stage L (pre-training distillation, the rest of train.num_steps): every parameter trains on
      alpha x MLM + (1 - alpha) x T^2 KL(teacher's MLM soft targets || student's) + NSP
    (the paper's alpha = 0.5, T = 1).
The stage is a function of the state's step, so a run resumed from a checkpoint on either side of a stage
boundary follows the same schedule. Freezing is exact (training/step.py:staged_step): the frozen
parameters get no gradient (so neither the global-norm clip nor grad_norm counts them) and keep their values
bit for bit (weight decay and the Adam moments of an earlier stage would otherwise still move them). The
learning-rate schedule is the run's one schedule over all stages. Evaluation has no teacher: it reports the
student's own MLM and NSP. Train metrics add `stage`, every layer's feature_loss_l<i> and
attention_loss_l<i> (whatever the stage, so each layer's loss can be followed), transfer_loss and soft_loss.
Memory: student and teacher keep every layer's hidden states and attention probabilities (float32
[L, B, N, T, T] each) in every stage; train.grad_accum_steps bounds B.
"""
from __future__ import annotations

import copy
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from bert_jax import workdir as workdir_lib
from bert_jax.errors import UserError
from bert_jax.models import families
from bert_jax.models.mobilebert import MobileBertConfig
from bert_jax.ops import distill_losses as losses
from bert_jax.training.objectives.base import Batch, model_inputs
from bert_jax.training.objectives.bert import BertPretraining
from bert_jax.training.objectives.distill_mlm import FrozenTeacher
from bert_jax.training.objectives.registry import register

TRANSFER = ("feature", "attention")  # the per-layer losses, each summed over real tokens: [L]


class ProgressiveTransfer(FrozenTeacher, BertPretraining):
  """The student (a MobileBertModel), the IB-BERT teacher, and the stage schedule (module docstring)."""

  def __init__(self, model_config: MobileBertConfig, teacher_config: MobileBertConfig, teacher_location: str,
               cfg: ml_collections.ConfigDict):
    super().__init__(model_config)
    self.teacher, self.teacher_location = families.build(teacher_config), teacher_location
    self.num_layers, self.stage_steps = model_config.num_layers, int(cfg.stage_steps)
    self.weights = {name: float(cfg[f"{name}_weight"]) for name in TRANSFER}
    self.alpha, self.temperature = float(cfg.alpha), float(cfg.temperature)
    self.teacher_params, self.stage = None, None

  def _bound(self, **changes) -> "ProgressiveTransfer":
    bound = copy.copy(self)
    bound.__dict__.update(changes)
    return bound

  def with_teacher(self, teacher_params: Any) -> "ProgressiveTransfer":
    return self._bound(teacher_params=teacher_params)

  def at_stage(self, stage: jax.Array) -> "ProgressiveTransfer":
    return self._bound(stage=stage)

  def stage_of(self, step: jax.Array) -> jax.Array:
    return jnp.minimum(step // self.stage_steps, self.num_layers).astype(jnp.int32)

  def trains(self, stage: jax.Array, params: Any) -> Any:
    """Stage l < L: encoder layer l, and the embeddings when l = 0; stage L: everything. Scanned layers are
    stacked [L, ...]: their entry is a [L, 1, ...] column."""
    distilling = stage >= self.num_layers

    def of(path, leaf):
      top = path[0].key
      if top == "embeddings":
        return distilling | (stage == 0)
      if top != "encoder":  # pooler and heads: pre-training distillation only
        return distilling
      name = path[1].key
      if name == "layers":
        column = (jnp.arange(leaf.shape[0]) == stage) | distilling
        return column.reshape((-1,) + (1,) * (leaf.ndim - 1))
      return distilling | (stage == int(name.rsplit("_", 1)[1]))

    return jax.tree_util.tree_map_with_path(of, params)

  def counts(self, batch: Batch) -> dict[str, jax.Array]:
    return {**super().counts(batch), "tokens": jnp.sum(batch["input_mask"].astype(jnp.float32))}

  def sums(self, params: Any, batch: Batch, rng: jax.Array | None, deterministic: bool) -> dict[str, jax.Array]:
    if self.teacher_params is None:  # evaluation: the student alone
      return super().sums(params, batch, rng, deterministic)
    if self.stage is not None:
      params = jax.tree.map(lambda p, t: jnp.where(t, p, jax.lax.stop_gradient(p)), params,
                            self.trains(self.stage, params))
    inputs = dict(**model_inputs(batch), output_hidden_states=True, output_attentions=True)
    out = self.model.apply({"params": params}, **inputs, deterministic=deterministic,
                           rngs=None if deterministic else {"dropout": rng})
    t = jax.lax.stop_gradient(self.teacher.apply({"params": self.teacher_params}, **inputs, deterministic=True))
    mask = batch["input_mask"]
    sums = self.output_sums(out, batch)
    sums["feature"] = losses.feature_map_sums(out.hidden_states[1:], t.hidden_states[1:], mask)
    sums["attention"] = losses.attention_kl_sums(out.attentions, t.attentions, mask)
    sums["soft"] = losses.soft_target_sum(out.mlm_logits, t.mlm_logits, self.temperature,
                                          batch["masked_lm_weights"])
    return sums

  def _stage(self) -> jax.Array:
    return jnp.asarray(self.num_layers if self.stage is None else self.stage, jnp.int32)

  def _transfer_loss(self, sums: dict[str, jax.Array], counts: dict[str, jax.Array]) -> jax.Array:
    layer = jnp.minimum(self._stage(), self.num_layers - 1)
    total = sum(self.weights[name] * sums[name][layer] for name in TRANSFER)
    return total / jnp.maximum(counts["tokens"], 1.0)

  def _distillation_loss(self, sums: dict[str, jax.Array], counts: dict[str, jax.Array]) -> jax.Array:
    n = jnp.maximum(counts["mlm"], 1.0)
    loss = (self.alpha * sums["mlm_loss"] + (1.0 - self.alpha) * sums["soft"]) / n
    if self.sentence != "none":
      loss = loss + sums["sentence_loss"] / counts["rows"]
    return loss

  def loss(self, sums: dict[str, jax.Array], counts: dict[str, jax.Array]) -> jax.Array:
    if "feature" not in sums:
      return super().loss(sums, counts)
    return jnp.where(self._stage() < self.num_layers, self._transfer_loss(sums, counts),
                     self._distillation_loss(sums, counts))

  def metrics(self, sums: dict[str, jax.Array], counts: dict[str, jax.Array]) -> dict[str, jax.Array]:
    metrics = super().metrics(sums, counts)
    if "feature" not in sums:
      return metrics
    tokens = jnp.maximum(counts["tokens"], 1.0)
    for name in TRANSFER:
      metrics.update({f"{name}_loss_l{i}": sums[name][i] / tokens for i in range(self.num_layers)})
    metrics.update(stage=self._stage().astype(jnp.float32), transfer_loss=self._transfer_loss(sums, counts),
                   soft_loss=sums["soft"] / jnp.maximum(counts["mlm"], 1.0))
    return metrics


def check(student: Any, teacher: Any, cfg: ml_collections.ConfigDict) -> None:
  """The student and teacher fit layer to layer and head to head; the stages and weights are valid."""
  if not isinstance(student, MobileBertConfig) or not isinstance(teacher, MobileBertConfig):
    raise UserError("objective='mobilebert_pkt' distils a MobileBERT student (model.family='mobilebert') from "
                    "a MobileBERT-family teacher (IB-BERT: configs/mobilebert.py:ib_tiny, ib_bert)")
  for name in ("num_layers", "hidden_size", "num_heads", "vocab_size"):
    if getattr(student, name) != getattr(teacher, name):
      raise UserError(f"the student's model.{name} {getattr(student, name)} differs from the teacher's "
                      f"{getattr(teacher, name)}: progressive transfer matches them layer to layer and head to head")
  if not student.mlm_head:
    raise UserError("objective='mobilebert_pkt' needs model.mlm_head=True for the student")
  if cfg.student_layers:
    raise UserError(f"distill.student_layers={cfg.student_layers!r}: the MobileBERT student is config.model; "
                    "leave it empty")
  if cfg.stage_steps < 1:  # stages past train.num_steps are allowed: a later run with more steps resumes them
    raise UserError(f"distill.stage_steps={cfg.stage_steps} must be >= 1 (steps of each of the "
                    f"{student.num_layers} layers' stages)")
  if not 0.0 <= cfg.alpha <= 1.0 or cfg.temperature <= 0 or any(cfg[f"{k}_weight"] < 0 for k in TRANSFER):
    raise UserError("distill.alpha must be in [0, 1], distill.temperature > 0 and distill.feature_weight, "
                    "attention_weight >= 0")


@register("mobilebert_pkt", bert_mlm=True)
def from_config(config: ml_collections.ConfigDict, model_config: Any) -> ProgressiveTransfer:
  """The student (config.model) and the IB-BERT teacher (distill.teacher's config.json) from a run config."""
  if "distill" not in config or "stage_steps" not in config.distill:
    raise UserError("objective='mobilebert_pkt' needs the config section `distill` (teacher, stage_steps, "
                    "feature_weight, attention_weight, alpha, temperature); start from "
                    "configs/mobilebert.py:pkt_tiny")
  teacher = families.model_config(workdir_lib.read_config(config.distill.teacher)["model"])
  check(model_config, teacher, config.distill)
  return ProgressiveTransfer(model_config, teacher, config.distill.teacher, config.distill)
