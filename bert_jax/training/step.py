"""One sharded setup for every job: the train state, its sharded initialisation, the jitted steps.

`sharded_setup` is the whole recipe (big_vision/MaxText style): abstract params -> optimizer -> abstract
state -> shardings from the logical axis names -> `jax.jit` of init, train step (state donated) and
eval step, traced inside the mesh and its rules. Pretraining (`build_train_setup` below) and
fine-tuning (finetune/trainer.py) call it with their objective; a job with another step (a frozen
teacher's params passed alongside: `teacher_step`) passes its own `step_fn` and the shardings of its
extra arguments; a pretraining objective with a teacher (objectives.TeacherObjective: general
distillation) gets that from `build_train_setup`, and one whose training goes by stages of the step
(objectives.StagedObjective: MobileBERT's progressive knowledge transfer) gets `staged_step`.
Two options of the shared step serve fine-tuning's tricks: `trainable`, a mask of the parameters that
get gradients (adapters, feature-based training: the others are stop_gradient'ed, so the backward
pass skips them), and `teacher_momentum`, a moving average of the parameters kept in the state and
handed to the objective's `sums(..., teacher=)` (SMART's Bregman proximal point update).

An objective holds a model and says how a batch is scored: `init(rng, batch)`, `sums(params, batch,
rng, deterministic)` additive over rows, `counts(batch)` from the data only, `loss(sums, counts)`
linear in the sums and `metrics(sums, counts)`. So micro-batches (train.grad_accum_steps) give
exactly the full batch's gradient, for every job; each device sums its micro-batches' gradients and
they are reduced across devices once per step (training/accumulate.py).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Sequence

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import optax
from jax.sharding import Mesh, Sharding

from bert_jax.errors import UserError
from bert_jax.training import accumulate, batch_warmup, finite, objectives, optim, partitioning
from bert_jax.training.objectives.base import Objective


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any
  teacher: Any = None  # a momentum average of params (sharded_setup's teacher_momentum); else None
  carry: Any = None  # a CarryingObjective's state from one step to the next (XLNet's memory); else None


@dataclasses.dataclass
class TrainSetup:
  """Everything a run needs, built once from the config (nothing allocated): mesh, objective,
  optimizer, state shardings and the jitted functions."""
  config: ml_collections.ConfigDict
  mesh: Mesh
  objective: Objective
  tx: optax.GradientTransformation
  schedule: optax.Schedule
  num_steps: int
  state_shardings: TrainState
  abstract_state: TrainState  # jax.ShapeDtypeStruct leaves with their shardings, for restoring
  init_params: Callable[[jax.Array], Any]  # rng -> params
  make_state: Callable[[Any], TrainState]  # params -> a fresh train state around them
  init_state: Callable[[jax.Array], TrainState]  # rng -> train state
  train_step: Callable  # (state, batch, rng, *extra) -> (state, metrics); the state is donated
  eval_step: Callable  # (params, batch) -> eval_fn's outputs (a CarryingObjective's: with the next carry, CARRY)
  # Pretraining's extra train-step inputs (a frozen teacher's params): abstract, and how to read them.
  frozen: tuple = ()
  load_frozen: Callable[[], tuple] = tuple


def freeze(params: Any, trainable: Any) -> Any:
  """params with the leaves whose `trainable` entry is False cut from the gradient."""
  if trainable is None:
    return params
  return jax.tree.map(lambda p, t: p if t else jax.lax.stop_gradient(p), params, trainable)


def train_step(state: TrainState, batch: dict[str, jax.Array], rng: jax.Array, *, objective,
               tx: optax.GradientTransformation, schedule: optax.Schedule, grad_accum_steps: int,
               param_specs: Any, axis_rules: tuple, grad_reduce_dtype: str = "float32",
               trainable: Any = None, teacher_momentum: Callable | None = None
               ) -> tuple[TrainState, dict[str, jax.Array]]:
  """One optimizer step over the global batch. With micro-batches (or a bfloat16 reduction) each device
  sums its micro-batches' gradients and they are reduced across devices once (training/accumulate.py)."""
  rng = jax.random.fold_in(rng, state.step)
  counts = objective.counts(batch)
  if state.carry is not None:  # the objective reads the carry as a feature of the batch's rows
    batch = {**batch, objectives.CARRY: state.carry}
  teacher = {} if state.teacher is None else {"teacher": state.teacher}

  def loss_fn(params, micro_batch, micro_rng):
    sums = objective.sums(freeze(params, trainable), micro_batch, micro_rng, deterministic=False, **teacher)
    return objective.loss(sums, counts), sums

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  if accumulate.one_pass(grad_accum_steps, grad_reduce_dtype):
    # One pass: XLA reduces each layer's gradient as the backward pass makes it, overlapped with the
    # layers below (and with fsdp gathers each layer's weights when it needs them).
    (_, sums), grads = grad_fn(state.params, batch, rng)
  else:
    grads, sums = accumulate.gradients(grad_fn, state.params, batch, rng, param_specs=param_specs,
                                       num_micro=grad_accum_steps, axis_rules=axis_rules,
                                       reduce_dtype=grad_reduce_dtype, trainable=trainable)
  return apply_gradients(state, grads, sums, counts, objective=objective, tx=tx, schedule=schedule,
                         teacher_momentum=teacher_momentum)


