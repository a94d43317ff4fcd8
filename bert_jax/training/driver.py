"""The one run driver: what every job does around its steps, written once. A job is a *learner* that
owns only what differs between jobs (its batches, its step, its evaluation, what its parameters are
saved as); the driver owns the rest:

  start-up  `run_job`: the config checked, init_from checked, the workdir created and locked
            (training/loop.py:hold), a finished run reported instead of trained (train.restart: set
            aside), init_from converted into the workdir, run_config.json written;
  resume    own paused state (WORKDIR/state, with `Progress`) > the learner's initial parameters;
  the loop  `segment`: the only place a `MetricsLogger` and a `loop.Loop` are built (pretraining's
            driver, training/trainer.py, steps through it too);
  keep-best the best evaluation's parameters to params/ (train.keep_best) and early stopping
            (train.early_stopping_patience): `Progress`, saved beside the train state;
  finish    the kept (best, else last) parameters saved, evaluated once more, eval_results.json, the
            learner's outputs (predictions), finished.json, the paused state removed.

The same rules for every job (tests/test_driver.py):
  - train.eval_every_* = 0: no evaluation while training; a learner's final parameters are always
    evaluated once at `finish` (eval_results.json). Pretraining has no finish evaluation: its held-out
    split exists only with train.eval_every_steps > 0.
  - The starting parameters are evaluated (logged as step 0, kept as `Progress.initial`, reported as
    initial/* in eval_results.json) when the learner asks (`evaluates_start`: sbert) or the config does
    (train.eval_at_start: pretraining); a resumed run does not repeat it; it never counts for keep-best.
  - The final train state is checkpointed only where the checkpoint is the job's output (pretraining:
    `save_at_end`); a learner's output is params/, and its paused state is removed at finish.

The learner (`Learner`, below) is the whole interface a new job implements: fine-tuning
(finetune/trainer.py:Run, which task distillation and Theseus reach through its model learners),
multi-task fine-tuning (finetune/multitask.py:MultiTaskRun) and the bi-encoder (sbert/train.py:Training).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Iterator, Protocol

import jax
import ml_collections

from bert_jax import config_schema, pretrained, workdir as workdir_lib
from bert_jax.training import checkpoint, finite, loop
from bert_jax.training.metrics import MetricsLogger
from bert_jax.training.step import TrainSetup


@dataclasses.dataclass
class Scored:
  """A learner's evaluation of some parameters."""
  score: float  # the selection score, higher is better: keep-best and early stopping read it
  scalars: dict[str, float]  # the row metrics.jsonl logs for it
  results: dict  # what eval_results.json holds when these are the final parameters
  loss: float = math.nan  # the dev loss (finished.json's best_loss; nan for tasks without one)
  outputs: Any = None  # raw outputs the learner writes its predictions from


class Learner(Protocol):
  """What a job owns. Everything else a run does is the driver's."""
  config: ml_collections.ConfigDict
  setup: TrainSetup  # the sharded setup: abstract_state, make_state, mesh, num_steps
  steps_per_epoch: int  # for train.eval_every_epochs
  tokens_per_step: int  # for the logged tokens/s
  score_name: str  # what Scored.score is, as finished.json and the early-stopping line say it
  evaluates_start: bool  # a fresh run evaluates its starting parameters first (see the module docstring)

  def initial_params(self) -> Any:
    """A fresh run's parameters (init_from's over a fresh init), in the setup's shardings."""

  def batches(self, start: int, end: int) -> Iterator[dict]:
    """Host batches of steps start + 1 .. end."""

  def step(self, state: Any, batch: dict) -> tuple[Any, dict]:
    """The jitted train step, rng bound."""

  def evaluate(self, params: Any) -> Scored:
    """The dev evaluation of `params`."""

  def exported(self, params: Any) -> Any:
    """The part of the parameters that params/ holds (a student's projection stays out)."""

  def save_params(self, params: Any) -> None:
    """Writes params/ and config.json (the saved config) from the full parameters."""

  def write_outputs(self, params: Any, scored: Scored) -> None:
    """What the learner writes besides eval_results.json at the end (predictions), or nothing."""


def segment(config: ml_collections.ConfigDict, run_dir, learner: Any, signals: loop.StopRequests,
            guard: finite.DivergenceGuard, *, state: Any, start: int, end: int,
            save: Callable[[int, Any], None], evaluate: Callable[[int, Any], loop.Evaluation] | None,
            eval_every: int, save_at_end: bool = False, last_saved: int | None = None,
            counts_evaluation: Callable[[int], bool] | None = None, eval_at_start: bool = False) -> loop.Outcome:
  """Steps `learner` (its setup, `batches`, `step`, `tokens_per_step`) from `start` to `end` through the one
  loop, logging to run_dir (the run's hyperparameters once, at step 0)."""
  cfg = config.train
  logger = MetricsLogger(run_dir, learner.setup.num_steps, start, tensorboard=cfg.tensorboard, wandb=cfg.wandb)
  try:
    if start == 0:
      logger.write_hparams(config.to_dict())
    steps = loop.Loop(
        step_fn=learner.step, mesh=learner.setup.mesh,
        cadence=loop.Cadence(learner.setup.num_steps, cfg.log_every_steps, eval_every,
                             config.checkpoint.every_steps, eval_at_start),
        logger=logger, guard=guard, signals=signals, save=save, evaluate=evaluate,
        tokens_per_step=learner.tokens_per_step, save_at_end=save_at_end, last_saved=last_saved,
        counts_evaluation=counts_evaluation)
    return steps.run(state, learner.batches(start, end), start, end)
  finally:
    logger.close()


