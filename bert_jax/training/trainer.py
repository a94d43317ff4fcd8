"""The pretraining loop: input -> sharded train step -> metrics, evaluation and checkpoints.

The same command resumes: a workdir with a checkpoint continues from it, with the input position
saved alongside, so an interrupted and resumed run sees exactly the batches of an uninterrupted one.
SIGTERM (preemption) saves a checkpoint at the next step boundary and stops.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import tempfile
import time
from typing import Any

import jax
import ml_collections
from jax.experimental import multihost_utils

from bert_jax import config_utils
from bert_jax.errors import UserError
from bert_jax.training import checkpoint, partitioning
from bert_jax.training.metrics import MetricsLogger
from bert_jax.training.step import TrainSetup, TrainState, build_train_setup, summarize_eval


class _Preemption:
  """Turns SIGTERM into a flag the loop checks at step boundaries (agreed across hosts)."""

  def __init__(self):
    self.requested = False

  def __enter__(self):
    self._previous = signal.signal(signal.SIGTERM, self._handle)
    return self

  def _handle(self, signum, frame):
    self.requested = True

  def __exit__(self, *exc):
    signal.signal(signal.SIGTERM, self._previous)

  def reached(self, step: int) -> bool:
    if jax.process_count() > 1:
      # All hosts must stop at the same step; JAX's preemption sync manager agrees on one.
      return multihost_utils.reached_preemption_sync_point(step)
    return self.requested


def make_inputs(config: ml_collections.ConfigDict, split: str, batch_size: int):
  from data_pipelines import pipeline  # TensorFlow is imported only when there is input to read
  data_cfg = config.data
  if split == "eval" and data_cfg.num_workers:
    # Evaluation rewinds its input before every run; worker processes would restart each time.
    data_cfg = ml_collections.ConfigDict(data_cfg.to_dict())
    data_cfg.num_workers = 0
  return pipeline.make_pretrain_input(
      data_cfg, global_batch_size=batch_size, process_index=jax.process_index(),
      process_count=jax.process_count(), seed=config.data.seed, split=split,
      max_position_embeddings=config.model.max_position_embeddings,
      model_vocab_size=config.model.vocab_size)


def _abstract_with_shardings(setup: TrainSetup) -> TrainState:
  return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                      setup.abstract_state, setup.state_shardings)


def restore_or_init(setup: TrainSetup, ckpt: checkpoint.Checkpointer, inputs: Any
                    ) -> tuple[TrainState, int]:
  """Own latest checkpoint > config.init_from > fresh init. Returns (state, first step)."""
  config = setup.config
  step = ckpt.latest_step()
  if step is not None:
    state = ckpt.restore(step, _abstract_with_shardings(setup), inputs)
    print(f"resumed from {os.path.join(ckpt.manager.directory, str(step))}", flush=True)
    return state, step
  state = setup.init_state(jax.random.key(config.train.seed))
  if config.init_from:
    params = checkpoint.load_params_into(config.init_from, state.params)
    state = state.replace(params=params)
    print(f"initialised from {config.init_from}", flush=True)
  return state, 0


def _write_run_files(config: ml_collections.ConfigDict, workdir: str, tokenizer_path: str | None) -> None:
  """config.json (with data.vocab pointing at the copy) and the vocabulary, so the run is self-contained."""
  if jax.process_index() != 0:
    return
  saved = config.to_dict()
  if tokenizer_path:
    name = os.path.basename(tokenizer_path)
    destination = os.path.join(workdir, name)
    if os.path.abspath(tokenizer_path) != os.path.abspath(destination):
      shutil.copyfile(tokenizer_path, destination)
    saved["data"]["vocab"] = name
  with open(os.path.join(workdir, "config.json"), "w") as f:
    json.dump(saved, f, indent=2, sort_keys=True, default=str)


def evaluate(setup: TrainSetup, params: Any, inputs: Any, start_dir: str) -> dict[str, float]:
  """Metrics over config.train.eval_steps held-out batches, the same batches at every evaluation."""
  inputs.restore(start_dir)
  totals = None
  for _ in range(setup.config.train.eval_steps):
    out = setup.eval_step(params, partitioning.global_batch(next(inputs), setup.mesh))
    totals = out if totals is None else jax.tree.map(lambda a, b: a + b, totals, out)
  return summarize_eval(setup.objective, totals)


def pretrain(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Runs (or resumes) pretraining in `workdir`; returns the last train and eval metrics."""
  os.makedirs(workdir, exist_ok=True)
  checkpoint.check_same_model(workdir, config)
  setup = build_train_setup(config)
  train_cfg = config.train
  inputs = make_inputs(config, "train", train_cfg.batch_size)
  _write_run_files(config, workdir, inputs.tokenizer.path)
  ckpt = checkpoint.Checkpointer(workdir, config.checkpoint)
  state, start = restore_or_init(setup, ckpt, inputs)
  eval_inputs = None
  if train_cfg.eval_every_steps > 0 and train_cfg.eval_steps > 0:
    eval_inputs = make_inputs(config, "eval", train_cfg.eval_batch_size or train_cfg.batch_size)
  logger = MetricsLogger(workdir, train_cfg.num_steps, start)
  rng = jax.random.key(train_cfg.seed + 1)
  tokens_per_step = train_cfg.batch_size * config.data.max_seq_length
  result: dict[str, Any] = {"step": start}
  pending: list = []
  with contextlib.ExitStack() as stack:
    eval_start = stack.enter_context(tempfile.TemporaryDirectory())
    if eval_inputs is not None:
      eval_inputs.save(eval_start)
    preemption = stack.enter_context(_Preemption())
    stack.callback(logger.close)
    stack.callback(ckpt.close)
    stack.callback(inputs.close)
    if eval_inputs is not None:
      stack.callback(eval_inputs.close)
    for step in range(start + 1, train_cfg.num_steps + 1):
      batch = partitioning.global_batch(next(inputs), setup.mesh)
      state, metrics = setup.train_step(state, batch, rng)
      pending.append(metrics)
      logger.tick(step)
      if step % train_cfg.log_every_steps == 0 or step == train_cfg.num_steps:
        result["train"] = logger.log_train(step, pending, tokens_per_step)
        pending = []
      if eval_inputs is not None and (step % train_cfg.eval_every_steps == 0
                                      or step == train_cfg.num_steps):
        result["eval"] = evaluate(setup, state.params, eval_inputs, eval_start)
        logger.log_eval(step, result["eval"])
      stop = preemption.reached(step)
      if stop or step % config.checkpoint.every_steps == 0 or step == train_cfg.num_steps:
        ckpt.save(step, state, inputs, force=True)
      result["step"] = step
      if stop:
        result["preempted"] = True
        print(f"SIGTERM: saved a checkpoint at step {step}; rerun the same command to resume", flush=True)
        break
    ckpt.wait()
  return result


def load_run_config(spec: str, overrides: list[str]) -> ml_collections.ConfigDict:
  config = config_utils.load_config(spec, overrides)
  if config.train.num_steps < 1:
    raise UserError(f"train.num_steps must be >= 1, got {config.train.num_steps}")
  for key in ("log_every_steps",):
    if config.train[key] < 1:
      raise UserError(f"train.{key} must be >= 1, got {config.train[key]}")
  if config.checkpoint.every_steps < 1:
    raise UserError(f"checkpoint.every_steps must be >= 1, got {config.checkpoint.every_steps}")
  return config