def apply_gradients(state: TrainState, grads: Any, sums: dict[str, jax.Array], counts: dict[str, jax.Array], *,
                    objective, tx: optax.GradientTransformation, schedule: optax.Schedule,
                    teacher_momentum: Callable | None = None) -> tuple[TrainState, dict[str, jax.Array]]:
  """The optimizer update from the global batch's gradients and sums, and the step's metrics: the end of
  `train_step`, shared by a step that computes its gradients another way (sbert/gradcache.py)."""
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  sums = dict(sums)
  carry = sums.pop(objectives.CARRY, None)
  metrics = objective.metrics(sums, counts)
  metrics.update(loss=objective.loss(sums, counts), grad_norm=optax.tree.norm(grads),
                 learning_rate=jnp.asarray(schedule(state.step), jnp.float32))
  if state.teacher is not None:  # teacher <- (1 - beta) params + beta teacher, after the update
    teacher = optax.incremental_update(params, state.teacher, 1.0 - teacher_momentum(state.step))
    return TrainState(state.step + 1, params, opt_state, teacher, carry), metrics
  return TrainState(step=state.step + 1, params=params, opt_state=opt_state, carry=carry), metrics


def teacher_step(state: TrainState, batch: dict[str, jax.Array], rng: jax.Array, teacher_params: Any, *,
                 objective, **step_args) -> tuple[TrainState, dict[str, jax.Array]]:
  """train_step, its loss reading a frozen teacher's params (an extra, non-trained jit input):
  distillation's step. `objective.with_teacher(params)` is the objective that sees them."""
  return train_step(state, batch, rng, objective=objective.with_teacher(teacher_params), **step_args)


def staged_step(state: TrainState, batch: dict[str, jax.Array], rng: jax.Array, teacher_params: Any, *,
                objective, **step_args) -> tuple[TrainState, dict[str, jax.Array]]:
  """teacher_step for an objective that trains by stages of the step (objectives.StagedObjective: MobileBERT's
  progressive knowledge transfer): the loss of the state's stage, and the parameters that stage does not train
  put back as they were, so neither weight decay nor an earlier stage's Adam moments move them."""
  stage = objective.stage_of(state.step)
  new, metrics = train_step(state, batch, rng, objective=objective.with_teacher(teacher_params).at_stage(stage),
                            **step_args)
  params = jax.tree.map(lambda trains, p, old: jnp.where(trains, p, old), objective.trains(stage, state.params),
                        new.params, state.params)
  return new.replace(params=params), metrics


def eval_step(params: Any, batch: dict[str, jax.Array], *, objective) -> dict[str, jax.Array]:
  """Additive statistics of one eval batch (summed over batches by the caller); with batch[CARRY] (a
  CarryingObjective's state, `eval_carry`) also the next batch's, under CARRY (not a sum)."""
  sums = dict(objective.sums(params, batch, None, deterministic=True))
  carry = sums.pop(objectives.CARRY, None)
  out = {**{f"sum/{k}": v for k, v in sums.items()},
         **{f"count/{k}": v for k, v in objective.counts(batch).items()}}
  return out if carry is None else {**out, objectives.CARRY: carry}


def eval_carry(setup: "TrainSetup", rows: int) -> Any:
  """A CarryingObjective's initial carry for an evaluation of `rows`-row batches (zeros, as training starts;
  XLNet's memory: the eval batches are streams too, row i continuing row i), split over the batch axes as the
  rows are; None for another objective."""
  if not isinstance(setup.objective, objectives.CarryingObjective):
    return None
  make = lambda: nn.meta.unbox(setup.objective.carry_init(rows))  # noqa: E731
  return jax.jit(make, out_shardings=partitioning.batch_sharding(setup.mesh))()