@dataclasses.dataclass
class Progress:
  """What a paused run must remember besides its train state."""
  best_score: float = -math.inf
  best_step: int = -1
  best_loss: float = math.nan  # the dev loss of the best evaluation (nan for tasks without one)
  last_score: float = math.nan
  bad_evals: int = 0
  stopped_early: bool = False
  # The last step whose evaluation these fields count: a state saved at an evaluation step is saved before
  # that evaluation, so a run resumed there evaluates it again (training/loop.py: counts_evaluation).
  evaluated_step: int = -1
  initial: dict = dataclasses.field(default_factory=dict)  # the starting parameters' scalars (evaluates_start)

  def counts(self, step: int) -> bool:
    return self.evaluated_step >= step


class Driver:
  """One learner's run in a workdir: `advance(to_step)` trains until then or until it stops, `pause` keeps
  its state for a later Driver on the same workdir, `finish` evaluates and writes the outputs. A signal
  (`signals`, training/loop.py) stops `advance` with the state saved (`stopped_by`)."""

  def __init__(self, config: ml_collections.ConfigDict, run_dir, learner: Learner,
               signals: loop.StopRequests | None = None):
    self.config, self.run_dir, self.learner = config, workdir_lib.path(run_dir), learner
    self.signals = signals or loop.StopRequests()
    self.stopped_by: str | None = None
    self.guard = finite.DivergenceGuard(config.train.skip_nonfinite_steps)
    self.state, self.progress = self._start()

  @property
  def setup(self) -> TrainSetup:
    return self.learner.setup

  @property
  def step(self) -> int:
    return int(self.state.step)

  @property
  def finished(self) -> bool:
    return self.progress.stopped_early or self.step >= self.setup.num_steps

  @property
  def last_kept(self) -> int | None:
    return self.progress.best_step if self.progress.best_step >= 0 else None

  @property
  def keep_best(self) -> bool:
    return bool(self.config.train.get("keep_best", False))

  def _start(self):
    """Own paused state > the learner's initial parameters."""
    paused = checkpoint.resume_paused(self.run_dir, self.setup.abstract_state, self.config)
    if paused is not None:
      return paused[0], Progress(**paused[1])
    return self.setup.make_state(self.learner.initial_params()), Progress()

  def advance(self, to_step: int | None = None) -> float:
    """Trains up to `to_step` (default: the end), evaluating on the way; returns the best score."""
    end = min(to_step or self.setup.num_steps, self.setup.num_steps)
    ckpt = checkpoint.Checkpointer.paused(self.run_dir, self.config.checkpoint)
    try:
      outcome = segment(
          self.config, self.run_dir, self.learner, self.signals, self.guard, state=self.state, start=self.step,
          end=end, save=lambda step, state: self._save_state(ckpt, step, state), evaluate=self._evaluate_and_keep,
          eval_every=config_schema.eval_every(self.config.train, self.learner.steps_per_epoch),
          last_saved=self.last_kept, counts_evaluation=self.progress.counts,
          eval_at_start=self.learner.evaluates_start)
    finally:
      ckpt.close()
    self.state, self.stopped_by = outcome.state, outcome.stopped_by
    return self.progress.best_score

  def _evaluate_and_keep(self, step: int, state: Any) -> loop.Evaluation:
    """Scores the dev set; saves the parameters if they are the best so far (train.keep_best); stops early
    after train.early_stopping_patience evaluations without a better score. Step 0's evaluation (the
    starting parameters) is only recorded."""
    scored = self.learner.evaluate(state.params)
    progress = self.progress
    if step == 0:
      progress.initial = dict(scored.scalars)
      return loop.Evaluation(scored.scalars)
    progress.last_score, progress.evaluated_step = scored.score, step
    kept = scored.score > progress.best_score
    if kept:
      progress.best_score, progress.best_step, progress.bad_evals = scored.score, step, 0
      progress.best_loss = float(scored.loss)
      if self.keep_best:
        self.learner.save_params(state.params)
    else:
      progress.bad_evals += 1
    patience = self.config.train.get("early_stopping_patience", 0)
    progress.stopped_early = bool(patience) and progress.bad_evals >= patience
    if progress.stopped_early and jax.process_index() == 0:
      print(f"early stopping at step {step} of {self.setup.num_steps}: {patience} evaluation(s) without a better "
            f"dev {self.learner.score_name} than {progress.best_score:.4g} (step {progress.best_step}); "
            f"train.early_stopping_patience={patience}", flush=True)
    return loop.Evaluation(scored.scalars, kept=kept and self.keep_best, stop=progress.stopped_early)

  def _save_state(self, ckpt: checkpoint.Checkpointer, step: int, state: Any) -> None:
    ckpt.save(step, state, force=True, progress=dataclasses.asdict(self.progress))

  def pause(self) -> None:
    """Saves the train state so that a new Driver on this workdir continues where this one stopped."""
    self.guard.check_state(self.step, self.state, self.last_kept)
    ckpt = checkpoint.Checkpointer.paused(self.run_dir, self.config.checkpoint)
    try:
      self._save_state(ckpt, self.step, self.state)
    finally:
      ckpt.close()

  def final_params(self) -> Any:
    """The kept (best) parameters, with what params/ does not hold (a student's projection) from the state."""
    if self.keep_best and self.progress.best_step >= 0:
      abstract = self.learner.exported(self.setup.abstract_state.params)
      return {**self.state.params, **checkpoint.load_params_into(self.run_dir, abstract)}
    return self.state.params

  def finish(self) -> dict:
    """The final parameters (kept best, else last; with eval_only the starting ones) saved and evaluated:
    eval_results.json, the learner's outputs, finished.json (a training run), the paused state removed."""
    eval_only = self.config.get("eval_only", False)
    params = self.state.params if eval_only else self.final_params()
    if not eval_only and not (self.keep_best and self.progress.best_step >= 0):
      self.learner.save_params(params)
    scored = self.learner.evaluate(params)
    results = {**scored.results, **{f"initial/{k}": v for k, v in self.progress.initial.items()}}
    workdir_lib.write_json(self.run_dir / workdir_lib.EVAL_RESULTS, results)
    self.learner.write_outputs(params, scored)
    if not eval_only:
      loop.write_finished(self.run_dir, {**self._record(), "dev": results})
    if (self.run_dir / workdir_lib.PAUSED).exists():
      (self.run_dir / workdir_lib.PAUSED).rmtree()
    return results

  def _record(self) -> dict:
    p = self.progress
    return {"step": self.step, "num_steps": self.setup.num_steps, "best_step": p.best_step,
            "best_score": p.best_score if p.best_step >= 0 else None, "best_loss": p.best_loss,
            "score": self.learner.score_name, "stopped_early": p.stopped_early}

  def result(self) -> dict:
    """What the job returns (see `run_job`)."""
    record = {k: v for k, v in self._record().items() if k != "best_loss"}
    return {**record, "stopped_by": self.stopped_by, "finished_before": False,
            "dev": {} if self.stopped_by else self.finish()}


