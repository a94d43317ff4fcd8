"""The one training loop. Every job (pretraining with each objective, ELECTRA included; fine-tuning;
task-specific and general distillation) steps through `Loop.run` and so logs, evaluates, checkpoints
and answers signals the same way; `hold` is how every job starts. training/driver.py builds the loop
(the only place that does) and owns what a run does around it.

A job hands the loop its jitted step (rng and frozen inputs bound: `(state, batch) -> (state,
metrics)`), an iterator of host batches whose first is step `start + 1`'s, and three actions:
`save(step, state)` (a checkpoint the same command resumes from), `evaluate(step, state)` and, in
`Cadence`, how often each runs. After each step, in this order:

  1. the step's metrics are kept on device with its `finite` flag (training/finite.py);
  2. the signals are read (`StopRequests`): SIGTERM or a first Ctrl-C asks for a stop at this step;
  3. every `log_every` steps, at the end and at a stop: the kept metrics are averaged, written and
     printed with the pace and the time left (training/metrics.py);
  4. every `checkpoint_every` steps, at a stop, and at the end when the job keeps its final state: the
     state is checked finite and saved;
  5. every `eval_every` steps and at the end (`eval_every` = 0: no evaluation while training): the
     state is checked finite and evaluated; the job may answer "stop" (early stopping).
With `Cadence.eval_at_start`, a run from step 0 with an evaluation also evaluates its starting state first,
logged as step 0 (continued pretraining's "before", sbert's starting encoder); a resumed run does not.
A checkpoint comes before the evaluation of its step, so an evaluation that fails loses no step: a run
resumed at a step whose evaluation is due and has no row in metrics.jsonl (killed during it) evaluates it
first; a run resumed at its end (killed before the job's finish) reports that step's logged metrics.
The host runs at most one step ahead of the device, so a signal is answered at the step the device
is on, not many queued steps later.
"""
from __future__ import annotations

import contextlib
import dataclasses
import signal
import threading
from typing import Any, Callable, Iterator

import jax
from etils import epath
from jax.experimental import multihost_utils
from jax.sharding import Mesh

from bert_jax import run_lock, workdir as workdir_lib
from bert_jax.training import finite, partitioning
from bert_jax.training.metrics import MetricsLogger

NAMES = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "Ctrl-C"}
EXIT_CODES = {signal.SIGTERM: 143, signal.SIGINT: 130}  # 128 + the signal's number, as a shell reports it


def exit_code(stopped_by: str | None) -> int:
  """A job's exit status: 143 after SIGTERM, 130 after Ctrl-C (its checkpoint saved), else 0."""
  return {NAMES[s]: code for s, code in EXIT_CODES.items()}.get(stopped_by, 0)


class StopRequests:
  """SIGTERM (preemption, a scheduler) and Ctrl-C as a request that the loop answers after the current
  step by saving a checkpoint and stopping; a second Ctrl-C raises KeyboardInterrupt at once, without
  saving. On several processes SIGTERM stays JAX's preemption notice, so the hosts agree on the step
  (`reached_preemption_sync_point`), and Ctrl-C is handed to it as a SIGTERM. Handlers are installed
  only in the main thread (Python allows no other)."""

  def __init__(self):
    self.received: int | None = None  # the first signal's number
    self.stopped_at: int | None = None
    self._previous: dict = {}
    self._multi = False

  def __enter__(self) -> "StopRequests":
    if threading.current_thread() is threading.main_thread():
      self._multi = jax.process_count() > 1
      handled = (signal.SIGINT,) if self._multi else (signal.SIGTERM, signal.SIGINT)
      self._previous = {s: signal.signal(s, self._handle) for s in handled}
    return self

  def __exit__(self, *exc) -> None:
    for signum, handler in self._previous.items():
      signal.signal(signum, handler)

  def _handle(self, signum, frame) -> None:
    del frame
    if signum == signal.SIGINT and self.received == signal.SIGINT:
      unsaved = (f"the checkpoint at step {self.stopped_at} was not written" if self.stopped_at is not None
                 else "no checkpoint was written for this stop")
      print(f"Ctrl-C again: stopped at once, nothing saved ({unsaved}); the workdir keeps its last checkpoint, "
            "which the same command resumes from", flush=True)
      raise KeyboardInterrupt
    self.received = self.received or signum
    if self._multi:
      signal.raise_signal(signal.SIGTERM)

  def reached(self, step: int) -> bool:
    """Whether the run stops at `step` (called once per step, on every process)."""
    stop = (multihost_utils.reached_preemption_sync_point(step) if self._multi
            else self.received is not None)
    if stop and self.stopped_at is None:
      self.stopped_at = step
      if self.name == "Ctrl-C" and jax.process_index() == 0:
        print(f"Ctrl-C: saving a checkpoint at step {step} (Ctrl-C again stops at once, without saving)",
              flush=True)
    return stop

  @property
  def name(self) -> str:
    return NAMES[self.received or signal.SIGTERM]

  @property
  def exit_code(self) -> int:
    return EXIT_CODES[self.received or signal.SIGTERM]


