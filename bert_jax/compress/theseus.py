"""BERT-of-Theseus (Xu et al. 2020): compression by progressive module replacement (`bert-jax distill` with
configs/distill.py:theseus).

The predecessor is a fine-tuned workdir of L layers, grouped into `distill.modules` = n modules of L / n
consecutive layers; the successor has n layers, initialised from the predecessor's first n (the paper's
code), and the predecessor's embeddings, pooler and classifier. At each training step every module i is
replaced by its successor layer i with probability p (one Bernoulli draw per module and step): the batch
runs through the mix (`jax.lax.cond`, so only the branch taken computes) and the loss is the task's own,
with no other loss and no teacher forward beyond the modules not replaced. The predecessor's layers are
frozen (the step's extra, untrained input); what trains are the successor layers and the shared
embeddings, pooler and classifier, which the successor keeps. p follows the paper's linear curriculum
p(t) = min(1, b + (1 - b) t / T) with b = `distill.replace_rate` and T = `distill.curriculum_fraction` of the
run's steps; from T on p = 1, so the successor alone fine-tunes for the rest of the run (the paper's second
phase). Evaluation, the saved workdir, predict and export are the successor's alone: a normal fine-tuning
workdir of an n-layer model.

BertModel's families with unshared layers only (BERT, RoBERTa, ELECTRA): the mix is built from BertModel's
own modules (bert.Embeddings, bert.TransformerLayer) applied to each part of the parameter trees.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from bert_jax import params_checkpoint
from bert_jax.compress.distill import Distillation, InnerModel
from bert_jax.compress.teacher import Teacher
from bert_jax.errors import UserError
from bert_jax.finetune import heads, optim, trainer
from bert_jax.finetune.features import MODEL_INPUTS
from bert_jax.finetune.objective import predict_step
from bert_jax.finetune.tasks import Task
from bert_jax.models import attention, bert, head_kinds
from bert_jax.models.config import ModelConfig
from bert_jax.training import partitioning
from bert_jax.training.step import TrainSetup, sharded_setup, teacher_step


def replace_rate(step: jax.Array, base: float, curriculum_steps: int) -> jax.Array:
  """The paper's linear curriculum: min(1, base + (1 - base) step / curriculum_steps)."""
  ramp = (1.0 - base) * step.astype(jnp.float32) / max(curriculum_steps, 1)
  return jnp.minimum(1.0, base + ramp)


def _layer(params: dict, config: ModelConfig, i: int) -> dict:
  encoder = params["encoder"]
  return jax.tree.map(lambda x: x[i], encoder["layers"]) if config.scan_layers else encoder[f"layer_{i}"]