def run_job(config: ml_collections.ConfigDict, workdir: str, *, validate: Callable[[Any], None],
            learner: Callable[[ml_collections.ConfigDict, Any], Learner]) -> dict:
  """How a learner's job runs: `validate(config)` and init_from's check before anything is written; then,
  holding the workdir (loop.hold), a finished run's record (finished_before) unless train.restart, or:
  init_from converted into the workdir, the learner built (`learner(config, run_dir)`) and its run started
  (a paused state is checked against the run config it was saved with), the new run config written, the
  run trained (unless eval_only) and finished. Returns {"dev": the final dev results, "step", "num_steps",
  "best_step", "best_score", "score", "stopped_early", "stopped_by", "finished_before"}."""
  validate(config)
  pretrained.check_init_from(config)
  with loop.hold(workdir, restart=config.train.restart) as (run_dir, signals):
    before = loop.read_finished(run_dir)
    if before is not None:
      return {**before, "stopped_by": None, "finished_before": True}
    config = pretrained.native_init_from(config, run_dir)
    run = Driver(config, run_dir, learner(config, run_dir), signals)
    workdir_lib.write_json(run_dir / workdir_lib.RUN_CONFIG, config.to_dict())
    if not config.get("eval_only", False):
      run.advance()
    return run.result()


def stopped_line(workdir, result: dict) -> str:
  """The line a run paused by a signal or a deadline ends with ('' for a run that was not stopped)."""
  if not result["stopped_by"]:
    return ""
  return (f"stopped at step {result['step']}/{result['num_steps']} by {result['stopped_by']} | train state in "
          f"{workdir}/{workdir_lib.PAUSED} | next: the same command resumes")


def finished_before(workdir, result: dict) -> str:
  """The prefix of the `done:` line of a run that had already finished ('' otherwise)."""
  if not result["finished_before"]:
    return ""
  return (f"{workdir}: this run finished at step {result['step']}; nothing to train (--config.train.restart=true "
          "trains it again) | ")

