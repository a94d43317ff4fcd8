"""Metric writing for every job: TensorBoard and log scalars (clu), WORKDIR/metrics.jsonl, a progress line.

TensorBoard tags are `train/<name>` and `eval/<name>`, and the run's config is written as
hyperparameters. metrics.jsonl holds one JSON object per logged step ({"step", <train metrics>,
"steps_per_sec", "tokens_per_sec"}) and one per evaluation ({"step", "eval": true, <eval metrics>}).
A row is the mean over the steps since the previous row; the first row after a resume averages only
the steps since the resume, and says so ("resumed": true, "averaged_steps": N).
Only process 0 writes files; `tensorboard=False` (train.tensorboard) writes no event files.
`wandb=PROJECT` (train.wandb) also sends the scalars and the config to Weights & Biases (WandbWriter).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from typing import Any, Callable

from absl import logging
import jax
import numpy as np
from etils import epath
from jax.experimental import multihost_utils

from bert_jax import workdir
from bert_jax.errors import require


_ROW_KEYS = ("step", "eval", "resumed", "averaged_steps")  # what a row says besides its scalars


def _flat_hparams(config: dict, prefix: str = "") -> dict[str, Any]:
  """{"a": {"b": v}} -> {"a.b": v}, with values TensorBoard's hparams accept (bool, int, float, str)."""
  flat = {}
  for key, value in config.items():
    if isinstance(value, dict):
      flat.update(_flat_hparams(value, f"{prefix}{key}."))
    else:
      flat[prefix + key] = value if isinstance(value, (bool, int, float, str)) else str(value)
  return flat


def drop_rows_after(file: epath.Path, step: int) -> None:
  """Removes the rows of steps after `step`: a resumed run logs them again, so curves are not doubled."""
  if not file.exists():
    return
  lines = file.read_text().splitlines(keepends=True)
  kept = [line for line in lines if line.endswith("\n") and _row_step(line) <= step]
  if len(kept) != len(lines):
    workdir.write_text(file, "".join(kept))


def drop_eval_rows_of(file: epath.Path, step: int) -> None:
  """Removes the evaluation rows of `step`: a resumed run that evaluates that step again logs it again."""
  if not file.exists():
    return
  lines = file.read_text().splitlines(keepends=True)
  kept = [line for line in lines if not (_row_step(line) == step and _is_eval(line))]
  if len(kept) != len(lines):
    workdir.write_text(file, "".join(kept))


def _is_eval(line: str) -> bool:
  try:
    return bool(json.loads(line).get("eval"))
  except (ValueError, AttributeError):
    return False


def _row_step(line: str) -> float:
  try:
    return json.loads(line)["step"]
  except (ValueError, KeyError, TypeError):
    return float("inf")  # a row cut short by a crash mid-write


class Pace:
  """Steps per second and the time left. The time left is counted from the first logged step of this
  process (a resumed run's pace starts at its resume, and its compile is left out once a second row
  exists); before that, from the first interval."""

  def __init__(self, num_steps: int, start_step: int, clock: Callable[[], float] = time.time):
    self._num_steps, self._clock = num_steps, clock
    self._last = (start_step, clock())
    self._first: tuple[int, float] | None = None

  def update(self, step: int) -> tuple[float, float]:
    """(steps per second since the previous call, seconds left) at `step`."""
    now = self._clock()
    rate = (step - self._last[0]) / max(now - self._last[1], 1e-9)
    self._last = (step, now)
    if self._first is None:
      self._first = (step, now)
      overall = rate
    else:
      overall = (step - self._first[0]) / max(now - self._first[1], 1e-9)
    return rate, (self._num_steps - step) / max(overall, 1e-9)


class WandbWriter:
  """The scalars and hyperparameters that go to TensorBoard, sent to a Weights & Biases run (clu's
  MetricWriter calls that MetricsLogger makes, so clu's MultiWriter feeds it beside TensorBoard).

  The run's id comes from the workdir, so a resumed run continues the same W&B run. Its local files
  go under WORKDIR/wandb/ (the current directory for a gs:// workdir). WANDB_MODE=offline keeps
  everything there (`wandb sync` uploads it later).
  """

  def __init__(self, project: str, run_dir: epath.Path):
    wandb = require("wandb", "wandb", f"train.wandb={project!r} (Weights & Biases logging)")
    local = not os.fspath(run_dir).startswith("gs://")
    self._run = wandb.init(project=project, name=run_dir.name, dir=os.fspath(run_dir) if local else None,
                           id=hashlib.sha1(os.fspath(run_dir).encode()).hexdigest()[:16], resume="allow")

  def write_scalars(self, step: int, scalars: dict[str, float]) -> None:
    self._run.log(dict(scalars), step=step)

  def write_hparams(self, hparams: dict[str, Any]) -> None:
    self._run.config.update(hparams, allow_val_change=True)

  def flush(self) -> None:
    pass  # wandb sends as it goes

  def close(self) -> None:
    self._run.finish()


