"""Task-specific knowledge distillation (`bert-jax distill`): a fine-tuned teacher trains a student.

The teacher is a fine-tuning workdir; the student is either `distill.student_layers` of the teacher's
layers, initialised from them (DistilBERT's every-other-layer init: "every_other"), or the smaller
architecture in config.model (fresh, or from config.init_from). The loss is a weighted sum of switches
(distill.*_weight, 0 = off): the hard-label loss, soft targets at distill.temperature, hidden-state and
attention-map MSE (TinyBERT) and PKD's normalised [CLS] loss, over a layer mapping; a learned
projection (params["distill"]) maps the student's width to the teacher's.

It is a fine-tuning run (finetune/trainer.py:Run) whose step is the shared one
(training/step.py:teacher_step) with the frozen teacher's params as an extra, non-trained, sharded
input; the teacher's forward runs inside the same jitted step. The workdir it writes is a normal
fine-tuning workdir (config.json, params/ without the projection, tokenizer): predict, convert and
finetune take it. Pausing and resuming work as in fine-tuning.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import optax

from bert_jax import params_checkpoint
from bert_jax import workdir as workdir_lib
from bert_jax.compress import losses
from bert_jax.errors import UserError
from bert_jax.finetune import heads, init, optim, trainer
from bert_jax.finetune.features import MODEL_INPUTS
from bert_jax.finetune.objective import predict_step
from bert_jax.finetune.task_registry import build_task
from bert_jax.models.config import ModelConfig
from bert_jax.training import checkpoint, finite, partitioning
from bert_jax.training.step import sharded_setup, teacher_step

LOSSES = ("hard", "soft", "hidden", "attention", "pkd")


class InnerModel(heads.FinetuneModel):
  """FinetuneModel (the same parameter tree) also returning every layer's hidden states and, when
  asked, attention maps."""
  attentions: bool = False

  def __call__(self, input_ids, attention_mask, token_type_ids, *, deterministic: bool = True,
               head_mask=None):
    out = self.encoder_model(input_ids, attention_mask, token_type_ids, deterministic=deterministic,
                             output_hidden_states=True, output_attentions=self.attentions)
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
    if self.kind == "regression":
      out = {"hard": jnp.sum(jnp.square(s["logits"] - batch["label"])),
             "soft": jnp.sum(jnp.square(s["logits"] - t["logits"]))}
    else:
      out = {"hard": jnp.sum(optax.softmax_cross_entropy_with_integer_labels(s["logits"], batch["label"])),
             "soft": losses.soft_target_sum(s["logits"], t["logits"], self.cfg.temperature)}
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


def chosen_layers(spec: str, teacher_layers: int) -> tuple[int, ...] | None:
  """distill.student_layers: "" (config.model), "every_other" (0, 2, 4, ...) or "0,2,5"."""
  if not spec:
    return None
  if spec == "every_other":
    return tuple(range(0, teacher_layers, 2))
  try:
    layers = tuple(int(x) for x in spec.split(","))
  except ValueError:
    raise UserError(f"distill.student_layers={spec!r} must be '', 'every_other' or teacher layer "
                    "indices like '0,2,4'") from None
  if not layers or sorted(set(layers)) != list(layers) or not 0 <= layers[0] <= layers[-1] < teacher_layers:
    raise UserError(f"distill.student_layers={spec!r} must be increasing teacher layer indices in "
                    f"[0, {teacher_layers})")
  return layers


def take_layers(teacher_params: dict, teacher: ModelConfig, layers: tuple[int, ...]) -> dict:
  """The teacher's params with only `layers` of its encoder (renumbered 0..k-1): DistilBERT's init."""
  encoder = teacher_params["encoder"]
  if teacher.scan_layers:
    new_encoder = {**encoder, "layers": jax.tree.map(lambda x: x[jnp.asarray(layers)], encoder["layers"])}
  else:
    new_encoder = {k: v for k, v in encoder.items() if not k.startswith("layer_")}
    new_encoder.update({f"layer_{j}": encoder[f"layer_{i}"] for j, i in enumerate(layers)})
  return {**teacher_params, "encoder": new_encoder}


@dataclasses.dataclass
class Teacher:
  location: str
  saved: dict  # its config.json
  model: ModelConfig

  @classmethod
  def load(cls, location: str, config: ml_collections.ConfigDict) -> "Teacher":
    if not location:
      raise UserError("distill.teacher is empty: give a fine-tuning workdir of this task")
    saved = workdir_lib.read_config(location)
    if saved.get("quantization"):
      source = saved["quantization"].get("source")
      raise UserError(f"distill.teacher={location} holds int8 weights (bert-jax quantize): distill from the float "
                      f"model it was made from, --config.distill.teacher={source}")
    task = saved.get("task", {}).get("name")
    if task != config.task.name:
      raise UserError(f"the teacher {location} was fine-tuned on task {task!r}, not {config.task.name!r}; "
                      "distill with a teacher of the same task")
    return cls(location, saved, ModelConfig.from_dict(saved["model"]))


def _check_vocab(config: ml_collections.ConfigDict, teacher: Teacher, tokenizer, student: ModelConfig):
  if config.data.vocab:
    own = workdir_lib.vocab_file(teacher.location, teacher.saved)
    if own is None or own.read_bytes() != workdir_lib.path(config.data.vocab).read_bytes():
      raise UserError(f"data.vocab={config.data.vocab} is not the teacher's vocabulary; leave it empty "
                      "to use the teacher's")
  if student.vocab_size != teacher.model.vocab_size:
    raise UserError(f"the student's vocab_size {student.vocab_size} differs from the teacher's "
                    f"{teacher.model.vocab_size}: the student must use the teacher's vocabulary")
  del tokenizer


def student_config(config: ml_collections.ConfigDict, teacher: Teacher, layers) -> ModelConfig:
  if layers is not None:
    if teacher.model.share_layers != "none":
      raise UserError("distill.student_layers needs a teacher with unshared layers")
    fields = {**teacher.saved["model"], "num_layers": len(layers)}
  else:
    saved = workdir_lib.read_config(config.init_from) if config.init_from else None
    fields = dict(saved["model"]) if saved else config.model.to_dict()
  fields.update(hidden_dropout=config.model.hidden_dropout, attention_dropout=config.model.attention_dropout)
  return ModelConfig.from_dict(fields)


def validate(cfg: ml_collections.ConfigDict, student: ModelConfig, teacher: ModelConfig, kind: str) -> None:
  if kind not in ("classification", "regression"):
    raise UserError(f"distill supports classification and regression tasks, not a {kind} head")
  if cfg.temperature <= 0 or any(cfg[f"{k}_weight"] < 0 for k in LOSSES):
    raise UserError("distill.temperature must be > 0 and every distill.*_weight >= 0")
  if not any(cfg[f"{k}_weight"] for k in LOSSES):
    raise UserError("every distill.*_weight is 0: switch on at least one loss")
  if student.hidden_size > teacher.hidden_size and not cfg.projection:
    raise UserError(f"the student (hidden_size {student.hidden_size}) is wider than the teacher "
                    f"({teacher.hidden_size}): set distill.projection=True or a narrower student")
  if student.hidden_size != teacher.hidden_size and not cfg.projection and (cfg.hidden_weight or cfg.pkd_weight):
    raise UserError("hidden-state and PKD losses between different widths need distill.projection=True")
  if student.num_layers > teacher.num_layers:
    raise UserError(f"the student has {student.num_layers} layers, the teacher only {teacher.num_layers}")
  if cfg.attention_weight and student.num_heads != teacher.num_heads:
    raise UserError(f"the attention loss needs as many heads in the student ({student.num_heads}) as in "
                    f"the teacher ({teacher.num_heads})")


class DistillRun(trainer.Run):
  """A fine-tuning Run whose objective distills from the teacher (see the module docstring)."""

  def __init__(self, config: ml_collections.ConfigDict, workdir: str):  # pylint: disable=super-init-not-called
    self.config, self.workdir = config, workdir_lib.create(workdir)
    if config.train.mode != "finetune":
      raise UserError(f"distill trains every student parameter: train.mode={config.train.mode!r} is not "
                      "supported here (use train.mode=finetune)")
    self.teacher = Teacher.load(config.distill.teacher, config)
    with config.unlocked():
      tokenizer_config = ml_collections.ConfigDict(config.to_dict())
    tokenizer_config.init_from = config.init_from or config.distill.teacher
    self.tokenizer = init.load_tokenizer(tokenizer_config)
    self.task = build_task(config, self.tokenizer, need_train=True)
    self.layers = chosen_layers(config.distill.student_layers, self.teacher.model.num_layers)
    if self.layers is not None and config.init_from:
      raise UserError("set either distill.student_layers (init from the teacher) or init_from, not both")
    pooling = config.head.pooling
    self.model_config = heads.encoder_config(student_config(config, self.teacher, self.layers),
                                             self.task.head, pooling)
    teacher_config = heads.encoder_config(self.teacher.model, self.task.head,
                                          self.teacher.saved.get("head", {}).get("pooling", "pooled"))
    _check_vocab(config, self.teacher, self.tokenizer, self.model_config)
    validate(config.distill, self.model_config, teacher_config, self.task.head)
    if len(self.task.train["input_ids"]) < config.train.batch_size:
      raise UserError(f"{len(self.task.train['input_ids'])} training examples are fewer than "
                      f"train.batch_size={config.train.batch_size}")
    self._build(teacher_config)
    self.saved_config = trainer._saved_config(config, self.model_config, self.tokenizer, self.task)  # pylint: disable=protected-access
    self.seeds, self.trainable = trainer.seeds(config.train), None
    self.guard = finite.DivergenceGuard(config.train.skip_nonfinite_steps)
    self.state, self.progress = self._start(None)

  def _build(self, teacher_config: ModelConfig) -> None:
    config, head = self.config, self.task.head
    make = lambda model, pooling, attn: InnerModel(model, head, self.task.num_labels, pooling,  # noqa: E731
                                                   config.head.dropout, attentions=attn)
    attn = bool(config.distill.attention_weight)
    student = make(self.model_config, config.head.pooling, attn)
    teacher = make(teacher_config, self.teacher.saved.get("head", {}).get("pooling", "pooled"), attn)
    mapping = layer_map(self.model_config.num_layers, teacher_config.num_layers, self.layers)
    objective = DistillObjective(config.distill, student, teacher, mapping)
    dummy = jnp.zeros((1, config.data.max_seq_length), jnp.int32)
    init_batch = {"input_ids": dummy, "attention_mask": dummy + 1, "token_type_ids": dummy}
    num_train = len(self.task.train["input_ids"])
    self.steps_per_epoch = max(num_train // config.train.batch_size, 1)
    num_steps = max(int(math.ceil(config.train.epochs * self.steps_per_epoch)), 1)
    make_tx = lambda abstract: optim.make_optimizer(config.optimizer, num_steps,  # noqa: E731
                                                    nn.meta.unbox(abstract), self.model_config)
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
    self.teacher_params = params_checkpoint.load_params_into(self.teacher.location, abstract_teacher)
    jitted = setup.train_step
    self.setup = dataclasses.replace(
        setup, train_step=lambda state, batch, rng: jitted(state, batch, rng, self.teacher_params))

  def _start(self, saved_config):
    """Own paused state > the teacher's layers (student_layers) > init_from > fresh init."""
    if (self.workdir / workdir_lib.PAUSED).exists() or self.layers is None:
      return super()._start(workdir_lib.read_config(self.config.init_from) if self.config.init_from else None)
    fresh = self.setup.init_params(jax.random.key(self.seeds["head"]))
    student = take_layers(jax.device_get(self.teacher_params), self.teacher.model, self.layers)
    params = {**student, "distill": fresh["distill"]}
    params_checkpoint.check_shapes(params, fresh, f"the teacher's layers {list(self.layers)}")
    return (self.setup.make_state(jax.device_put(params, self.setup.state_shardings.params)),
            trainer.Progress())

  def save_params(self, params: Any) -> None:
    super().save_params({k: v for k, v in params.items() if k != "distill"})

  def final_params(self) -> Any:
    if self.config.train.keep_best and self.progress.best_step >= 0:
      abstract = {k: v for k, v in self.setup.abstract_state.params.items() if k != "distill"}
      return {**checkpoint.load_params_into(self.workdir, abstract), "distill": self.state.params["distill"]}
    return self.state.params


def distill(config: ml_collections.ConfigDict, workdir: str) -> dict[str, float]:
  """Distills into `workdir` and returns the student's final dev metrics."""
  trainer.validate(config)
  run = DistillRun(config, workdir)
  workdir_lib.write_json(run.workdir / workdir_lib.RUN_CONFIG, config.to_dict())
  run.advance()
  return run.finish()
