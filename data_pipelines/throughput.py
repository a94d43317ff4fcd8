"""`bert-jax data throughput`: examples/s and real tokens/s of a config's pretraining input, after warm-up."""
from __future__ import annotations

import multiprocessing
import os
import time

from bert_jax.data_pipelines import pipeline, workers
from bert_jax.data_pipelines.errors import DataError

_WARMUP_BATCHES = 3  # traces the TF functions and fills the prefetch queues


def _cpu_seconds() -> float:
  """This process's CPU time (all threads) plus its live child processes' (the `data.num_workers` workers),
  read from /proc where there is one (elsewhere the children are not counted)."""
  total = time.process_time()
  tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
  for child in multiprocessing.active_children():
    try:
      with open(f"/proc/{child.pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
      continue
    total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime (fields 14 and 15 of proc(5))
  return total


def _real_tokens(batch: dict) -> int:
  """The batch's non-padding input tokens (an encoder-decoder's: its encoder inputs, span_corruption.FEATURES)."""
  return int((batch["input_mask"] if "input_mask" in batch else batch["encoder_segment_ids"] > 0).sum())


def measure(config, batches: int) -> dict:
  """Reads `batches` batches of the train input after warm-up; CPU time is this process's, all threads, and
  its worker processes'."""
  if batches < 1:
    raise DataError(f"--batches={batches}; measure at least 1 batch")
  data = pipeline.for_config(config, "train", config.train.batch_size)
  try:
    for _ in range(_WARMUP_BATCHES):
      next(data)
    wall, cpu = time.perf_counter(), _cpu_seconds()
    tokens = sum(_real_tokens(next(data)) for _ in range(batches))
    wall, cpu = time.perf_counter() - wall, _cpu_seconds() - cpu
  finally:
    data.close()
  examples = batches * config.train.batch_size
  return {"examples_per_sec": examples / wall, "real_tokens_per_sec": tokens / wall,
          "real_tokens_per_cpu_sec": tokens / cpu, "batches": batches, "batch_size": config.train.batch_size,
          "seconds": wall, "cpu_seconds": cpu, "cores": workers.usable_cores(),
          "mean_real_tokens_per_row": tokens / examples}