class _LogWriter:
  """The scalars and hyperparameters to absl's INFO log, as clu's LoggingWriter writes them: the writer of a
  run without TensorBoard, and of every process but 0."""

  def write_scalars(self, step: int, scalars: dict[str, float]) -> None:
    shown = [f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(scalars.items())]
    logging.info("[%d] %s", step, ", ".join(shown))

  def write_hparams(self, hparams: dict[str, Any]) -> None:
    logging.info("[Hyperparameters] %s", hparams)

  def flush(self) -> None:
    logging.flush()

  def close(self) -> None:
    self.flush()


class _Writers:
  """Each call to every writer in turn (clu's MultiWriter, without importing clu's writers)."""

  def __init__(self, writers: list):
    self._writers = writers

  def write_scalars(self, step: int, scalars: dict[str, float]) -> None:
    for writer in self._writers:
      writer.write_scalars(step, scalars)

  def write_hparams(self, hparams: dict[str, Any]) -> None:
    for writer in self._writers:
      writer.write_hparams(hparams)

  def flush(self) -> None:
    for writer in self._writers:
      writer.flush()

  def close(self) -> None:
    for writer in self._writers:
      writer.close()


class MetricsLogger:
  """Writes train and eval scalars to TensorBoard (clu) and metrics.jsonl, and prints progress."""

  def __init__(self, run_dir: epath.Path, num_steps: int, start_step: int, *, tensorboard: bool = True,
               wandb: str = "", clock: Callable[[], float] = time.time):
    self._primary = jax.process_index() == 0
    writers: list = [_LogWriter()]
    if tensorboard and self._primary:
      # clu's writers import TensorFlow and, through tensorboard's hparams plugin, Keras (2.6 s): only here.
      from bert_jax.data_pipelines.tftools import tf_module  # pylint: disable=import-outside-toplevel
      writers = [tf_module("clu.metric_writers").create_default_writer(os.fspath(run_dir))]
    if wandb and self._primary:
      writers.append(WandbWriter(wandb, run_dir))
    self._writer = _Writers(writers)
    self._jsonl = run_dir / workdir.METRICS if self._primary else None
    if self._jsonl:
      drop_rows_after(self._jsonl, start_step)
    self._num_steps = num_steps
    self._pace = Pace(num_steps, start_step, clock)

  def logged(self, step: int, evaluation: bool = False) -> dict[str, float] | None:
    """The scalars of `step`'s train row (or evaluation row) in metrics.jsonl, or None; every process gets
    process 0's answer (a resumed run reads what its checkpoint's step logged: training/loop.py)."""
    row = None
    if self._jsonl and self._jsonl.exists():
      for line in reversed(self._jsonl.read_text().splitlines()):
        with contextlib.suppress(ValueError):
          found = json.loads(line)
          if found.get("step") == step and bool(found.get("eval")) == evaluation:
            row = {k: v for k, v in found.items() if k not in _ROW_KEYS}
            break
    if jax.process_count() > 1:
      present = multihost_utils.broadcast_one_to_all(np.int32(row is not None))
      row = (row or {}) if int(present) else None
    return row

  def forget_eval(self, step: int) -> None:
    """Drops `step`'s evaluation rows from metrics.jsonl (the loop evaluates that step again)."""
    if self._jsonl:
      drop_eval_rows_of(self._jsonl, step)

  def _row(self, row: dict) -> None:
    if self._jsonl:
      workdir.append_line(self._jsonl, json.dumps(row))

  def write_hparams(self, config: dict) -> None:
    self._writer.write_hparams(_flat_hparams(config))

  def log_train(self, step: int, metrics: list[dict], tokens_per_step: int,
                resumed_from: int | None = None) -> dict:
    """Averages the per-step metrics since the last call, adds throughput, writes and prints them;
    `resumed_from`: the resume step, when these are the only steps since it (the row is marked)."""
    host = jax.device_get(metrics)
    scalars = {k: float(np.mean([m[k] for m in host])) for k in host[0]}
    steps_per_sec, left = self._pace.update(step)
    scalars.update(steps_per_sec=steps_per_sec, tokens_per_sec=steps_per_sec * tokens_per_step)
    self._writer.write_scalars(step, {f"train/{k}": v for k, v in scalars.items()})
    mark = {} if resumed_from is None else {"resumed": True, "averaged_steps": len(host)}
    self._row({"step": step, **scalars, **mark})
    shown = " | ".join(f"{k} {scalars[k]:.4g}" for k in scalars if k.endswith(("loss", "accuracy")))
    since = "" if resumed_from is None else f" (mean of the {len(host)} steps since the resume at {resumed_from})"
    if self._primary:
      print(f"step {step}/{self._num_steps}{since} | {shown} | lr {scalars['learning_rate']:.3g} | "
            f"{steps_per_sec:.2f} steps/s | ETA {left / 60:.1f} min", flush=True)
    return scalars

  def log_eval(self, step: int, scalars: dict) -> None:
    self._writer.write_scalars(step, {f"eval/{k}": v for k, v in scalars.items()})
    self._row({"step": step, "eval": True, **scalars})
    if self._primary:
      print(f"eval at step {step} | " + " | ".join(f"{k} {v:.4g}" for k, v in scalars.items()), flush=True)

  def close(self) -> None:
    self._writer.flush()
    self._writer.close()
