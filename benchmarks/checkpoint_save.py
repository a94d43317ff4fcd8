"""Time the train state's checkpoint save on one host, with orbax's replica-parallel writes and without.

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python benchmarks/checkpoint_save.py \\
      --config configs/bert.py:tiny --rounds 3 --saves 3

The state (params and AdamW's moments) is replicated over every local device, as a data-parallel run
holds it. Each variant runs in a fresh process per round (alternating which goes first) and saves the
state `--saves` times with `training.checkpoint.Checkpointer`, synchronously, each into a fresh folder.
Reported per variant: the median over rounds of the process's first save (which pays for compiling
anything the save runs) and of its later saves, and the bytes on disk. "whole" is what bert_jax does with
one process (params_checkpoint.whole_array_writes); "replica-parallel" is orbax's default, which slices
each replicated array once per device that holds it.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARIANTS = {"whole": False, "replica-parallel": True}


def _bytes(folder: str) -> int:
  return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(folder) for f in files)


def worker(args) -> None:
  sys.path.insert(0, ROOT)
  from bert_jax import startup  # pylint: disable=import-outside-toplevel
  startup.configure()
  import jax  # pylint: disable=import-outside-toplevel
  import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel
  from bert_jax.config_utils import load_config  # pylint: disable=import-outside-toplevel
  from bert_jax.training import checkpoint, partitioning  # pylint: disable=import-outside-toplevel
  from bert_jax.training.step import build_train_setup  # pylint: disable=import-outside-toplevel

  config = load_config(args.config, [])
  setup = build_train_setup(config, partitioning.make_mesh(config.mesh, jax.devices()))
  state = jax.block_until_ready(setup.init_state(jax.random.key(0)))
  times, size = [], 0
  for _ in range(args.saves):
    with tempfile.TemporaryDirectory() as folder:
      ckpt = checkpoint.Checkpointer(folder, keep=1, async_save=False, items=())
      ocp.type_handlers.register_type_handler(  # after the Checkpointer's own choice
          jax.Array, ocp.type_handlers.ArrayHandler(use_replica_parallel=VARIANTS[args.worker]), override=True)
      start = time.perf_counter()
      ckpt.save(1, state, force=True)
      ckpt.wait()
      times.append(time.perf_counter() - start)
      ckpt.close()
      size = _bytes(folder)
  print(json.dumps({"times": times, "bytes": size, "devices": jax.device_count()}), flush=True)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", default="configs/bert.py:tiny")
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--saves", type=int, default=3)
  parser.add_argument("--worker", choices=sorted(VARIANTS), help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.worker:
    worker(args)
    return 0
  runs = {name: [] for name in VARIANTS}
  for r in range(args.rounds):
    for name in (list(VARIANTS) if r % 2 == 0 else list(VARIANTS)[::-1]):
      done = subprocess.run([sys.executable, __file__, "--worker", name, "--config", args.config,
                             "--saves", str(args.saves)], capture_output=True, text=True, check=True)
      runs[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
  print(json.dumps({"config": args.config, "devices": runs["whole"][0]["devices"], "rounds": args.rounds, **{
      name: {"first_save_s": round(statistics.median(r["times"][0] for r in rs), 3),
             "later_saves_s": round(statistics.median(t for r in rs for t in r["times"][1:]), 3),
             "bytes": rs[-1]["bytes"]} for name, rs in runs.items()}}))
  return 0


if __name__ == "__main__":
  sys.exit(main())