def check_batch_layout(train_cfg: ml_collections.ConfigDict, mesh: Mesh) -> None:
  """The global batch splits over the data-parallel devices, micro-batches and processes; the gradients'
  reduction dtype is one we know."""
  batch, accum = train_cfg.batch_size, train_cfg.grad_accum_steps
  if batch < 1:
    raise UserError(f"train.batch_size={batch} must be >= 1")
  if train_cfg.eval_batch_size < 0:
    raise UserError(f"train.eval_batch_size={train_cfg.eval_batch_size} must be >= 0 (0: train.batch_size)")
  dp = partitioning.data_parallel_size(mesh)
  if accum < 1 or batch % (dp * accum):
    raise UserError(f"train.batch_size={batch} must be divisible by data-parallel size "
                    f"(mesh.data x mesh.fsdp = {dp}) x train.grad_accum_steps ({accum}) = {dp * accum}")
  if train_cfg.eval_batch_size % dp:
    raise UserError(f"train.eval_batch_size={train_cfg.eval_batch_size} must be a multiple of the "
                    f"data-parallel size {dp} (mesh.data x mesh.fsdp)")
  reduce_dtype = train_cfg.grad_reduce_dtype
  if reduce_dtype not in accumulate.REDUCE_DTYPES:
    raise UserError(f"train.grad_reduce_dtype={reduce_dtype!r}: choose one of {sorted(accumulate.REDUCE_DTYPES)}")
  if jax.process_count() > 1 and batch % jax.process_count():
    raise UserError(f"train.batch_size={batch} is not divisible by the {jax.process_count()} processes")


def sharded_setup(config: ml_collections.ConfigDict, objective: Objective,
                  init_params: Callable[[jax.Array], Any],
                  make_tx: Callable[[Any], tuple[optax.GradientTransformation, optax.Schedule]],
                  num_steps: int, *, mesh: Mesh | None = None, step_fn: Callable = train_step,
                  eval_fn: Callable = eval_step,
                  eval_out_sharding: Callable[[Mesh], Sharding] = partitioning.replicated,
                  extra_shardings: Sequence[Any] = (), trainable: Any = None,
                  teacher_momentum: Callable[[jax.Array], jax.Array] | None = None,
                  carry_init: Callable[[], Any] | None = None) -> TrainSetup:
  """The jitted, sharded functions of a job over config.mesh (nothing allocated).

  init_params: rng -> the boxed params tree (logical axis names on every leaf). make_tx: the abstract
  boxed params -> (optimizer, schedule). step_fn(state, batch, rng, *extra, objective=, tx=,
  schedule=, grad_accum_steps=, param_specs=, axis_rules=, grad_reduce_dtype=) -> (state, metrics), with
  `extra_shardings` for the extra arguments.
  eval_fn(params, batch, objective=) -> outputs in `eval_out_sharding(mesh)`. trainable: a tree of
  bools like the params (None: all train). teacher_momentum: step -> beta; the state then keeps a
  teacher, starting as the initial params. carry_init: () -> the boxed initial carry of a
  CarryingObjective (rows of the global batch first), kept in the state and checkpointed with it.
  """
  mesh = mesh or partitioning.make_mesh(config.mesh)
  check_batch_layout(config.train, mesh)
  axis_rules = partitioning.rules(config.mesh)
  abstract_params = jax.eval_shape(init_params, jax.random.key(0))  # the one trace of the model's init here
  tx, schedule = make_tx(abstract_params)

  def make_state(params, boxed_carry=False):
    carry = carry_init() if carry_init else None
    return TrainState(jnp.zeros((), jnp.int32), params, tx.init(params),
                      jax.tree.map(jnp.copy, params) if teacher_momentum else None,
                      carry if boxed_carry else nn.meta.unbox(carry))

  # Optimizer moments follow their parameters' logical axes: the shardings come from the boxed tree.
  abstract_boxed = jax.eval_shape(lambda params: make_state(params, boxed_carry=True), abstract_params)
  state_shardings = partitioning.logical_shardings(abstract_boxed, mesh, axis_rules)
  abstract_state = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                                nn.meta.unbox(abstract_boxed), state_shardings)
  data, replicated = partitioning.batch_sharding(mesh), partitioning.replicated(mesh)
  options = {**({} if trainable is None else {"trainable": trainable}),
             **({} if teacher_momentum is None else {"teacher_momentum": teacher_momentum})}
  param_specs = jax.tree.map(lambda s: s.spec, state_shardings.params)
  step = finite.guard_step(functools.partial(step_fn, objective=objective, tx=tx, schedule=schedule,
                                             grad_accum_steps=config.train.grad_accum_steps,
                                             param_specs=param_specs, axis_rules=axis_rules,
                                             grad_reduce_dtype=config.train.grad_reduce_dtype, **options),
                           skip=config.train.skip_nonfinite_steps > 0)
  return TrainSetup(
      config=config, mesh=mesh, objective=objective, tx=tx, schedule=schedule, num_steps=num_steps,
      state_shardings=state_shardings, abstract_state=abstract_state,
      init_params=jax.jit(lambda rng: nn.meta.unbox(init_params(rng)), out_shardings=state_shardings.params),
      make_state=jax.jit(make_state, in_shardings=(state_shardings.params,), out_shardings=state_shardings),
      init_state=jax.jit(lambda rng: make_state(nn.meta.unbox(init_params(rng))),
                         out_shardings=state_shardings),
      train_step=jax.jit(partitioning.in_mesh(step, mesh, axis_rules),
                         in_shardings=(state_shardings, data, replicated, *extra_shardings),
                         out_shardings=(state_shardings, replicated), donate_argnums=0),
      eval_step=jax.jit(partitioning.in_mesh(functools.partial(eval_fn, objective=objective), mesh,
                                             axis_rules),
                        in_shardings=(state_shardings.params, data),
                        # a carry comes back split over the batch axes, as it went in
                        out_shardings=eval_out_sharding(mesh) if carry_init is None else None))


