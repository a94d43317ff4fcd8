"""Metric writing: clu writers (TensorBoard + logs), WORKDIR/metrics.jsonl, and a progress line."""
from __future__ import annotations

import json
import os
import time

import jax
import numpy as np


class MetricsLogger:
  """Writes train and eval scalars to TensorBoard (clu) and one JSON object per row to metrics.jsonl."""

  def __init__(self, workdir: str, num_steps: int, start_step: int):
    from clu import metric_writers, periodic_actions  # clu's writers import TensorFlow
    self._primary = jax.process_index() == 0
    self._writer = metric_writers.create_default_writer(workdir, just_logging=not self._primary)
    self._progress = periodic_actions.ReportProgress(num_train_steps=num_steps, writer=self._writer)
    self._jsonl = open(os.path.join(workdir, "metrics.jsonl"), "a") if self._primary else None
    self._num_steps = num_steps
    self._last_time, self._last_step = time.time(), start_step

  def _row(self, row: dict) -> None:
    if self._jsonl:
      self._jsonl.write(json.dumps(row) + "\n")
      self._jsonl.flush()

  def tick(self, step: int) -> None:
    self._progress(step)

  def log_train(self, step: int, metrics: list[dict], tokens_per_step: int) -> dict:
    """Averages the per-step metrics since the last call, adds throughput, writes and prints them."""
    host = jax.device_get(metrics)
    scalars = {k: float(np.mean([m[k] for m in host])) for k in host[0]}
    now = time.time()
    steps_per_sec = (step - self._last_step) / max(now - self._last_time, 1e-9)
    self._last_time, self._last_step = now, step
    scalars.update(steps_per_sec=steps_per_sec, tokens_per_sec=steps_per_sec * tokens_per_step)
    self._writer.write_scalars(step, scalars)
    self._row({"step": step, **scalars})
    eta = (self._num_steps - step) / max(steps_per_sec, 1e-9)
    shown = " | ".join(f"{k} {scalars[k]:.4g}" for k in scalars if k.endswith(("loss", "accuracy")))
    if self._primary:
      print(f"step {step}/{self._num_steps} | {shown} | lr {scalars['learning_rate']:.3g} | "
            f"{steps_per_sec:.2f} steps/s | ETA {eta / 60:.1f} min", flush=True)
    return scalars

  def log_eval(self, step: int, scalars: dict) -> None:
    self._writer.write_scalars(step, {f"eval/{k}": v for k, v in scalars.items()})
    self._row({"step": step, "eval": True, **scalars})
    if self._primary:
      print(f"eval at step {step} | " + " | ".join(f"{k} {v:.4g}" for k, v in scalars.items()), flush=True)

  def close(self) -> None:
    self._writer.flush()
    self._writer.close()
    if self._jsonl:
      self._jsonl.close()
