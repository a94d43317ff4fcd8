"""The pretraining loop: input -> sharded train step -> metrics, evaluation and checkpoints.

The same command resumes: a workdir with a checkpoint continues from it, with the input position
saved alongside, so an interrupted and resumed run sees exactly the batches of an uninterrupted one.
SIGTERM (preemption) saves a checkpoint at the next step boundary and stops.
"""
from __future__ import annotations

import contextlib
import signal
import tempfile
from typing import Any

import jax
import ml_collections
from jax.experimental import multihost_utils

from bert_jax import config_utils, pretrained, run_lock, workdir as workdir_lib
from bert_jax.data_pipelines.errors import DataError
from bert_jax.errors import UserError
from bert_jax.training import checkpoint, finite, memory, partitioning
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
  from bert_jax.data_pipelines import pipeline  # TensorFlow is imported only when there is input to read
  if split == "eval" and config.data.num_workers:
    # Evaluation rewinds its input before every run; worker processes would restart each time.
    config = ml_collections.ConfigDict(config.to_dict())
    config.data.num_workers = 0
  return pipeline.for_config(config, split, batch_size, jax.process_index(), jax.process_count())


def restore_or_init(setup: TrainSetup, ckpt: checkpoint.Checkpointer, inputs: Any
                    ) -> tuple[TrainState, int]:
  """Own latest intact checkpoint > config.init_from > fresh init. Returns (state, first step)."""
  config = setup.config
  restored = ckpt.restore_latest(setup.abstract_state, data=inputs)
  if restored is not None:
    print(f"resumed from {ckpt.directory / str(restored[1])}", flush=True)
    return restored[0]["state"], restored[1]
  state = setup.init_state(jax.random.key(config.train.seed))
  if config.init_from:
    params = checkpoint.load_params_into(config.init_from, state.params)
    state = state.replace(params=params)
    print(f"initialised from {config.init_from}", flush=True)
  return state, 0


def _check_resumable(setup: TrainSetup, ckpt: checkpoint.Checkpointer, run_dir) -> None:
  """A checkpoint this config cannot continue (another optimizer) is refused before anything is written."""
  step = ckpt.latest_step()
  if step is None:
    return
  saved = run_dir / workdir_lib.CONFIG
  ckpt.check_resumable(step, setup.abstract_state, workdir_lib.read_json(saved) if saved.exists() else None,
                       setup.config)


def _check_eval_split(inputs: Any, data_cfg: ml_collections.ConfigDict) -> None:
  """Pulls one held-out batch at start-up, so an empty split fails now, not after the first train steps."""
  try:
    next(inputs)
  except (DataError, StopIteration) as e:
    source = (f"data.eval_corpus={data_cfg.eval_corpus!r}" if data_cfg.eval_corpus
              else f"data.eval_fraction={data_cfg.eval_fraction} of the documents")
    raise UserError(f"the evaluation split ({source}) gives no examples ({e or 'no batch'}); raise "
                    "data.eval_fraction or set data.eval_corpus, or set train.eval_every_steps=0 to train "
                    "without evaluation") from None


def _write_run_files(config: ml_collections.ConfigDict, run_dir, tokenizer_path: str | None) -> None:
  """config.json (with data.vocab pointing at the copy) and the vocabulary, so the run is self-contained."""
  if jax.process_index() != 0:
    return
  saved = config.to_dict()
  if tokenizer_path:
    name = workdir_lib.path(tokenizer_path).name
    workdir_lib.copy_file(tokenizer_path, run_dir / name)
    saved["data"]["vocab"] = name
  workdir_lib.write_json(run_dir / workdir_lib.CONFIG, saved)


def evaluate(setup: TrainSetup, params: Any, inputs: Any, start_dir: str) -> dict[str, float]:
  """Metrics over config.train.eval_steps held-out batches, the same batches at every evaluation."""
  inputs.restore(start_dir)
  totals = None
  for _ in range(setup.config.train.eval_steps):
    out = setup.eval_step(params, partitioning.global_batch(next(inputs), setup.mesh))
    totals = out if totals is None else jax.tree.map(lambda a, b: a + b, totals, out)
  return summarize_eval(setup.objective, totals)


