"""General (pretraining-corpus) distillation, DistilBERT's recipe: the student's masked LM learns from a
frozen teacher's soft targets at the masked positions.

  loss = hard_weight x BERT's loss (MLM, plus NSP/SOP if the student has a sentence head)
       + soft_weight x T^2 KL(softmax(teacher / T) || softmax(student / T)), mean over the predictions
       + cosine_weight x (1 - cos) of the last hidden states, mean over the real tokens

The params are the student's BertModel tree (a normal pretraining workdir comes out); the teacher's
params are a non-trained, sharded extra input of the jitted step (`with_teacher`, training/step.py:
teacher_step). Evaluation sees no teacher: it reports the student's own MLM loss and accuracy.
"""
from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from bert_jax import params_checkpoint, workdir as workdir_lib
from bert_jax.errors import UserError
from bert_jax.models.bert import BertModel
from bert_jax.models.config import ModelConfig
from bert_jax.ops import distill_losses as losses
from bert_jax.training.objectives.base import Batch, example_batch, model_inputs
from bert_jax.training.objectives.bert import BertPretraining
from bert_jax.training.objectives.registry import register

WEIGHTS = ("hard", "soft", "cosine")


class FrozenTeacher:
  """A frozen teacher model (`teacher`, its params in `teacher_location`) beside a pretraining objective:
  what objectives.TeacherObjective asks of it besides `with_teacher`."""
  teacher: Any  # the teacher's Flax module
  teacher_location: str

  def teacher_init(self, seq_len: int, max_predictions: int) -> Any:
    """The teacher's boxed abstract params (logical axis names on every leaf; nothing allocated)."""
    batch = example_batch(1, seq_len, max_predictions)
    return jax.eval_shape(lambda: self.teacher.init(jax.random.key(0), **model_inputs(batch))["params"])

  def load_teacher(self, abstract: Any) -> Any:
    """The teacher's params, restored into `abstract`'s shapes and shardings."""
    return params_checkpoint.load_params_into(self.teacher_location, abstract)


class DistillMlmPretraining(FrozenTeacher, BertPretraining):
  """BERT's objective for the student plus the teacher's soft targets (see the module docstring)."""

  def __init__(self, model_config: ModelConfig, teacher_config: ModelConfig, teacher_location: str,
               cfg: ml_collections.ConfigDict):
    super().__init__(model_config)
    self.teacher = BertModel(teacher_config)
    self.teacher_location, self.temperature = teacher_location, float(cfg.temperature)
    self.weights = {name: float(cfg[f"{name}_weight"]) for name in WEIGHTS}

  def with_teacher(self, teacher_params: Any) -> "DistillMlmPretraining":
    bound = object.__new__(DistillMlmPretraining)
    bound.__dict__.update(self.__dict__)
    bound.sums = functools.partial(self.sums, teacher_params=teacher_params)
    return bound

  def counts(self, batch: Batch) -> dict[str, jax.Array]:
    return {**super().counts(batch), "tokens": jnp.sum(batch["input_mask"].astype(jnp.float32))}

  def sums(self, params: Any, batch: Batch, rng: jax.Array | None, deterministic: bool,
           teacher_params: Any = None) -> dict[str, jax.Array]:
    out = self.apply(params, batch, rng, deterministic)
    sums = self.output_sums(out, batch)
    if teacher_params is None:
      return sums
    t = jax.lax.stop_gradient(self.teacher.apply({"params": teacher_params}, **model_inputs(batch),
                                                 deterministic=True))
    sums["soft"] = losses.soft_target_sum(out.mlm_logits, t.mlm_logits, self.temperature,
                                          batch["masked_lm_weights"])
    if self.weights["cosine"]:
      sums["cosine"] = losses.cosine_sum(out.last_hidden_state, t.last_hidden_state, batch["input_mask"])
    return sums

  def loss(self, sums: dict[str, jax.Array], counts: dict[str, jax.Array]) -> jax.Array:
    hard = super().loss(sums, counts)
    if "soft" not in sums:  # evaluation: the student alone
      return hard
    loss = self.weights["hard"] * hard + self.weights["soft"] * sums["soft"] / jnp.maximum(counts["mlm"], 1.0)
    if "cosine" in sums:
      loss = loss + self.weights["cosine"] * sums["cosine"] / jnp.maximum(counts["tokens"], 1.0)
    return loss

  def metrics(self, sums: dict[str, jax.Array], counts: dict[str, jax.Array]) -> dict[str, jax.Array]:
    metrics = super().metrics(sums, counts)
    if "soft" in sums:
      metrics["soft_loss"] = sums["soft"] / jnp.maximum(counts["mlm"], 1.0)
    if "cosine" in sums:
      metrics["cosine_loss"] = sums["cosine"] / jnp.maximum(counts["tokens"], 1.0)
    return metrics


def check_student(student: ModelConfig, teacher: ModelConfig, cfg: ml_collections.ConfigDict) -> None:
  if student.vocab_size != teacher.vocab_size:
    raise UserError(f"the student's model.vocab_size {student.vocab_size} differs from the teacher's "
                    f"{teacher.vocab_size}: the student must use the teacher's vocabulary")
  if not student.mlm_head:
    raise UserError("objective='distill_mlm' needs model.mlm_head=True for the student")
  if cfg.temperature <= 0 or any(cfg[f"{k}_weight"] < 0 for k in WEIGHTS):
    raise UserError("distill.temperature must be > 0 and every distill.*_weight >= 0")
  if not any(cfg[f"{k}_weight"] for k in WEIGHTS):
    raise UserError("every distill.*_weight is 0: switch on at least one loss")
  if cfg.cosine_weight and student.hidden_size != teacher.hidden_size:
    raise UserError(f"distill.cosine_weight needs the student's hidden_size ({student.hidden_size}) to "
                    f"equal the teacher's ({teacher.hidden_size}); set it to 0")


@register("distill_mlm", bert_mlm=True)
def from_config(config: ml_collections.ConfigDict, model_config: ModelConfig) -> DistillMlmPretraining:
  """The student (config.model) and the teacher (distill.teacher's config.json) from a run config."""
  if "distill" not in config:
    raise UserError("objective='distill_mlm' needs the config section `distill` (teacher, temperature, "
                    "*_weight); start from configs/distill.py:general-tiny")
  # The teacher was read and checked by the job (compress/teacher.py); here only its shape is needed.
  teacher = ModelConfig.from_dict(workdir_lib.read_config(config.distill.teacher)["model"])
  check_student(model_config, teacher, config.distill)
  return DistillMlmPretraining(model_config, teacher, config.distill.teacher, config.distill)

