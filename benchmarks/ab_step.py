"""A/B the compiled train step: variants in separate worker processes, alternated, ratios per round.

  python benchmarks/ab_step.py --config configs/bert.py:mini \\
      --variant "before:tree=/tmp/bert_jax_before" --variant "after:" \\
      --variant "unrolled:--config.model.scan_layers=False"

A variant is `NAME:SPEC`, SPEC a space-separated list of config overrides (`--config.x=y`),
environment settings (`env:NAME=VALUE`, e.g. `env:XLA_FLAGS=...`), at most one `tree=DIR` (import
bert_jax from another checkout, e.g. `git worktree add /tmp/bert_jax_before HEAD~1`) and at most one
`config=FILE:PRESET` in place of --config (two models against each other:
`--variant "bert:config=configs/bert.py:tiny" --variant "modernbert:config=configs/modernbert.py:tiny"`). Each worker
builds the step on a synthetic batch (as `bert-jax benchmark`), warms up, then runs `--steps` steps
when asked; the driver asks the workers in turn, reversing the order every other round, so all see
about the same machine load. Reported: median wall and process CPU time per step, and the median
over rounds of each variant's speed-up against the first (wall and CPU).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def worker(args) -> None:
  sys.path.insert(0, os.getcwd())
  from bert_jax import startup  # pylint: disable=import-outside-toplevel
  startup.configure()  # before jax loads: no libtpu start-up noise on a machine without a TPU
  from bert_jax.config_utils import load_config  # pylint: disable=import-outside-toplevel
  from bert_jax.training.benchmark import TimedStep  # pylint: disable=import-outside-toplevel
  timed = TimedStep(load_config(args.config, args.override), args.batch_size, args.seq_length)
  timed.run(args.warmup)
  print("ready", flush=True)
  for line in sys.stdin:
    n = int(line)
    cpu = time.process_time()
    wall = timed.run(n) / n
    print(json.dumps({"wall": wall, "cpu": (time.process_time() - cpu) / n,
                      "loss": float(timed.metrics["loss"])}), flush=True)


def parse_variant(text: str, config: str) -> tuple[str, dict, list[str], str, str]:
  name, _, spec = text.partition(":")
  env, overrides, tree = {}, [], ROOT
  for item in spec.split():
    if item.startswith("env:"):
      key, _, value = item[4:].partition("=")
      env[key] = value
    elif item.startswith("tree="):
      tree = os.path.abspath(item[5:])
    elif item.startswith("config="):
      config = item[7:]
    elif item.startswith("--config."):
      overrides.append(item)
    else:
      raise SystemExit(f"variant {name!r}: cannot read {item!r} (want --config.x=y, env:NAME=VALUE, tree=DIR or "
                       "config=FILE:PRESET)")
  return name, env, overrides, tree, config


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--config", default="configs/bert.py:mini")
  p.add_argument("--variant", action="append", default=[])
  p.add_argument("--batch-size", type=int, default=16)
  p.add_argument("--seq-length", type=int, default=128)
  p.add_argument("--rounds", type=int, default=7)
  p.add_argument("--steps", type=int, default=3)
  p.add_argument("--warmup", type=int, default=3)
  p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  p.add_argument("--override", action="append", default=[], help=argparse.SUPPRESS)
  args = p.parse_args()
  if args.worker:
    worker(args)
    return
  if not args.variant:
    p.error("give at least one --variant NAME:SPEC")
  procs = []
  for text in args.variant:
    name, env, overrides, tree, config = parse_variant(text, args.config)
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", f"--config={config}",
           f"--batch-size={args.batch_size}", f"--seq-length={args.seq_length}", f"--warmup={args.warmup}",
           *(f"--override={o}" for o in overrides)]
    proc = subprocess.Popen(cmd, cwd=tree, env={**os.environ, **env, "PYTHONPATH": tree}, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    while (line := proc.stdout.readline()) and line.strip() != "ready":
      pass
    if not line:
      raise SystemExit(f"variant {name!r}: worker exited with {proc.wait()}")
    procs.append((name, proc))
  runs = {name: [] for name, _ in procs}
  for r in range(args.rounds):
    for name, proc in (procs if r % 2 == 0 else procs[::-1]):
      proc.stdin.write(f"{args.steps}\n")
      proc.stdin.flush()
      runs[name].append(json.loads(proc.stdout.readline()))
  base = procs[0][0]
  for name, _ in procs:
    wall = statistics.median(x["wall"] for x in runs[name])
    speedup = statistics.median(b["wall"] / x["wall"] for b, x in zip(runs[base], runs[name]))
    cpu_speedup = statistics.median(b["cpu"] / x["cpu"] for b, x in zip(runs[base], runs[name]))
    print(f"{name:14s} wall {wall * 1e3:7.1f} ms  cpu {statistics.median(x['cpu'] for x in runs[name]) * 1e3:7.1f} ms"
          f"  speed-up vs {base}: {speedup:.3f} (cpu {cpu_speedup:.3f})  loss {runs[name][-1]['loss']:.5f}")
  for _, proc in procs:
    proc.stdin.close()
    proc.wait()


if __name__ == "__main__":
  main()
