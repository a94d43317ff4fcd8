"""The fine-tuning run: build, (resume or init), train with periodic dev evaluation, keep the best
parameters, stop early, then evaluate and write predictions.

It runs on the same skeleton as pretraining: `training.step.sharded_setup` (mesh, shardings, donation,
micro-batches), `training.checkpoint.Checkpointer` (a paused run's state and progress),
`training.metrics.MetricsLogger` (progress line, metrics.jsonl, TensorBoard) and the workdir layout of
bert_jax/workdir.py:
  config.json, params/, <vocab>   the kept (best, or last) parameters as a params checkpoint, so the
                                  workdir is itself a valid init_from (two-stage fine-tuning); with
                                  train.mode=adapters only the trained parameters, config.json naming
                                  the base checkpoint (a delta: bert_jax/params_checkpoint.py)
  run_config.json                 the config as given, written when the run starts
  state/<step>/                   the train state and progress of a paused run (sweeps stop runs and
                                  continue some)
  metrics.jsonl, events.*         one JSON object per logged step and per evaluation; TensorBoard
  eval_results.json               the final dev metrics
  predictions/                    GLUE leaderboard TSVs or SQuAD JSON
Start order: own paused state > init_from > fresh init.
What trains is train.mode's (finetune/modes.py), SMART's terms come from the objective
(finetune/smart.py); both run inside the shared step. Three seeds (head, data, dropout) default to
train.seed, so that a sweep may vary one of them at a time (Dodge et al. 2020).
"""
from __future__ import annotations

import dataclasses
import functools
import math
import os
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from bert_jax import params_checkpoint, run_lock, workdir as workdir_lib
from bert_jax.errors import UserError
from bert_jax.finetune import batching, heads, init, modes, optim, smart
from bert_jax.finetune.batching import train_batches
from bert_jax.finetune.objective import FinetuneObjective, predict_step
from bert_jax.finetune.task_registry import build_task
from bert_jax.finetune.tasks import Task, merge_metrics, score
from bert_jax.training import checkpoint, finite, partitioning
from bert_jax.training.metrics import MetricsLogger
from bert_jax.training.step import TrainSetup, sharded_setup


def build_train_setup(config: ml_collections.ConfigDict, model_config, task: Task, num_train: int
                      ) -> tuple[TrainSetup, int]:
  """The task's model and optimizer through the shared sharded setup; also the steps per epoch."""
  model = heads.FinetuneModel(model_config, task.head, task.num_labels, config.head.pooling,
                              config.head.dropout)
  if config.train.qat:
    from bert_jax.compress import int8  # pylint: disable=import-outside-toplevel
    model = int8.int8_model(model)
  objective = FinetuneObjective(model, config.smart if config.smart.enabled else None)
  dummy = jnp.zeros((1, config.data.max_seq_length), jnp.int32)
  init_batch = {"input_ids": dummy, "attention_mask": dummy + 1, "token_type_ids": dummy}
  init_params = functools.partial(objective.init, batch=init_batch)
  steps_per_epoch = max(num_train // config.train.batch_size, 1)
  num_steps = max(int(math.ceil(config.train.epochs * steps_per_epoch)), 1)
  trainable = modes.trainable_mask(nn.meta.unbox(jax.eval_shape(init_params, jax.random.key(0))),
                                   config.train.mode)
  learning_rate = (config.optimizer.learning_rate if config.train.mode == "finetune"
                   else config.optimizer.frozen_learning_rate)
  make_tx = lambda abstract: optim.make_optimizer(config.optimizer, num_steps,  # noqa: E731
                                                  nn.meta.unbox(abstract), model_config, trainable,
                                                  learning_rate)
  teacher = config.smart.enabled and config.smart.bregman_weight > 0
  setup = sharded_setup(config, objective, init_params, make_tx, num_steps, eval_fn=predict_step,
                        eval_out_sharding=partitioning.batch_sharding,
                        trainable=None if config.train.mode == "finetune" else trainable,
                        teacher_momentum=smart.momentum(config.smart, num_steps) if teacher else None)
  return setup, steps_per_epoch


def seeds(train: ml_collections.ConfigDict) -> dict[str, int]:
  """{head, data, dropout}: each its own setting, or train.seed where that is -1."""
  return {k: train.seed if train[f"{k}_seed"] < 0 else train[f"{k}_seed"] for k in ("head", "data", "dropout")}


def run_model(setup: TrainSetup, params: Any, features: dict[str, np.ndarray], batch_size: int
              ) -> dict[str, np.ndarray]:
  lengths = batching.buckets(setup.config.data.get("length_buckets", ()), features["input_ids"].shape[1])
  return batching.run_model(setup.eval_step, params, setup.mesh, features, batch_size, lengths)


def evaluate(setup: TrainSetup, params: Any, task: Task, batch_size: int, eval_sets=None
             ) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, np.ndarray]]]:
  """Per eval set: its metrics and the raw model outputs."""
  per_set, outputs = {}, {}
  for eval_set in task.evals if eval_sets is None else eval_sets:
    outputs[eval_set.name] = run_model(setup, params, eval_set.features, batch_size)
    per_set[eval_set.name] = eval_set.evaluate(outputs[eval_set.name])
  return per_set, outputs