def pretrain(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Runs (or resumes) pretraining in `workdir` (a local path or gs://...), which it holds locked;
  returns the last train and eval metrics."""
  pretrained.check_init_from(config)
  # Before the workdir exists: a step that cannot fit is one line now, not an out-of-memory traceback later.
  memory.check_fits(build_train_setup(config))
  run_dir = workdir_lib.create(workdir)
  with run_lock.hold(run_dir, jax.process_index()):
    return _pretrain(pretrained.native_init_from(config, run_dir), run_dir)


def _pretrain(config: ml_collections.ConfigDict, run_dir) -> dict[str, Any]:
  checkpoint.check_same_model(run_dir, config)
  setup = build_train_setup(config)
  train_cfg = config.train
  ckpt = checkpoint.Checkpointer.for_pretraining(run_dir, config.checkpoint)
  _check_resumable(setup, ckpt, run_dir)
  inputs = make_inputs(config, "train", train_cfg.batch_size)
  _write_run_files(config, run_dir, inputs.tokenizer.path)
  state, start = restore_or_init(setup, ckpt, inputs)
  frozen = setup.load_frozen()  # a distillation teacher's params; else ()
  eval_inputs = None
  if train_cfg.eval_every_steps > 0 and train_cfg.eval_steps > 0:
    eval_inputs = make_inputs(config, "eval", train_cfg.eval_batch_size or train_cfg.batch_size)
  logger = MetricsLogger(run_dir, train_cfg.num_steps, start, tensorboard=train_cfg.tensorboard,
                         wandb=train_cfg.wandb)
  logger.write_hparams(config.to_dict())
  guard = finite.DivergenceGuard(train_cfg.skip_nonfinite_steps)
  rng = jax.random.key(train_cfg.seed + 1)
  tokens_per_step = train_cfg.batch_size * config.data.max_seq_length
  result: dict[str, Any] = {"step": start}
  pending: list = []
  last_saved = start or None
  with contextlib.ExitStack() as stack:
    eval_start = stack.enter_context(tempfile.TemporaryDirectory())
    preemption = stack.enter_context(_Preemption())
    stack.callback(logger.close)
    stack.callback(ckpt.close)
    stack.callback(inputs.close)
    if eval_inputs is not None:
      stack.callback(eval_inputs.close)
      eval_inputs.save(eval_start)
      _check_eval_split(eval_inputs, config.data)
    for step in range(start + 1, train_cfg.num_steps + 1):
      batch = partitioning.global_batch(next(inputs), setup.mesh)
      state, metrics = setup.train_step(state, batch, rng, *frozen)
      pending.append((step, guard.record(step, metrics)))
      if step % train_cfg.log_every_steps == 0 or step == train_cfg.num_steps:
        guard.check(last_saved)
        logged = [m for s, m in pending if s not in guard.skipped]
        if logged:
          result["train"] = logger.log_train(step, logged, tokens_per_step)
        pending = []
      stop = preemption.reached(step)
      if stop or step % config.checkpoint.every_steps == 0 or step == train_cfg.num_steps:
        guard.check_state(step, state, last_saved)  # a checkpoint is never a non-finite state
        ckpt.save(step, state, force=True, data=inputs)
        last_saved = step
      if eval_inputs is not None and (step % train_cfg.eval_every_steps == 0
                                      or step == train_cfg.num_steps):
        result["eval"] = evaluate(setup, state.params, eval_inputs, eval_start)
        logger.log_eval(step, result["eval"])
      result["step"] = step
      if stop:
        result["preempted"] = True
        print(f"SIGTERM: saved a checkpoint at step {step}; rerun the same command to resume", flush=True)
        break
    ckpt.wait()
  result["skipped_steps"] = guard.skipped
  return result


def load_run_config(spec: str, overrides: list[str]) -> ml_collections.ConfigDict:
  config = config_utils.load_config(spec, overrides)
  check_run_config(config)
  return config


def check_run_config(config: ml_collections.ConfigDict) -> None:
  """The training-loop settings a pretraining run config must have (the model's are checked where built)."""
  if config.train.num_steps < 1:
    raise UserError(f"train.num_steps must be >= 1, got {config.train.num_steps}")
  for key in ("log_every_steps",):
    if config.train[key] < 1:
      raise UserError(f"train.{key} must be >= 1, got {config.train[key]}")
  if config.checkpoint.every_steps < 1:
    raise UserError(f"checkpoint.every_steps must be >= 1, got {config.checkpoint.every_steps}")
  finite.check_skip_budget(config.train.skip_nonfinite_steps)