class TheseusObjective:
  """The mixed model's task loss (train) and the successor alone (evaluation); `with_teacher` binds the
  predecessor's params and the step (the curriculum's clock)."""
  packs_rows = False  # the mixed model reads the padded batch (finetune/trainer.py:_packing)

  def __init__(self, cfg: ml_collections.ConfigDict, student: InnerModel, teacher_config: ModelConfig,
               curriculum_steps: int):
    self.cfg, self.student, self.teacher_config = cfg, student, teacher_config
    self.kind, self.curriculum_steps = student.kind, curriculum_steps
    self.per_module = teacher_config.num_layers // student.config.num_layers

  def init(self, rng: jax.Array, batch: dict[str, jax.Array]) -> Any:
    return self.student.init(rng, *(batch[k] for k in MODEL_INPUTS))["params"]

  def apply(self, params: Any, batch: dict[str, jax.Array], rng: jax.Array | None = None,
            deterministic: bool = True) -> dict[str, jax.Array]:
    """The successor's outputs (the eval step's)."""
    rngs = None if deterministic else {"dropout": rng}
    out = self.student.apply({"params": params}, *(batch[k] for k in MODEL_INPUTS), deterministic=deterministic,
                             rngs=rngs)
    return {k: v for k, v in out.items() if k not in ("hidden_states", "attentions")}

  def counts(self, batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
    return {"labels": jnp.asarray(batch["input_ids"].shape[0], jnp.float32)}

  def mixed_logits(self, params: Any, teacher_params: Any, batch: dict[str, jax.Array], replace: jax.Array,
                   rng: jax.Array | None, deterministic: bool) -> jax.Array:
    """The head's logits of the model whose module i is the successor's layer i where replace[i], else the
    predecessor's layers i*k .. i*k+k-1 (k = L / n)."""
    s_cfg, t_cfg = self.student.config, self.teacher_config
    ids, mask, types = (batch[k] for k in MODEL_INPUTS)
    rngs = lambda i: None if deterministic else {"dropout": jax.random.fold_in(rng, i)}  # noqa: E731  (i >= 0)
    x = bert.Embeddings(s_cfg).apply({"params": params["embeddings"]}, ids, types,
                                     bert.default_position_ids(s_cfg, ids, mask), deterministic, rngs=rngs(10_000))
    segments = attention.Segments.of(mask, None)
    run = lambda cfg, layer, x, i: bert.TransformerLayer(cfg).apply(  # noqa: E731
        {"params": layer}, x, segments, None, deterministic, rngs=rngs(i))[0]
    frozen = jax.lax.stop_gradient(teacher_params)
    for i in range(s_cfg.num_layers):
      def successor(x, i=i):
        return run(s_cfg, _layer(params, s_cfg, i), x, i)

      def predecessor(x, i=i):
        for j in range(i * self.per_module, (i + 1) * self.per_module):
          x = run(t_cfg, _layer(frozen, t_cfg, j), x, 1000 + j)
        return x
      x = jax.lax.cond(replace[i], successor, predecessor, x)
    pooled = jnp.tanh(x[:, 0] @ params["pooler"]["kernel"] + params["pooler"]["bias"])
    head = head_kinds.get(self.kind).build(s_cfg, self.student.num_labels, "pooled", self.student.head_dropout)
    out = bert.ModelOutput(last_hidden_state=x, pooled_output=pooled)
    return head.apply({"params": params["head"]}, out, mask, deterministic, rngs=rngs(10_001))["logits"]

  def sums(self, params: Any, batch: dict[str, jax.Array], rng: jax.Array | None, deterministic: bool,
           teacher: Any) -> dict[str, jax.Array]:
    p = replace_rate(teacher["step"], self.cfg.replace_rate, self.curriculum_steps)
    draw_rng, rng = jax.random.split(rng) if rng is not None else (jax.random.key(0), None)
    replace = jax.random.bernoulli(draw_rng, p, (self.student.config.num_layers,))
    logits = self.mixed_logits(params, teacher["params"], batch, replace, rng, deterministic)
    task = head_kinds.get(self.kind).loss({"logits": logits}, batch)
    n = self.counts(batch)["labels"]
    return {"hard": task, "replace_rate": p * n, "replaced": jnp.mean(replace.astype(jnp.float32)) * n}

  def loss(self, sums: dict[str, jax.Array], counts: dict[str, jax.Array]) -> jax.Array:
    return sums["hard"] / counts["labels"]

  def metrics(self, sums: dict[str, jax.Array], counts: dict[str, jax.Array]) -> dict[str, jax.Array]:
    return {"hard_loss": sums["hard"] / counts["labels"], "replace_rate": sums["replace_rate"] / counts["labels"],
            "replaced": sums["replaced"] / counts["labels"]}

  def with_teacher(self, teacher: Any) -> "TheseusObjective":
    bound = object.__new__(TheseusObjective)
    bound.__dict__.update(self.__dict__)
    bound.sums = functools.partial(self.sums, teacher=teacher)
    return bound


def validate(cfg: ml_collections.ConfigDict, teacher: ModelConfig) -> int:
  """distill.modules and the curriculum checked against the predecessor; returns the module count."""
  if not isinstance(teacher, ModelConfig) or teacher.share_layers != "none" or teacher.pruned_heads:
    raise UserError("Theseus compression needs a BERT, RoBERTa or ELECTRA predecessor with unshared, unpruned "
                    "layers")
  modules = cfg.modules or teacher.num_layers // 2
  if modules <= 0 or teacher.num_layers % modules:
    raise UserError(f"distill.modules={cfg.modules} must divide the predecessor's {teacher.num_layers} layers "
                    "into modules of equal size")
  return modules


class Theseus(Distillation):
  """The learner (finetune/trainer.py's five questions): Distillation's teacher, tokenizer, init from the
  teacher's first n layers and export, with the module-replacing objective."""

  def __init__(self, config: ml_collections.ConfigDict):
    if config.train.mode != "finetune" or config.init_from:
      raise UserError("Theseus compression starts from the predecessor (distill.teacher): train.mode=finetune "
                      "and no init_from")
    self.teacher = Teacher.fine_tuned(config.distill.teacher, config.task.name).check_intact()
    modules = validate(config.distill, self.teacher.model)
    self.layers = tuple(range(modules))
    self.teacher_params: Any = None

  def model_config(self, config: ml_collections.ConfigDict, task: Task) -> ModelConfig:
    if head_kinds.get(task.head).distill_soft is None:
      raise UserError(f"Theseus compression supports {head_kinds.distillable()} tasks, not a {task.head} head")
    fields = {**self.teacher.saved["model"], "num_layers": len(self.layers),
              "hidden_dropout": config.model.hidden_dropout, "attention_dropout": config.model.attention_dropout}
    return heads.encoder_config(ModelConfig.from_dict(fields), task.head, "pooled")

  def setup(self, config: ml_collections.ConfigDict, model_config: ModelConfig, task: Task, num_train: int
            ) -> tuple[TrainSetup, int]:
    teacher_config = self._teacher_config(task)
    student = InnerModel(model_config, task.head, task.num_labels, "pooled", config.head.dropout)
    teacher = InnerModel(teacher_config, task.head, task.num_labels, self._teacher_pooling, config.head.dropout)
    num_steps, steps_per_epoch = trainer.run_length(config.train, num_train)
    objective = TheseusObjective(config.distill, student, teacher_config,
                                 round(config.distill.curriculum_fraction * num_steps))
    dummy = jnp.zeros((1, config.data.max_seq_length), jnp.int32)
    init_batch = {"input_ids": dummy, "attention_mask": dummy + 1, "token_type_ids": dummy}
    make_tx = lambda abstract: optim.make_optimizer(config.optimizer, num_steps,  # noqa: E731
                                                    nn.meta.unbox(abstract), model_config)
    mesh = partitioning.make_mesh(config.mesh)
    teacher_boxed = jax.eval_shape(lambda: teacher.init(jax.random.key(0), *(init_batch[k] for k in MODEL_INPUTS))
                                   ["params"])
    teacher_shardings = partitioning.logical_shardings(teacher_boxed, mesh, partitioning.rules(config.mesh))
    extra = {"params": teacher_shardings, "step": partitioning.replicated(mesh)}
    setup = sharded_setup(config, objective, functools.partial(objective.init, batch=init_batch), make_tx,
                          num_steps, mesh=mesh, step_fn=teacher_step, eval_fn=predict_step,
                          eval_out_sharding=partitioning.batch_sharding, extra_shardings=(extra,))
    abstract_teacher = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                                    nn.meta.unbox(teacher_boxed), teacher_shardings)
    self.teacher_params = self.teacher.load_params_into(abstract_teacher)
    jitted = setup.train_step
    # The step count travels as a copy: `state` is donated to the same call.
    step = lambda state, batch, rng: jitted(  # noqa: E731
        state, batch, rng, {"params": self.teacher_params, "step": jnp.copy(state.step)})
    return dataclasses.replace(setup, train_step=step), steps_per_epoch

  def initial_params(self, run: trainer.Run) -> Any:
    """The predecessor's embeddings, pooler, classifier and first n layers."""
    params = self.teacher.layers_of(self.teacher_params, self.layers)
    fresh = run.setup.init_params(jax.random.key(run.seeds["head"]))
    params_checkpoint.check_shapes(params, fresh, f"the predecessor's first {len(self.layers)} layers")
    return params

  def exported(self, params: Any) -> Any:
    return params


def distill(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """The Theseus job (`bert-jax distill` with configs/distill.py:theseus): the fine-tuning job with the
  `Theseus` learner; returns what finetune/trainer.py:run_job returns."""
  return trainer.run_job(config, workdir, Theseus)
