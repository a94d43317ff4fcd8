"""Divergence: a non-finite loss or gradient norm stops the run (or skips that update), and no
non-finite state is ever saved.

The check adds no host round-trip per step. `guard_step` makes the jitted step return one more scalar
with its metrics, `finite` (loss and gradient norm both finite), computed on device; the host reads
these flags where it reads the metrics anyway (at logging) and before every checkpoint. Before a
checkpoint it also checks the state itself: a finite gradient times a huge learning rate can still
overflow the parameters. So every saved checkpoint is finite, and keep-last-N rotation can only ever
drop a finite checkpoint for a newer finite one.

With `train.skip_nonfinite_steps=N` (N > 0) a step whose loss or gradient norm is not finite keeps
the previous parameters and optimizer state (as large-batch LAMB recipes skip overflowed steps); the
step counter, the input and the dropout stream move on (an objective's carry, XLNet's memory, is kept). Each skipped step is printed, and the run
stops as diverged once more than N steps were skipped.
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from bert_jax.errors import UserError
from bert_jax.ops.finite import tree_is_finite

FINITE = "finite"


class TrainingDiverged(UserError):
  """The loss, gradient norm or state stopped being finite; the run stopped without saving it."""


def guard_step(step_fn: Callable, skip: bool) -> Callable:
  """`step_fn(state, batch, rng, ...) -> (state, metrics)` plus metrics[FINITE] (a bool scalar).

  With `skip`, a non-finite step returns the incoming params and optimizer state (step + 1).
  """
  def guarded(state, *args, **kwargs):
    new_state, metrics = step_fn(state, *args, **kwargs)
    finite = jnp.isfinite(metrics["loss"]) & jnp.isfinite(metrics["grad_norm"])
    if skip:
      keep = lambda new, old: jnp.where(finite, new, old)  # noqa: E731
      new_state = new_state.replace(params=jax.tree.map(keep, new_state.params, state.params),
                                    opt_state=jax.tree.map(keep, new_state.opt_state, state.opt_state),
                                    teacher=jax.tree.map(keep, new_state.teacher, state.teacher),
                                    carry=jax.tree.map(keep, new_state.carry, state.carry))
    return new_state, {**metrics, FINITE: finite}
  return guarded


class DivergenceGuard:
  """Host side of the check: reads the steps' finite flags when the metrics are read anyway.

  `record` takes each step's metrics (and strips the flag); `check` reads the flags recorded since the
  last check and returns the steps that were skipped, or raises TrainingDiverged naming the step;
  `check_state` also checks the state itself, before a checkpoint.
  """

  def __init__(self, skip_budget: int):
    self.skip_budget = skip_budget
    self.skipped: list[int] = []
    self._unchecked: list[tuple[int, jax.Array]] = []

  def record(self, step: int, metrics: dict) -> dict:
    metrics = dict(metrics)
    self._unchecked.append((step, metrics.pop(FINITE)))
    return metrics

  def _diverged(self, step: int, what: str, last_saved: int | None) -> TrainingDiverged:
    kept = (f"the latest checkpoint, step {last_saved}, is finite" if last_saved is not None
            else "no checkpoint was saved")
    skip = ("" if self.skip_budget else
            ", or set train.skip_nonfinite_steps=N to skip up to N such steps")
    return TrainingDiverged(f"training diverged: {what} at step {step}; stopped without saving it ({kept}); "
                            f"lower optimizer.learning_rate{skip}")

  def check(self, last_saved: int | None) -> set[int]:
    """The steps skipped since the last check; raises TrainingDiverged on a non-finite step."""
    steps, flags = [s for s, _ in self._unchecked], jax.device_get([f for _, f in self._unchecked])
    self._unchecked = []
    newly = set()
    for step, ok in zip(steps, flags):
      if ok:
        continue
      if len(self.skipped) >= self.skip_budget:
        what = ("the loss or gradient norm is not finite" if not self.skip_budget else
                f"more than train.skip_nonfinite_steps={self.skip_budget} steps were not finite "
                f"(skipped {self.skipped})")
        raise self._diverged(step, what, last_saved)
      self.skipped.append(step)
      newly.add(step)
      print(f"step {step}: loss or gradient norm not finite; update skipped ({len(self.skipped)} of "
            f"train.skip_nonfinite_steps={self.skip_budget})", flush=True)
    return newly

  def check_state(self, step: int, state: Any, last_saved: int | None) -> set[int]:
    """`check`, then whether the state's params and optimizer state are finite (before a save)."""
    skipped = self.check(last_saved)
    if not tree_is_finite((state.params, state.opt_state)):
      raise self._diverged(step, "the parameters or optimizer state are not finite", last_saved)
    return skipped