@contextlib.contextmanager
def hold(workdir: str, restart: bool = False) -> Iterator[tuple[epath.Path, StopRequests]]:
  """What every job does first: creates the workdir, takes its lock (bert_jax/run_lock.py) and answers
  SIGTERM and Ctrl-C until the job ends. With `restart` (train.restart), a finished run's files move
  to WORKDIR/previous-N/ first (an unfinished one resumes as ever). Yields (the workdir as a path,
  its StopRequests)."""
  run_dir = workdir_lib.create(workdir)
  with run_lock.hold(run_dir, jax.process_index()), StopRequests() as signals:
    if restart and read_finished(run_dir) is not None:
      _set_aside(run_dir)
    yield run_dir, signals


def read_finished(run_dir: epath.Path) -> dict | None:
  """The record a job wrote when it ran to its end (WORKDIR/finished.json), or None."""
  file = run_dir / workdir_lib.FINISHED
  return workdir_lib.read_json(file) if file.exists() else None


def write_finished(run_dir: epath.Path, record: dict) -> None:
  """Marks the workdir's run finished: running the same command again says so instead of training."""
  if jax.process_index() == 0:
    workdir_lib.write_json(run_dir / workdir_lib.FINISHED, record)


def _set_aside(run_dir: epath.Path) -> None:
  """Moves everything but the lock into the next free WORKDIR/previous-N/ (process 0; the others wait)."""
  taken = [int(p.name[len(workdir_lib.PREVIOUS):]) for p in run_dir.glob(workdir_lib.PREVIOUS + "*")
           if p.name[len(workdir_lib.PREVIOUS):].isdigit()]
  target = run_dir / f"{workdir_lib.PREVIOUS}{max(taken, default=0) + 1}"
  if jax.process_index() == 0:
    target.mkdir()
    for entry in run_dir.iterdir():
      if entry.name != run_lock.LOCK_FILE and not entry.name.startswith(workdir_lib.PREVIOUS):
        entry.rename(target / entry.name)
    print(f"train.restart: the finished run's files are now in {target}; starting again", flush=True)
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices("bert_jax previous run set aside")


@dataclasses.dataclass(frozen=True)
class Cadence:
  """When the loop does what, in steps; 0 turns a periodic action off."""
  num_steps: int  # the run's last step (the schedule's length)
  log_every: int
  eval_every: int = 0
  checkpoint_every: int = 0
  eval_at_start: bool = False  # evaluate the starting state, as step 0, when start == 0 (also with eval_every 0)


@dataclasses.dataclass
class Evaluation:
  """What a job's evaluate action returns: the scalars to log, whether it saved parameters (kept),
  and whether the run stops here (early stopping)."""
  scalars: dict[str, float]
  kept: bool = False
  stop: bool = False


@dataclasses.dataclass
class Outcome:
  """Where a loop segment ended: the state, the step, the last logged metrics, and why it stopped
  before its end (stopped_by: "SIGTERM" or "Ctrl-C"; stopped_early: the job's evaluation asked)."""
  state: Any
  step: int
  train: dict[str, float] = dataclasses.field(default_factory=dict)
  eval: dict[str, float] = dataclasses.field(default_factory=dict)
  stopped_by: str | None = None
  stopped_early: bool = False


