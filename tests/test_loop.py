"""The one loop's own guarantees, with a toy step (no model): the host stays at most one step ahead of the
device, the actions run in their order on their cadence, a signal stops it at the step it is on, a
second Ctrl-C stops at once, and the time left after a resume counts from the resume."""
import json
import os
import signal

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from etils import epath

from bert_jax.training import finite, loop, metrics, partitioning
from bert_jax.training.step import TrainState

MESH = partitioning.make_mesh(ml_collections.ConfigDict({"data": -1, "fsdp": 1, "tensor": 1}), jax.devices()[:1])


class _Logger:
  """What the loop asks of training/metrics.py's MetricsLogger, kept in lists."""

  def __init__(self):
    self.rows, self.evals = [], []
    self.logged_rows = {}  # {(step, evaluation): scalars}: what metrics.jsonl held when the run started

  def logged(self, step, evaluation=False):
    return self.logged_rows.get((step, evaluation))

  def forget_eval(self, step):
    self.logged_rows.pop((step, True), None)

  def log_train(self, step, window, tokens_per_step, resumed_from=None):
    self.rows.append((step, len(window), resumed_from))
    return {"loss": float(np.mean([m["loss"] for m in jax.device_get(window)]))}

  def log_eval(self, step, scalars):
    self.evals.append(step)


def _toy_loop(step_fn, cadence, actions, **kwargs):
  return loop.Loop(step_fn=step_fn, mesh=MESH, cadence=cadence, logger=_Logger(), guard=finite.DivergenceGuard(0),
                   signals=loop.StopRequests(), save=lambda step, state: actions.append(("save", step)),
                   evaluate=lambda step, state: actions.append(("eval", step)) or loop.Evaluation({"x": 1.0}),
                   **kwargs)


def _batches():
  while True:
    yield {"x": np.ones((1, 4), np.float32)}


def _slow_step():
  """A step the device takes a while over (a few dozen milliseconds)."""
  @jax.jit
  def step(state, batch):
    w = jnp.eye(384) + state.params
    for _ in range(12):
      w = jnp.tanh(w @ w)
    loss = jnp.mean(w) + jnp.sum(batch["x"])
    return (TrainState(state.step + 1, state.params, state.opt_state),
            {"loss": loss, "grad_norm": loss, "learning_rate": loss, "finite": jnp.isfinite(loss)})
  return step


def _state(step=0):
  return TrainState(jnp.int32(step), jnp.zeros((), jnp.float32), ())


def test_the_host_stays_one_step_ahead_of_the_device():
  """Step K is dispatched only once the device has finished step K - 2, however slow the device: so a
  signal read on the host after step K is answered with the state of step K, at most one step later."""
  step, losses, pending = _slow_step(), [], []

  def dispatch(state, batch):  # at step K: is step K - 2 still running on the device?
    pending.append(len(losses) >= 2 and not losses[-2].is_ready())
    state, metrics = step(state, batch)
    losses.append(metrics["loss"])
    return state, metrics

  outcome = _toy_loop(dispatch, loop.Cadence(30, log_every=30), []).run(_state(), _batches(), 0, 30)
  assert outcome.step == 30 and not any(pending), pending


def test_actions_run_in_order_on_their_cadence_and_a_signal_stops_at_its_step(monkeypatch):
  """Every 2 steps a row, every 3 a checkpoint, every 4 an evaluation (after the checkpoint of its step);
  SIGTERM read after step 7: a row and a checkpoint there, no evaluation, the run stops."""
  actions = []
  steps = _toy_loop(_slow_step(), loop.Cadence(12, log_every=2, eval_every=4, checkpoint_every=3), actions)
  monkeypatch.setattr(steps.signals, "reached", lambda step: step == 7)
  outcome = steps.run(_state(), _batches(), 0, 12)
  assert actions == [("save", 3), ("eval", 4), ("save", 6), ("save", 7)]
  assert [s for s, _, _ in steps.logger.rows] == [2, 4, 6, 7] and steps.logger.evals == [4]
  assert outcome.step == 7 and outcome.stopped_by == "SIGTERM" and steps.last_saved == 7


def test_the_first_row_after_a_resume_says_it_averages_fewer_steps():
  actions = []
  steps = _toy_loop(_slow_step(), loop.Cadence(8, log_every=4), actions)
  steps.run(_state(5), _batches(), 5, 8)
  assert steps.logger.rows == [(8, 3, 5)] and actions == [("save", 8)]  # the end is saved (pretraining's)


