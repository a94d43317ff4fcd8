"""What the one loop's wait costs: training/loop.py keeps the host at most one step ahead of the device
(so a signal is answered at the step the device is on). This runs the same pretraining step through
`Loop.run` with that wait and without it, alternating, and reports the steps per second of each.

  python benchmarks/loop_lookahead.py --config configs/bert.py:demo --steps 40 --rounds 8

Synthetic batches of the data contract's shapes (all-ones tokens: speed does not depend on them); a
metrics row every `--log-every` steps, no evaluation, no checkpoint. Reported: each round's steps/s
and the median ratio with/without the wait.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import jax
import numpy as np
from etils import epath

from bert_jax.config_utils import load_config
from bert_jax.training import finite, loop, objectives
from bert_jax.training.metrics import MetricsLogger
from bert_jax.training.step import build_train_setup


def _batches(config):
  batch = objectives.example_batch(config.train.batch_size, config.data.max_seq_length,
                                   config.data.max_predictions_per_seq)
  batch = {**batch, "input_ids": np.ones_like(batch["input_ids"])}
  while True:
    yield batch


def steps_per_second(setup, config, steps: int, log_every: int, wait: bool) -> float:
  original = loop.jax.block_until_ready
  if not wait:
    loop.jax.block_until_ready = lambda tree: tree
  try:
    with tempfile.TemporaryDirectory() as directory:
      logger = MetricsLogger(epath.Path(directory), steps, 0, tensorboard=False)
      rng = jax.random.key(0)
      runner = loop.Loop(step_fn=lambda state, batch: setup.train_step(state, batch, rng), mesh=setup.mesh,
                         cadence=loop.Cadence(steps, log_every), logger=logger, guard=finite.DivergenceGuard(0),
                         signals=loop.StopRequests(), save=lambda step, state: None, save_at_end=False)
      state = setup.init_state(jax.random.key(0))
      jax.block_until_ready(state)
      start = time.perf_counter()
      outcome = runner.run(state, _batches(config), 0, steps)
      jax.block_until_ready(outcome.state)
      logger.close()
      return steps / (time.perf_counter() - start)
  finally:
    loop.jax.block_until_ready = original


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", default="configs/bert.py:demo")
  parser.add_argument("--steps", type=int, default=40)
  parser.add_argument("--log-every", type=int, default=10)
  parser.add_argument("--rounds", type=int, default=8)
  args, overrides = parser.parse_known_args()
  config = load_config(args.config, overrides)
  setup = build_train_setup(config)
  steps_per_second(setup, config, 2, 1, True)  # compiles
  rates = {"wait": [], "no_wait": []}
  for _ in range(args.rounds):
    for wait in (True, False):
      rates["wait" if wait else "no_wait"].append(steps_per_second(setup, config, args.steps, args.log_every, wait))
  ratio = statistics.median(a / b for a, b in zip(rates["wait"], rates["no_wait"]))
  print(json.dumps({"config": args.config, "devices": jax.device_count(), "steps": args.steps,
                    "steps_per_sec": {k: [round(r, 2) for r in v] for k, v in rates.items()},
                    "median_ratio_wait_over_no_wait": round(ratio, 3)}))


if __name__ == "__main__":
  main()