@dataclasses.dataclass
class Loop:
  """The steps of one job (see the module docstring). `last_saved` is the latest step whose state or
  parameters are on disk (named when a run diverges)."""
  step_fn: Callable[[Any, dict], tuple[Any, dict]]
  mesh: Mesh
  cadence: Cadence
  logger: MetricsLogger
  guard: finite.DivergenceGuard
  signals: StopRequests
  save: Callable[[int, Any], None]
  evaluate: Callable[[int, Any], Evaluation] | None = None
  tokens_per_step: int = 0
  save_at_end: bool = True
  last_saved: int | None = None
  # Whether the job's restored state already counts step's evaluation (keep-best and early stopping count
  # them in the progress saved beside the state, which is saved before its step's evaluation); None: the
  # evaluation row in metrics.jsonl is the record.
  counts_evaluation: Callable[[int], bool] | None = None

  def run(self, state: Any, batches: Iterator[dict], start: int, end: int) -> Outcome:
    """Steps start + 1 .. end (or until a signal or early stopping)."""
    outcome, window, in_flight = Outcome(state, start), [], None
    resumed = start % self.cadence.log_every != 0  # the first row after it averages fewer steps
    if start == 0 and self.cadence.eval_at_start and self.evaluate is not None and self._evaluate(0, state, outcome):
      return outcome
    if start > 0 and self._pick_up(start, end, state, outcome):
      return outcome
    for step in range(start + 1, end + 1):
      state, metrics = self.step_fn(state, partitioning.global_batch(next(batches), self.mesh))
      if in_flight is not None:  # keeps the host one step ahead of the device, not more
        jax.block_until_ready(in_flight)
      in_flight = metrics
      window.append((step, self.guard.record(step, metrics)))
      stop = self.signals.reached(step)
      if step % self.cadence.log_every == 0 or step == end or stop:
        outcome.train = self._log(step, window, since=start if resumed else None) or outcome.train
        window, resumed = [], False
      if stop or self._periodic(step, self.cadence.checkpoint_every) or (step == end and self.save_at_end):
        self.guard.check_state(step, state, self.last_saved)  # a checkpoint is never a non-finite state
        self.save(step, state)
        self.last_saved = step
      outcome.state, outcome.step = state, step
      if self._evaluates() and (self._periodic(step, self.cadence.eval_every) or step == end):
        if self._evaluate(step, state, outcome):
          break
      if stop:
        outcome.stopped_by = self.signals.name
        if jax.process_index() == 0:
          print(f"{self.signals.name}: saved a checkpoint at step {step}; rerun the same command to resume",
                flush=True)
        break
    return outcome

  def _pick_up(self, start: int, end: int, state: Any, outcome: Outcome) -> bool:
    """What a resumed run takes over from its checkpoint's step: the step's train row (a run resumed at
    its end reports it, as the uninterrupted run did), and its evaluation, done now if it is due and
    metrics.jsonl has no row of it (a kill cut it short, or came before it) or the job's state does not
    count it (its row then is replaced). Whether the job stops here."""
    outcome.train = self.logger.logged(start) or {}
    if not (self._evaluates() and (self._periodic(start, self.cadence.eval_every) or start == end)):
      return False
    row = self.logger.logged(start, evaluation=True)
    if row is not None and self.counts_evaluation is not None and not self.counts_evaluation(start):
      self.logger.forget_eval(start)
      row = None
    if row is None:
      return self._evaluate(start, state, outcome)
    outcome.eval = row
    return False

  def _evaluates(self) -> bool:
    return self.evaluate is not None and self.cadence.eval_every > 0

  def _evaluate(self, step: int, state: Any, outcome: Outcome) -> bool:
    """Evaluates `state` at `step` into `outcome`; whether the job asks to stop here."""
    self.guard.check_state(step, state, self.last_saved)
    evaluation = self.evaluate(step, state)
    self.logger.log_eval(step, evaluation.scalars)
    outcome.eval = evaluation.scalars
    self.last_saved = step if evaluation.kept else self.last_saved
    outcome.stopped_early = evaluation.stop
    return evaluation.stop

  @staticmethod
  def _periodic(step: int, every: int) -> bool:
    return every > 0 and step % every == 0

  def _log(self, step: int, window: list, since: int | None) -> dict[str, float] | None:
    """Checks the window's finite flags (skipped steps stay out of the mean), then writes its mean;
    `since`: the resume step, when this row averages only the steps after it (the row says so)."""
    self.guard.check(self.last_saved)
    kept = [m for s, m in window if s not in self.guard.skipped]
    if not kept:
      return None
    return self.logger.log_train(step, kept, self.tokens_per_step, resumed_from=since)