def build_train_setup(config: ml_collections.ConfigDict, mesh: Mesh | None = None) -> TrainSetup:
  """Pretraining's setup: the configured objective and optimizer through `sharded_setup`."""
  length, positions = config.data.max_seq_length, config.model.max_position_embeddings
  if not 1 <= length <= positions:
    raise UserError(f"data.max_seq_length={length} must be between 1 and model.max_position_embeddings="
                    f"{positions} (the model has no position embeddings beyond it)")
  objective = objectives.make_objective(config)
  init_batch = objectives.example_batch(1, config.data.max_seq_length, config.data.max_predictions_per_seq)

  def make_tx(abstract_boxed_params):
    stacked = partitioning.stacked_layers_tree(abstract_boxed_params)
    return optim.make_optimizer(config.optimizer, config.train.num_steps, stacked)

  init_params = functools.partial(objective.init, batch=init_batch)
  if not isinstance(objective, objectives.TeacherObjective):
    step_fn = train_step
    if config.train.batch_warmup_steps:
      batch_warmup.check(config, objective)
      step_fn = batch_warmup.wrap(train_step, config.train)
    return sharded_setup(config, objective, init_params, make_tx, config.train.num_steps, mesh=mesh,
                         step_fn=step_fn, carry_init=_carry_init(config, objective))
  return _with_teacher(config, objective, init_params, make_tx, mesh)


def _carry_init(config: ml_collections.ConfigDict, objective: Objective) -> Callable[[], Any] | None:
  """A CarryingObjective's initial carry for the global batch; None for another objective."""
  if not isinstance(objective, objectives.CarryingObjective):
    return None
  return functools.partial(objective.carry_init, config.train.batch_size)


def _with_teacher(config: ml_collections.ConfigDict, objective: objectives.TeacherObjective,
                  init_params: Callable, make_tx: Callable, mesh: Mesh | None) -> TrainSetup:
  """A setup whose train step also takes the frozen teacher's params (`frozen`), sharded by their logical
  axes; the run reads them with `load_frozen()`, so building a setup still allocates nothing."""
  mesh = mesh or partitioning.make_mesh(config.mesh)
  boxed = objective.teacher_init(config.data.max_seq_length, config.data.max_predictions_per_seq)
  shardings = partitioning.logical_shardings(boxed, mesh, partitioning.rules(config.mesh))
  step_fn = staged_step if isinstance(objective, objectives.StagedObjective) else teacher_step
  setup = sharded_setup(config, objective, init_params, make_tx, config.train.num_steps, mesh=mesh,
                        step_fn=step_fn, extra_shardings=(shardings,))
  abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                          nn.meta.unbox(boxed), shardings)
  return dataclasses.replace(setup, frozen=(abstract,), load_frozen=lambda: (objective.load_teacher(abstract),))


def summarize_eval(objective, totals: dict[str, jax.Array]) -> dict[str, float]:
  sums = {k.split("/", 1)[1]: v for k, v in totals.items() if k.startswith("sum/")}
  counts = {k.split("/", 1)[1]: v for k, v in totals.items() if k.startswith("count/")}
  metrics = objective.metrics(sums, counts)
  metrics["loss"] = objective.loss(sums, counts)
  return {k: float(v) for k, v in metrics.items()}