@pytest.mark.parametrize("eval_row", [False, True])
def test_a_resumed_run_evaluates_its_step_when_that_evaluation_has_no_row(eval_row):
  """Killed during step 4's evaluation, after its checkpoint: metrics.jsonl has step 4's train row and no
  evaluation row, so the resumed run evaluates step 4 first. Resumed at its end (killed before the job
  wrote finished.json), it reports the end's rows as the uninterrupted run did, evaluating if none."""
  for start, end in ((4, 8), (8, 8)):
    actions = []
    steps = _toy_loop(_slow_step(), loop.Cadence(8, log_every=4, eval_every=4, checkpoint_every=4), actions)
    steps.logger.logged_rows = {(start, False): {"loss": 2.0}, **({(start, True): {"x": 0.5}} if eval_row else {})}
    outcome = steps.run(_state(start), _batches(), start, end)
    evaluated = [] if eval_row else [("eval", start)]
    assert actions == evaluated + ([("save", 8), ("eval", 8)] if start < end else [])
    if start == end:
      assert outcome.train == {"loss": 2.0} and outcome.eval == {"x": 0.5 if eval_row else 1.0}


def test_an_evaluation_the_jobs_state_does_not_count_is_done_again_and_its_row_replaced():
  """Fine-tuning saves its progress (best score, evaluations without improvement) before the evaluation of
  the state's step: resumed there with that evaluation's row written (SIGTERM at an evaluation step, a kill
  after its row), the job's progress does not count it, so the loop evaluates it again in place of the row.
  Before: the row was taken as done, and keep-best and early stopping differed from the uninterrupted run."""
  for counted, evaluated in ((False, [("eval", 4)]), (True, [])):
    actions = []
    steps = _toy_loop(_slow_step(), loop.Cadence(8, log_every=4, eval_every=4, checkpoint_every=4), actions,
                      counts_evaluation=lambda step, counted=counted: counted)
    steps.logger.logged_rows = {(4, False): {"loss": 2.0}, (4, True): {"x": 0.5}}
    steps.run(_state(4), _batches(), 4, 8)
    assert actions == evaluated + [("save", 8), ("eval", 8)]
    assert ((4, True) in steps.logger.logged_rows) == counted  # the old row goes when it is evaluated again


def test_an_evaluation_row_of_one_step_is_dropped_alone(tmp_path):
  file = tmp_path / "metrics.jsonl"
  rows = [{"step": 4, "loss": 1.0}, {"step": 4, "eval": True, "x": 0.5}, {"step": 8, "eval": True, "x": 0.6}]
  file.write_text("".join(json.dumps(r) + "\n" for r in rows))
  metrics.drop_eval_rows_of(epath.Path(file), 4)
  assert [json.loads(line) for line in file.read_text().splitlines()] == [rows[0], rows[2]]


def test_a_second_ctrl_c_stops_at_once(capsys):
  # The handler in place before (Python's default, or what an earlier test in this xdist worker left) comes back.
  before = signal.signal(signal.SIGINT, signal.default_int_handler)
  with loop.StopRequests() as requests:
    os.kill(os.getpid(), signal.SIGINT)
    assert requests.reached(7) and requests.name == "Ctrl-C" and requests.exit_code == 130
    with pytest.raises(KeyboardInterrupt):
      os.kill(os.getpid(), signal.SIGINT)
  assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
  signal.signal(signal.SIGINT, before)
  # said, not silent (before: it exited without saying that nothing was saved)
  assert capsys.readouterr().out.splitlines()[-1] == (
      "Ctrl-C again: stopped at once, nothing saved (the checkpoint at step 7 was not written); the workdir keeps "
      "its last checkpoint, which the same command resumes from")


def test_time_left_after_a_resume_counts_from_the_resume():
  """Resumed at step 100 of 200: the first row (step 110) comes 30 s later, compile included; then
  1 step/s. At step 150 the time left is 50 s (counted from step 0 it would be 150 steps in 70 s: 23 s;
  with the compile in the pace, 40 + 10 steps in 70 s: 70 s)."""
  now = [0.0]
  pace = metrics.Pace(200, 100, clock=lambda: now[0])
  now[0] = 30.0
  assert pace.update(110) == pytest.approx((10 / 30, 90 * 3.0))
  now[0] = 70.0
  assert pace.update(150) == pytest.approx((1.0, 50.0))
