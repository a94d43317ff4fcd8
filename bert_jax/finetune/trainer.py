"""The fine-tuning run: build, (resume or init), train with periodic dev evaluation, keep the best
parameters, stop early, then evaluate and write predictions.

Workdir layout:
  config.json, params/, <vocab>   the kept (best, or last) parameters as a params checkpoint, so the
                                  workdir is itself a valid init_from (two-stage fine-tuning)
  run_config.json                 the config as given, written when the run starts
  state/, progress.json           the train state of a paused run (sweeps stop runs and continue some)
  metrics.jsonl                   one JSON object per logged step and per evaluation
  eval_results.json               the final dev metrics
  predictions/                    GLUE leaderboard TSVs or SQuAD JSON
Start order: own paused state > init_from > fresh init.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import shutil
import time
from typing import Any, Callable

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import orbax.checkpoint as ocp

from bert_jax.config_utils import save_config
from bert_jax.errors import UserError
from bert_jax.finetune import heads, init, optim
from bert_jax.finetune.features import MODEL_INPUTS
from bert_jax.finetune.tasks import Task, build_task, merge_metrics, score
from bert_jax.training import checkpoint, partitioning


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any


def loss_fn(outputs: dict[str, jax.Array], batch: dict[str, jax.Array], kind: str) -> jax.Array:
  if kind == "regression":
    return jnp.mean(jnp.square(outputs["logits"] - batch["label"]))
  if kind == "classification":
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(outputs["logits"], batch["label"]))
  if kind == "token":
    losses = optax.softmax_cross_entropy_with_integer_labels(outputs["logits"], batch["token_labels"])
    return jnp.sum(losses * batch["label_weights"]) / jnp.maximum(jnp.sum(batch["label_weights"]), 1.0)
  start = optax.softmax_cross_entropy_with_integer_labels(outputs["start_logits"], batch["start_positions"])
  end = optax.softmax_cross_entropy_with_integer_labels(outputs["end_logits"], batch["end_positions"])
  return jnp.mean(start + end) / 2


def train_step(state: TrainState, batch: dict[str, jax.Array], rng: jax.Array, *, model: nn.Module,
               tx: optax.GradientTransformation, schedule: optax.Schedule, kind: str
               ) -> tuple[TrainState, dict[str, jax.Array]]:
  rng = jax.random.fold_in(rng, state.step)

  def compute_loss(params):
    outputs = model.apply({"params": params}, *(batch[k] for k in MODEL_INPUTS), deterministic=False,
                          rngs={"dropout": rng})
    return loss_fn(outputs, batch, kind)

  loss, grads = jax.value_and_grad(compute_loss)(state.params)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  metrics = {"loss": loss, "grad_norm": optax.tree.norm(grads),
             "learning_rate": jnp.asarray(schedule(state.step), jnp.float32)}
  return TrainState(state.step + 1, optax.apply_updates(state.params, updates), opt_state), metrics


def predict_step(params: Any, batch: dict[str, jax.Array], *, model: nn.Module) -> dict[str, jax.Array]:
  return model.apply({"params": params}, *(batch[k] for k in MODEL_INPUTS), deterministic=True)


@dataclasses.dataclass
class Setup:
  model_config: Any
  mesh: Any
  num_steps: int
  steps_per_epoch: int
  abstract_state: TrainState  # with the shardings, for restoring
  init_params: Callable
  make_state: Callable
  train_step: Callable
  predict: Callable


def _check_batches(config: ml_collections.ConfigDict, mesh) -> None:
  dp = partitioning.data_parallel_size(mesh)
  for key in ("batch_size", "eval_batch_size"):
    if config.train[key] <= 0 or config.train[key] % dp:
      raise UserError(f"train.{key}={config.train[key]} must be a positive multiple of the data-parallel "
                      f"size {dp} (mesh.data x mesh.fsdp)")


def build_setup(config: ml_collections.ConfigDict, model_config, task: Task, num_train: int) -> Setup:
  """Model, optimizer and jitted functions, sharded over config.mesh (nothing allocated yet)."""
  mesh = partitioning.make_mesh(config.mesh)
  _check_batches(config, mesh)
  model = heads.FinetuneModel(model_config, task.head, task.num_labels, config.head.pooling,
                              config.head.dropout)
  length = config.data.max_seq_length
  dummy = jnp.zeros((1, length), jnp.int32)
  init_boxed = lambda rng: model.init(rng, dummy, dummy + 1, dummy)["params"]  # noqa: E731
  abstract_boxed = jax.eval_shape(init_boxed, jax.random.key(0))
  steps_per_epoch = max(num_train // config.train.batch_size, 1)
  num_steps = max(int(math.ceil(config.train.epochs * steps_per_epoch)), 1)
  tx, schedule = optim.make_optimizer(config.optimizer, num_steps, nn.meta.unbox(abstract_boxed),
                                      model_config)
  rules = partitioning.rules(config.mesh)
  param_shardings = partitioning.logical_shardings(abstract_boxed, mesh, rules)
  make_state = lambda params: TrainState(jnp.zeros((), jnp.int32), params, tx.init(params))  # noqa: E731
  # Optimizer moments follow their parameters' logical axes: init them on the boxed tree.
  abstract_boxed_state = jax.eval_shape(lambda rng: make_state(init_boxed(rng)), jax.random.key(0))
  state_shardings = partitioning.logical_shardings(abstract_boxed_state, mesh, rules)
  abstract_state = nn.meta.unbox(abstract_boxed_state)
  data, replicated = partitioning.batch_sharding(mesh), partitioning.replicated(mesh)
  step = functools.partial(train_step, model=model, tx=tx, schedule=schedule, kind=task.head)
  return Setup(
      model_config=model_config, mesh=mesh, num_steps=num_steps, steps_per_epoch=steps_per_epoch,
      abstract_state=jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                                  abstract_state, state_shardings),
      init_params=jax.jit(lambda rng: nn.meta.unbox(init_boxed(rng)), out_shardings=param_shardings),
      make_state=jax.jit(make_state, in_shardings=(param_shardings,), out_shardings=state_shardings),
      train_step=jax.jit(partitioning.in_mesh(step, mesh, rules),
                         in_shardings=(state_shardings, data, replicated),
                         out_shardings=(state_shardings, replicated), donate_argnums=0),
      predict=jax.jit(partitioning.in_mesh(functools.partial(predict_step, model=model), mesh, rules),
                      in_shardings=(param_shardings, data), out_shardings=data))


def train_batches(features: dict[str, np.ndarray], batch_size: int, seed: int, start_step: int,
                  end_step: int):
  """The batches of steps [start_step, end_step): epoch e uses permutation (seed, e), remainder dropped,
  so a resumed run sees exactly the batches an uninterrupted one would."""
  n = len(features["input_ids"])
  steps_per_epoch = max(n // batch_size, 1)
  epoch, order = -1, None
  for step in range(start_step, end_step):
    if step // steps_per_epoch != epoch:
      epoch = step // steps_per_epoch
      order = np.random.default_rng([seed, epoch]).permutation(n)
    rows = order[(step % steps_per_epoch) * batch_size:][:batch_size]
    yield {k: v[rows] for k, v in features.items()}


def run_model(setup: Setup, params: Any, features: dict[str, np.ndarray], batch_size: int
              ) -> dict[str, np.ndarray]:
  chunks = []
  for start in range(0, len(features["input_ids"]), batch_size):
    batch = {k: features[k][start:start + batch_size] for k in MODEL_INPUTS}
    chunks.append(jax.device_get(setup.predict(params, partitioning.global_batch(batch, setup.mesh))))
  return {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]}


def evaluate(setup: Setup, params: Any, task: Task, batch_size: int, eval_sets=None
             ) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, np.ndarray]]]:
  """Per eval set: its metrics and the raw model outputs."""
  per_set, outputs = {}, {}
  for eval_set in task.evals if eval_sets is None else eval_sets:
    outputs[eval_set.name] = run_model(setup, params, eval_set.features, batch_size)
    per_set[eval_set.name] = eval_set.evaluate(outputs[eval_set.name])
  return per_set, outputs


def _json_line(path: str, record: dict) -> None:
  with open(path, "a", encoding="utf-8") as f:
    f.write(json.dumps(record, sort_keys=True) + "\n")


def _saved_config(config: ml_collections.ConfigDict, model_config, tokenizer) -> dict:
  """The workdir's config.json: the run config with the resolved model and the tokenizer's copy."""
  saved = config.to_dict()
  saved["model"] = model_config.to_dict()
  saved["data"].update(vocab=os.path.basename(tokenizer.path), tokenizer=tokenizer.kind,
                       lower_case=tokenizer.lower_case)
  return json.loads(json.dumps(saved, default=str))


@dataclasses.dataclass
class Progress:
  """What a paused run must remember besides its train state."""
  best_score: float = -math.inf
  best_step: int = -1
  last_score: float = math.nan
  bad_evals: int = 0
  stopped_early: bool = False


class Run:
  """One fine-tuning run in a workdir; `advance(to_step)` trains until then or until it stops."""

  def __init__(self, config: ml_collections.ConfigDict, workdir: str):
    self.config, self.workdir = config, os.path.abspath(workdir)
    os.makedirs(self.workdir, exist_ok=True)
    saved_params, saved_config = init.load_checkpoint(config.init_from)
    self.tokenizer = init.load_tokenizer(config)
    self.task = build_task(config, self.tokenizer, need_train=not config.eval_only)
    model_config = heads.encoder_config(init.model_config(config, saved_config), self.task.head,
                                        config.head.pooling)
    if self.task.train is not None and len(self.task.train["input_ids"]) < config.train.batch_size:
      raise UserError(f"{len(self.task.train['input_ids'])} training examples are fewer than "
                      f"train.batch_size={config.train.batch_size}")
    num_train = 0 if self.task.train is None else len(self.task.train["input_ids"])
    self.setup = build_setup(config, model_config, self.task, num_train)
    self.saved_config = _saved_config(config, model_config, self.tokenizer)
    self.state, self.progress = self._start(saved_params, saved_config)

  def _path(self, *names: str) -> str:
    return os.path.join(self.workdir, *names)

  def _start(self, saved_params, saved_config) -> tuple[TrainState, Progress]:
    """Own paused state > init_from > fresh init."""
    if os.path.isdir(self._path("state")):
      with ocp.StandardCheckpointer() as ckptr:
        state = ckptr.restore(self._path("state"), self.setup.abstract_state)
      with open(self._path("progress.json"), encoding="utf-8") as f:
        return state, Progress(**json.load(f))
    fresh = jax.device_get(self.setup.init_params(jax.random.key(self.config.train.seed)))
    same_task = (saved_config or {}).get("task", {}).get("name") == self.task.name
    if self.config.eval_only and not (same_task and "head" in saved_params):
      raise UserError(f"eval_only needs init_from to be a fine-tuning workdir of task {self.task.name}")
    params = init.merge(fresh, saved_params, saved_config, self.task.name)
    params = init.reinit_top_layers(params, fresh, self.setup.model_config, self.config.train.reinit_layers)
    return self.setup.make_state(params), Progress()

  @property
  def step(self) -> int:
    return int(self.state.step)

  @property
  def finished(self) -> bool:
    return self.progress.stopped_early or self.step >= self.setup.num_steps

  def advance(self, to_step: int | None = None) -> float:
    """Trains up to `to_step` (default: the end), evaluating on the way; returns the best dev score."""
    cfg = self.config.train
    end = min(to_step or self.setup.num_steps, self.setup.num_steps)
    eval_every = cfg.eval_every_steps or self.setup.steps_per_epoch
    rng = jax.random.key(cfg.seed)
    step, started = self.step, time.time()
    for batch in train_batches(self.task.train, cfg.batch_size, cfg.seed, step, end):
      self.state, metrics = self.setup.train_step(self.state, partitioning.global_batch(batch, self.setup.mesh),
                                                  rng)
      step += 1
      if step % cfg.log_every_steps == 0:
        record = {k: float(v) for k, v in jax.device_get(metrics).items()}
        _json_line(self._path("metrics.jsonl"), {"step": step, "seconds": time.time() - started, **record})
      if step % eval_every == 0 or step == end:
        if self._evaluate_and_keep(step):
          break
    return self.progress.best_score

  def _evaluate_and_keep(self, step: int) -> bool:
    """Scores the dev set, saves the parameters if they are the best so far; True means stop early."""
    per_set, _ = evaluate(self.setup, self.state.params, self.task, self.config.train.eval_batch_size)
    current = score(self.task, per_set[self.task.evals[0].name])
    _json_line(self._path("metrics.jsonl"), {"step": step, "score": current,
                                             **{f"eval/{k}": v for k, v in merge_metrics(per_set).items()}})
    print(f"step {step}: dev {json.dumps(merge_metrics(per_set))}", flush=True)
    self.progress.last_score = current
    if current > self.progress.best_score:
      self.progress.best_score, self.progress.best_step, self.progress.bad_evals = current, step, 0
      if self.config.train.keep_best:
        self.save_params(self.state.params)
    else:
      self.progress.bad_evals += 1
    patience = self.config.train.early_stopping_patience
    self.progress.stopped_early = bool(patience) and self.progress.bad_evals >= patience
    return self.progress.stopped_early

  def save_params(self, params: Any) -> None:
    checkpoint.save_params(self.workdir, params, self.saved_config, self.tokenizer.files)

  def pause(self) -> None:
    """Saves the train state so that a new Run on this workdir continues where this one stopped."""
    with ocp.StandardCheckpointer() as ckptr:
      ckptr.save(self._path("state"), self.state, force=True)
    with open(self._path("progress.json"), "w", encoding="utf-8") as f:
      json.dump(dataclasses.asdict(self.progress), f)

  def final_params(self) -> Any:
    if self.config.train.keep_best and self.progress.best_step >= 0:
      params, _ = checkpoint.load_params(self.workdir, self.setup.abstract_state.params)
      return params
    return self.state.params

  def finish(self) -> dict[str, float]:
    """Final dev metrics (best kept parameters) to eval_results.json, predictions, state cleanup."""
    params = self.state.params if self.config.eval_only else self.final_params()
    if not self.config.eval_only and not (self.config.train.keep_best and self.progress.best_step >= 0):
      self.save_params(params)
    per_set, outputs = evaluate(self.setup, params, self.task, self.config.train.eval_batch_size)
    results = merge_metrics(per_set)
    with open(self._path("eval_results.json"), "w", encoding="utf-8") as f:
      json.dump(results, f, indent=2, sort_keys=True)
    self._write_predictions(params, outputs)
    if os.path.isdir(self._path("state")):
      shutil.rmtree(self._path("state"))
    return results

  def _write_predictions(self, params: Any, dev_outputs: dict[str, dict[str, np.ndarray]]) -> None:
    directory = self._path("predictions")
    if self.config.predict_split == "dev":
      for eval_set in self.task.evals:
        eval_set.write_predictions(directory, dev_outputs[eval_set.name])
    elif self.config.predict_split == "test":
      _, outputs = evaluate(self.setup, params, self.task, self.config.train.eval_batch_size, self.task.tests)
      for eval_set in self.task.tests:
        eval_set.write_predictions(directory, outputs[eval_set.name])


def validate(config: ml_collections.ConfigDict) -> None:
  if config.predict_split not in ("", "dev", "test"):
    raise UserError(f"predict_split={config.predict_split!r} is not one of ('', 'dev', 'test')")
  if config.head.pooling not in heads.POOLINGS:
    raise UserError(f"head.pooling={config.head.pooling!r} is not one of {heads.POOLINGS}")
  if config.optimizer.learning_rate <= 0 or not 0 <= config.optimizer.warmup_ratio < 1:
    raise UserError("optimizer.learning_rate must be > 0 and optimizer.warmup_ratio in [0, 1)")
  if config.train.epochs <= 0:
    raise UserError(f"train.epochs={config.train.epochs} must be positive")


def finetune(config: ml_collections.ConfigDict, workdir: str) -> dict[str, float]:
  """Fine-tunes (or, with eval_only, evaluates) and returns the final dev metrics."""
  validate(config)
  run = Run(config, workdir)
  save_config(config, os.path.join(run.workdir, "run_config.json"))
  if not config.eval_only:
    run.advance()
  return run.finish()
