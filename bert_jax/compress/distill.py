"""Task-specific knowledge distillation (`bert-jax distill`): a fine-tuned teacher trains a student.

The teacher is a fine-tuning workdir; the student is either `distill.student_layers` of the teacher's
layers, initialised from them (DistilBERT's every-other-layer init: "every_other"), or the smaller
architecture in config.model (fresh, or from config.init_from). The loss is a weighted sum of switches
(distill.*_weight, 0 = off): the hard-label loss, soft targets at distill.temperature, hidden-state and
attention-map MSE (TinyBERT) and PKD's normalised [CLS] loss, over a layer mapping; a learned
projection (params["distill"]) maps the student's width to the teacher's.

It is the fine-tuning job (finetune/trainer.py: `run_job`, so the workdir lock, the one loop, SIGTERM
and Ctrl-C, resume, early stopping and the ending are fine-tuning's) with another learner,
`Distillation`: its step is the shared one (training/step.py:teacher_step) with the frozen teacher's
params as an extra, non-trained, sharded input, so the teacher's forward runs inside the same jitted
step. The teacher is read and checked in compress/teacher.py, as general distillation's is. The
workdir it writes is a normal fine-tuning workdir (config.json, params/ without the projection,
tokenizer): predict, convert and finetune take it.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from bert_jax import params_checkpoint, workdir as workdir_lib
from bert_jax.compress.teacher import Teacher, chosen_layers
from bert_jax.errors import UserError
from bert_jax.finetune import heads, init, optim, trainer
from bert_jax.finetune.features import MODEL_INPUTS
from bert_jax.finetune.objective import predict_step
from bert_jax.finetune.tasks import Task
from bert_jax.models import families, head_kinds
from bert_jax.models.config import ModelConfig
from bert_jax.ops import distill_losses as losses
from bert_jax.training import partitioning
from bert_jax.training.step import TrainSetup, sharded_setup, teacher_step

LOSSES = ("hard", "soft", "hidden", "attention", "pkd")


class InnerModel(heads.FinetuneModel):
  """FinetuneModel (the same parameter tree) also returning, when asked, every layer's hidden states and
  attention maps."""
  attentions: bool = False
  hidden: bool = True

  def __call__(self, input_ids, attention_mask, token_type_ids, *, deterministic: bool = True,
               head_mask=None):
    out = self.encoder_model(input_ids, attention_mask, token_type_ids, deterministic=deterministic,
                             output_hidden_states=self.hidden, output_attentions=self.attentions)
    return {**self.head(out, attention_mask, deterministic), "hidden_states": out.hidden_states,
            "attentions": out.attentions}


def layer_map(student_layers: int, teacher_layers: int, chosen: tuple[int, ...] | None) -> tuple[int, ...]:
  """For each student layer j (its output), the teacher layer output (1-based, 0 = embeddings) it
  learns from: the chosen teacher layers, or TinyBERT's uniform map j -> j * L_t / L_s."""
  if chosen:
    return tuple(i + 1 for i in chosen)
  return tuple((j + 1) * teacher_layers // student_layers for j in range(student_layers))


class DistillObjective:
  """The student's objective with the teacher's outputs; `with_teacher(params)` is what the step uses."""
  packs_rows = False  # the teacher and student read the padded batch (finetune/trainer.py:_packing)

  def __init__(self, cfg: ml_collections.ConfigDict, student: InnerModel, teacher: InnerModel,
               mapping: tuple[int, ...]):
    self.cfg, self.student, self.teacher, self.mapping = cfg, student, teacher, mapping
    self.kind = student.kind
    self.weights = {name: float(cfg[f"{name}_weight"]) for name in LOSSES}
    self.projection = (nn.Dense(teacher.config.hidden_size, use_bias=False, name="projection",
                                kernel_init=nn.with_logical_partitioning(
                                    nn.initializers.lecun_normal(), (None, None)))
                       if cfg.projection and student.config.hidden_size != teacher.config.hidden_size
                       else None)

  def init(self, rng: jax.Array, batch: dict[str, jax.Array]) -> Any:
    params = self.student.init(rng, *(batch[k] for k in MODEL_INPUTS))["params"]
    extra = {}
    if self.projection is not None:
      extra = self.projection.init(rng, jnp.zeros((1, self.student.config.hidden_size)))["params"]
    return {**params, "distill": extra}

  def apply(self, params: Any, batch: dict[str, jax.Array], rng: jax.Array | None = None,
            deterministic: bool = True) -> dict[str, jax.Array]:
    """The head's outputs (the eval step's: every output keeps its batch axis first)."""
    out = self._forward(params, batch, rng, deterministic)
    return {k: v for k, v in out.items() if k not in ("hidden_states", "attentions")}

  def _forward(self, params: Any, batch: dict[str, jax.Array], rng: jax.Array | None,
               deterministic: bool) -> dict[str, jax.Array]:
    rngs = None if deterministic else {"dropout": rng}
    student = {k: v for k, v in params.items() if k != "distill"}
    return self.student.apply({"params": student}, *(batch[k] for k in MODEL_INPUTS),
                              deterministic=deterministic, rngs=rngs)

  def counts(self, batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
    return {"labels": jnp.asarray(batch["input_ids"].shape[0], jnp.float32)}

  def _project(self, params: Any, h: jax.Array) -> jax.Array:
    if self.projection is None:
      return h
    return self.projection.apply({"params": params["distill"]}, h.astype(jnp.float32))

  def sums(self, params: Any, batch: dict[str, jax.Array], rng: jax.Array | None, deterministic: bool,
           teacher_params: Any) -> dict[str, jax.Array]:
    s = self._forward(params, batch, rng, deterministic)
    t = jax.lax.stop_gradient(self.teacher.apply({"params": teacher_params},
                                                 *(batch[k] for k in MODEL_INPUTS)))
    mask, mapped = batch["attention_mask"], jnp.asarray(self.mapping)
    kind = head_kinds.get(self.kind)
    out = {"hard": kind.loss({"logits": s["logits"]}, batch),
           "soft": kind.distill_soft(s["logits"], t["logits"], self.cfg.temperature, self.cfg.get("soft_loss", "kl"))}
    if self.weights["hidden"]:
      out["hidden"] = losses.hidden_mse_sum(self._project(params, s["hidden_states"]),
                                            t["hidden_states"][jnp.concatenate([jnp.zeros(1, int), mapped])],
                                            mask)
    if self.weights["pkd"]:
      # PKD's intermediate layers: every mapped layer below the top one.
      out["pkd"] = losses.pkd_sum(self._project(params, s["hidden_states"][1:-1, :, 0]),
                                  t["hidden_states"][mapped[:-1], :, 0])
    if self.weights["attention"]:
      out["attention"] = losses.attention_mse_sum(s["attentions"], t["attentions"][mapped - 1], mask)
    return out

  def loss(self, sums: dict[str, jax.Array], counts: dict[str, jax.Array]) -> jax.Array:
    return sum(self.weights[k] * v for k, v in sums.items()) / counts["labels"]

  def metrics(self, sums: dict[str, jax.Array], counts: dict[str, jax.Array]) -> dict[str, jax.Array]:
    return {f"{k}_loss": v / counts["labels"] for k, v in sums.items()}

  def with_teacher(self, teacher_params: Any) -> "DistillObjective":
    bound = object.__new__(DistillObjective)
    bound.__dict__.update(self.__dict__)
    bound.sums = functools.partial(self.sums, teacher_params=teacher_params)
    return bound


def student_config(config: ml_collections.ConfigDict, teacher: Teacher, layers) -> ModelConfig:
  if layers is not None:
    if teacher.model.share_layers != "none":
      raise UserError("distill.student_layers needs a teacher with unshared layers")
    fields = {**teacher.saved["model"], "num_layers": len(layers)}
  else:
    saved = workdir_lib.read_config(config.init_from) if config.init_from else None
    fields = dict(saved["model"]) if saved else config.model.to_dict()
  student = families.model_config(fields)
  return families.of(student).with_dropout(student, config.model.hidden_dropout, config.model.attention_dropout)


def validate(cfg: ml_collections.ConfigDict, student: ModelConfig, teacher: ModelConfig, kind: str) -> None:
  if head_kinds.get(kind).distill_soft is None:
    raise UserError(f"distill supports {head_kinds.distillable()} tasks, not a {kind} head")
  layered = families.of(student).layer_losses
  if not layered and (cfg.hidden_weight or cfg.attention_weight or cfg.pkd_weight):
    raise UserError(f"the {student.family} student has no transformer layers to match the teacher's: "
                    "distill.hidden_weight, attention_weight and pkd_weight must be 0 (its losses: hard, soft)")
  if not any(cfg[f"{k}_weight"] for k in LOSSES):
    raise UserError("every distill.*_weight is 0: switch on at least one loss")
  if layered and student.hidden_size > teacher.hidden_size and not cfg.projection:
    raise UserError(f"the student (hidden_size {student.hidden_size}) is wider than the teacher "
                    f"({teacher.hidden_size}): set distill.projection=True or a narrower student")
  if student.hidden_size != teacher.hidden_size and not cfg.projection and (cfg.hidden_weight or cfg.pkd_weight):
    raise UserError("hidden-state and PKD losses between different widths need distill.projection=True")
  if student.num_layers > teacher.num_layers:
    raise UserError(f"the student has {student.num_layers} layers, the teacher only {teacher.num_layers}")
  if cfg.attention_weight and student.num_heads != teacher.num_heads:
    raise UserError(f"the attention loss needs as many heads in the student ({student.num_heads}) as in "
                    f"the teacher ({teacher.num_heads})")


class Distillation:
  """The learner of task distillation (finetune/trainer.py asks it the same five things as plain
  fine-tuning's): the student and its start, the teacher's frozen params inside the step."""

  def __init__(self, config: ml_collections.ConfigDict):
    if config.train.mode != "finetune":
      raise UserError(f"distill trains every student parameter: train.mode={config.train.mode!r} is not "
                      "supported here (use train.mode=finetune)")
    if config.distill.get("require_init_from") and not config.init_from:
      raise UserError("pre-trained distillation distils a pretrained compact student: set --config.init_from to "
                      "its pretraining workdir or checkpoint (e.g. bert-jax pretrain --config configs/bert.py:mini)")
    self.teacher = Teacher.fine_tuned(config.distill.teacher, config.task.name).check_intact()
    self.layers = chosen_layers(config.distill.student_layers, self.teacher.model.num_layers)
    if self.layers is not None and config.init_from:
      raise UserError("set either distill.student_layers (init from the teacher) or init_from, not both")
    self.teacher_params: Any = None

  def tokenizer(self, config: ml_collections.ConfigDict):
    """init_from's tokenizer, else the teacher's (its vocabulary is the student's)."""
    with config.unlocked():
      tokenizer_config = ml_collections.ConfigDict(config.to_dict())
    tokenizer_config.init_from = config.init_from or config.distill.teacher
    return init.load_tokenizer(tokenizer_config)

  def _teacher_config(self, task: Task) -> ModelConfig:
    return heads.encoder_config(self.teacher.model, task.head, self._teacher_pooling)

  @property
  def _teacher_pooling(self) -> str:
    return self.teacher.saved.get("head", {}).get("pooling", "pooled")

  def model_config(self, config: ml_collections.ConfigDict, task: Task) -> ModelConfig:
    student = heads.encoder_config(student_config(config, self.teacher, self.layers), task.head,
                                   config.head.pooling)
    self.teacher.check_vocab(config.data.vocab, student.vocab_size)
    validate(config.distill, student, self._teacher_config(task), task.head)
    return student

  def setup(self, config: ml_collections.ConfigDict, model_config: ModelConfig, task: Task, num_train: int
            ) -> tuple[TrainSetup, int]:
    """The student's setup; its train step reads the teacher's params (loaded here, sharded)."""
    teacher_config = self._teacher_config(task)
    make = lambda model, pooling, attn, hidden: InnerModel(model, task.head, task.num_labels, pooling,  # noqa: E731
                                                           config.head.dropout, attentions=attn, hidden=hidden)
    attn, hidden = bool(config.distill.attention_weight), bool(config.distill.hidden_weight or config.distill.pkd_weight)
    student = make(model_config, config.head.pooling, attn, hidden)
    teacher = make(teacher_config, self._teacher_pooling, attn, hidden)
    mapping = layer_map(model_config.num_layers, teacher_config.num_layers, self.layers)
    objective = DistillObjective(config.distill, student, teacher, mapping)
    dummy = jnp.zeros((1, config.data.max_seq_length), jnp.int32)
    init_batch = {"input_ids": dummy, "attention_mask": dummy + 1, "token_type_ids": dummy}
    num_steps, steps_per_epoch = trainer.run_length(config.train, num_train)
    make_tx = lambda abstract: optim.make_optimizer(config.optimizer, num_steps,  # noqa: E731
                                                    nn.meta.unbox(abstract), model_config)
    mesh = partitioning.make_mesh(config.mesh)
    rules = partitioning.rules(config.mesh)
    teacher_boxed = jax.eval_shape(lambda: teacher.init(jax.random.key(0), *(init_batch[k] for k in MODEL_INPUTS))
                                   ["params"])
    teacher_shardings = partitioning.logical_shardings(teacher_boxed, mesh, rules)
    setup = sharded_setup(config, objective, functools.partial(objective.init, batch=init_batch), make_tx,
                          num_steps, mesh=mesh, step_fn=teacher_step, eval_fn=predict_step,
                          eval_out_sharding=partitioning.batch_sharding, extra_shardings=(teacher_shardings,))
    abstract_teacher = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                                    nn.meta.unbox(teacher_boxed), teacher_shardings)
    self.teacher_params = self.teacher.load_params_into(abstract_teacher)
    jitted = setup.train_step
    with_teacher = lambda state, batch, rng: jitted(state, batch, rng, self.teacher_params)  # noqa: E731
    return dataclasses.replace(setup, train_step=with_teacher), steps_per_epoch

  def initial_params(self, run: trainer.Run) -> Any:
    """The teacher's layers (student_layers), else init_from's encoder or a fresh init (fine-tuning's)."""
    if self.layers is None:
      return trainer.FineTuning().initial_params(run)
    fresh = run.setup.init_params(jax.random.key(run.seeds["head"]))
    params = {**self.teacher.layers_of(self.teacher_params, self.layers), "distill": fresh["distill"]}
    params_checkpoint.check_shapes(params, fresh, f"the teacher's layers {list(self.layers)}")
    return params

  def exported(self, params: Any) -> Any:
    """What params/ holds: the student without its projection to the teacher's width."""
    return {k: v for k, v in params.items() if k != "distill"}


def distill(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """The task distillation job (`bert-jax distill` with configs/distill.py:<task>): the fine-tuning job
  with the `Distillation` learner; returns what finetune/trainer.py:run_job returns."""
  return trainer.run_job(config, workdir, Distillation)