def _saved_config(config: ml_collections.ConfigDict, model_config, tokenizer, task: Task) -> dict:
  """The workdir's config.json: the run config with the resolved model, the tokenizer's copy and the
  head (kind, size, label names by id), so predict and export need no task data; an adapter run's (a
  delta) names the checkpoint with the other parameters."""
  saved = config.to_dict()
  saved["model"] = model_config.to_dict()
  saved["task"].update(head=task.head, num_labels=task.num_labels, labels=list(task.labels))
  saved["data"].update(vocab=workdir_lib.path(tokenizer.path).name, tokenizer=tokenizer.kind,
                       lower_case=tokenizer.lower_case)
  if _saves_delta(config):
    saved[params_checkpoint.BASE] = str(workdir_lib.path(config.init_from))
  return saved


def _saves_delta(config: ml_collections.ConfigDict) -> bool:
  return config.train.mode == "adapters" and bool(config.init_from)


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
    self.config, self.workdir = config, workdir_lib.create(workdir)
    saved_config = workdir_lib.read_config(config.init_from) if config.init_from else None
    encoder_config = init.model_config(config, saved_config)  # checks data.max_seq_length before any data work
    self.tokenizer = init.load_tokenizer(config)
    self.task = build_task(config, self.tokenizer, need_train=not config.eval_only)
    self.model_config = modes.model_config(heads.encoder_config(encoder_config, self.task.head,
                                                                config.head.pooling), config.train)
    if self.task.train is not None and len(self.task.train["input_ids"]) < config.train.batch_size:
      raise UserError(f"{len(self.task.train['input_ids'])} training examples are fewer than "
                      f"train.batch_size={config.train.batch_size}")
    num_train = 0 if self.task.train is None else len(self.task.train["input_ids"])
    self.setup, self.steps_per_epoch = build_train_setup(config, self.model_config, self.task, num_train)
    self.seeds = seeds(config.train)
    self.trainable = modes.trainable_mask(self.setup.abstract_state.params, config.train.mode)
    self.saved_config = _saved_config(config, self.model_config, self.tokenizer, self.task)
    count, total = modes.trainable_count(self.setup.abstract_state.params, self.trainable)
    self.saved_config["trainable_parameters"] = {"count": count, "total": total, "share": count / total}
    print(f"train.mode={config.train.mode}: {count:,} of {total:,} parameters train "
          f"({100 * count / total:.2f}%)", flush=True)
    self.guard = finite.DivergenceGuard(config.train.skip_nonfinite_steps)
    self.state, self.progress = self._start(saved_config)

  def _checkpointer(self) -> checkpoint.Checkpointer:
    return checkpoint.Checkpointer(self.workdir / workdir_lib.PAUSED, keep=1, async_save=False,
                                   items=("progress",))

  def _start(self, saved_config):
    """Own paused state > init_from > fresh init."""
    if (self.workdir / workdir_lib.PAUSED).exists():
      ckpt = self._checkpointer()
      try:
        self._check_resumable(ckpt)
        restored = ckpt.restore_latest(self.setup.abstract_state)
      finally:
        ckpt.close()
      if restored is not None:
        return restored[0]["state"], Progress(**restored[0]["progress"])
    fresh = self.setup.init_params(jax.random.key(self.seeds["head"]))
    params = init.initial_params(self.config, fresh, saved_config, self.task.name)
    params = init.reinit_top_layers(params, fresh, self.model_config, self.config.train.reinit_layers)
    return self.setup.make_state(jax.device_put(params, self.setup.state_shardings.params)), Progress()

  def _check_resumable(self, ckpt: checkpoint.Checkpointer) -> None:
    step = ckpt.latest_step()
    saved = self.workdir / workdir_lib.RUN_CONFIG
    if step is not None:
      ckpt.check_resumable(step, self.setup.abstract_state,
                           workdir_lib.read_json(saved) if saved.exists() else None, self.config)

  @property
  def last_kept(self) -> int | None:
    return self.progress.best_step if self.progress.best_step >= 0 else None

  @property
  def step(self) -> int:
    return int(self.state.step)

  @property
  def finished(self) -> bool:
    return self.progress.stopped_early or self.step >= self.setup.num_steps

  def advance(self, to_step: int | None = None) -> float:
    """Trains up to `to_step` (default: the end), evaluating on the way; returns the best dev score."""
    cfg = self.config.train
    num_steps = self.setup.num_steps
    end = min(to_step or num_steps, num_steps)
    eval_every = cfg.eval_every_steps or self.steps_per_epoch
    rng = jax.random.key(self.seeds["dropout"])
    tokens_per_step = cfg.batch_size * self.config.data.max_seq_length
    logger = MetricsLogger(self.workdir, num_steps, self.step, tensorboard=cfg.tensorboard)
    if self.step == 0:
      logger.write_hparams(self.config.to_dict())
    step, pending = self.step, []
    try:
      lengths = batching.buckets(self.config.data.get("length_buckets", ()), self.config.data.max_seq_length)
      for batch in train_batches(self.task.train, cfg.batch_size, self.seeds["data"], step, end, lengths):
        self.state, metrics = self.setup.train_step(
            self.state, partitioning.global_batch(batch, self.setup.mesh), rng)
        step += 1
        pending.append((step, self.guard.record(step, metrics)))
        if step % cfg.log_every_steps == 0 or step == num_steps:
          self.guard.check(self.last_kept)
          logged = [m for s, m in pending if s not in self.guard.skipped]
          if logged:
            logger.log_train(step, logged, tokens_per_step)
          pending = []
        if step % eval_every == 0 or step == end:
          self.guard.check_state(step, self.state, self.last_kept)  # kept parameters are finite
          if self._evaluate_and_keep(step, logger):
            break
    finally:
      logger.close()
    return self.progress.best_score

  def _evaluate_and_keep(self, step: int, logger: MetricsLogger) -> bool:
    """Scores the dev set, saves the parameters if they are the best so far; True means stop early."""
    per_set, _ = evaluate(self.setup, self.state.params, self.task, self.config.train.eval_batch_size)
    current = score(self.task, per_set[self.task.evals[0].name])
    logger.log_eval(step, {"score": current, **merge_metrics(per_set)})
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
    """The params checkpoint of the workdir: every parameter, or with adapters the trained ones."""
    if _saves_delta(self.config):
      params = modes.trainable_subtree(params, self.trainable)
    checkpoint.save_params(self.workdir, params, self.saved_config, self.tokenizer.files)

  def pause(self) -> None:
    """Saves the train state so that a new Run on this workdir continues where this one stopped."""
    self.guard.check_state(self.step, self.state, self.last_kept)
    ckpt = self._checkpointer()
    ckpt.save(self.step, self.state, force=True, progress=dataclasses.asdict(self.progress))
    ckpt.close()

  def final_params(self) -> Any:
    if self.config.train.keep_best and self.progress.best_step >= 0:
      return checkpoint.load_params_into(self.workdir, self.setup.abstract_state.params)
    return self.state.params

  def finish(self) -> dict[str, float]:
    """Final dev metrics (best kept parameters) to eval_results.json, predictions, state cleanup."""
    params = self.state.params if self.config.eval_only else self.final_params()
    if not self.config.eval_only and not (self.config.train.keep_best and self.progress.best_step >= 0):
      self.save_params(params)
    per_set, outputs = evaluate(self.setup, params, self.task, self.config.train.eval_batch_size)
    results = merge_metrics(per_set)
    workdir_lib.write_json(self.workdir / workdir_lib.EVAL_RESULTS, results)
    self._write_predictions(params, outputs)
    if (self.workdir / workdir_lib.PAUSED).exists():
      (self.workdir / workdir_lib.PAUSED).rmtree()
    return results

  def _write_predictions(self, params: Any, dev_outputs: dict[str, dict[str, np.ndarray]]) -> None:
    directory = os.fspath(self.workdir / workdir_lib.PREDICTIONS)
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
  finite.check_skip_budget(config.train.skip_nonfinite_steps)
  if config.train.eval_batch_size <= 0:
    raise UserError(f"train.eval_batch_size={config.train.eval_batch_size} must be positive")
  modes.validate(config.train)
  smart.validate(config.smart)
  batching.buckets(config.data.get("length_buckets", ()), config.data.max_seq_length)


def finetune(config: ml_collections.ConfigDict, workdir: str) -> dict[str, float]:
  """Fine-tunes (or, with eval_only, evaluates) and returns the final dev metrics; holds `workdir`
  locked meanwhile."""
  validate(config)
  with run_lock.hold(workdir_lib.create(workdir), jax.process_index()):
    run = Run(config, workdir)
    workdir_lib.write_json(run.workdir / workdir_lib.RUN_CONFIG, config.to_dict())
    if not config.eval_only:
      run.advance()
    return run.finish()
