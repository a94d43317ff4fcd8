"""The train state, its sharded initialisation, and the jitted train and eval steps."""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import optax
from jax.sharding import Mesh

from bert_jax.errors import UserError
from bert_jax.training import objectives, optim, partitioning


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any


@dataclasses.dataclass
class TrainSetup:
  """Everything a run needs, built once from the config: mesh, objective, optimizer, jitted steps."""
  config: ml_collections.ConfigDict
  mesh: Mesh
  objective: Any
  tx: optax.GradientTransformation
  schedule: optax.Schedule
  state_shardings: Any
  init_state: Callable[[jax.Array], TrainState]
  train_step: Callable
  eval_step: Callable

  @property
  def abstract_state(self) -> TrainState:
    return jax.eval_shape(self.init_state, jax.random.key(0))


def _split_micro_batches(batch: dict[str, jax.Array], num_micro: int) -> dict[str, jax.Array]:
  """[B, ...] -> [A, B/A, ...] taking strided rows, so every device keeps rows of every micro-batch."""
  def split(x):
    x = x.reshape((x.shape[0] // num_micro, num_micro) + x.shape[1:])
    return jnp.swapaxes(x, 0, 1)
  return {k: split(v) for k, v in batch.items()}


def train_step(state: TrainState, batch: dict[str, jax.Array], rng: jax.Array, *, objective,
               tx: optax.GradientTransformation, schedule: optax.Schedule, grad_accum_steps: int
               ) -> tuple[TrainState, dict[str, jax.Array]]:
  """One optimizer step over the global batch, accumulating gradients over micro-batches."""
  rng = jax.random.fold_in(rng, state.step)
  counts = objective.counts(batch)

  def loss_fn(params, micro_batch, micro_rng):
    sums = objective.sums(params, micro_batch, micro_rng, deterministic=False)
    return objective.loss(sums, counts), sums

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  if grad_accum_steps == 1:
    (_, sums), grads = grad_fn(state.params, batch, rng)
  else:
    micro = _split_micro_batches(batch, grad_accum_steps)

    def body(carry, xs):
      grads_acc, sums_acc = carry
      micro_batch, index = xs
      (_, sums), grads = grad_fn(state.params, micro_batch, jax.random.fold_in(rng, index))
      return (jax.tree.map(jnp.add, grads_acc, grads), jax.tree.map(jnp.add, sums_acc, sums)), None

    zero_grads = jax.tree.map(jnp.zeros_like, state.params)
    zero_sums = jax.tree.map(jnp.zeros_like, jax.eval_shape(
        lambda: objective.sums(state.params, jax.tree.map(lambda x: x[0], micro), rng, False)))
    (grads, sums), _ = jax.lax.scan(body, (zero_grads, zero_sums),
                                    (micro, jnp.arange(grad_accum_steps)))
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  metrics = objective.metrics(sums, counts)
  metrics.update(loss=objective.loss(sums, counts), grad_norm=optax.tree.norm(grads),
                 learning_rate=jnp.asarray(schedule(state.step), jnp.float32))
  return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics


def eval_step(params: Any, batch: dict[str, jax.Array], *, objective) -> dict[str, jax.Array]:
  """Additive statistics of one eval batch (summed over batches by the caller)."""
  sums = objective.sums(params, batch, None, deterministic=True)
  return {**{f"sum/{k}": v for k, v in sums.items()},
          **{f"count/{k}": v for k, v in objective.counts(batch).items()}}


def check_batch_layout(config: ml_collections.ConfigDict, mesh: Mesh) -> None:
  batch, accum = config.train.batch_size, config.train.grad_accum_steps
  dp = partitioning.data_parallel_size(mesh)
  if accum < 1 or batch % (dp * accum):
    raise UserError(f"train.batch_size={batch} must be divisible by data-parallel size "
                    f"(mesh.data x mesh.fsdp = {dp}) x train.grad_accum_steps ({accum}) = {dp * accum}")
  if jax.process_count() > 1 and batch % jax.process_count():
    raise UserError(f"train.batch_size={batch} is not divisible by the {jax.process_count()} processes")


def build_train_setup(config: ml_collections.ConfigDict, mesh: Mesh | None = None) -> TrainSetup:
  """Mesh, objective, optimizer, abstract state shardings and the jitted steps (nothing allocated)."""
  mesh = mesh or partitioning.make_mesh(config.mesh)
  check_batch_layout(config, mesh)
  axis_rules = partitioning.rules(config.mesh)
  objective = objectives.make_objective(config)
  init_batch = objectives.example_batch(1, config.data.max_seq_length, config.data.max_predictions_per_seq)
  init_rng_params = functools.partial(objective.init, batch=init_batch)
  abstract_boxed_params = jax.eval_shape(init_rng_params, jax.random.key(0))
  stacked = partitioning.stacked_layers_tree(abstract_boxed_params)
  tx, schedule = optim.make_optimizer(config.optimizer, config.train.num_steps, stacked)

  def init_state(rng, boxed=False):
    params = init_rng_params(rng)
    if not boxed:
      params = nn.meta.unbox(params)
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))

  abstract_boxed_state = jax.eval_shape(functools.partial(init_state, boxed=True), jax.random.key(0))
  state_shardings = partitioning.logical_shardings(abstract_boxed_state, mesh, axis_rules)
  data_sharding = partitioning.batch_sharding(mesh)
  replicated = partitioning.replicated(mesh)
  step_fn = functools.partial(train_step, objective=objective, tx=tx, schedule=schedule,
                              grad_accum_steps=config.train.grad_accum_steps)
  jit_train = jax.jit(partitioning.in_mesh(step_fn, mesh, axis_rules),
                      in_shardings=(state_shardings, data_sharding, replicated),
                      out_shardings=(state_shardings, replicated), donate_argnums=0)
  jit_eval = jax.jit(partitioning.in_mesh(functools.partial(eval_step, objective=objective), mesh, axis_rules),
                     in_shardings=(state_shardings.params, data_sharding), out_shardings=replicated)
  jit_init = jax.jit(init_state, out_shardings=state_shardings)
  return TrainSetup(config=config, mesh=mesh, objective=objective, tx=tx, schedule=schedule,
                    state_shardings=state_shardings, init_state=jit_init, train_step=jit_train,
                    eval_step=jit_eval)


def summarize_eval(objective, totals: dict[str, jax.Array]) -> dict[str, float]:
  sums = {k.split("/", 1)[1]: v for k, v in totals.items() if k.startswith("sum/")}
  counts = {k.split("/", 1)[1]: v for k, v in totals.items() if k.startswith("count/")}
  metrics = objective.metrics(sums, counts)
  metrics["loss"] = objective.loss(sums, counts)
  return {k: float(v) for k, v in metrics.items()}
