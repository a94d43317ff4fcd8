"""Fine-tuning tricks side by side on the embedded task, from the demo pretraining checkpoint.

  bert-jax pretrain --config configs/bert.py:demo --workdir runs/demo
  python benchmarks/finetune_tricks.py --init_from runs/demo --workdir runs/tricks --seeds 0 1 2 3 4

Each method is configs/glue.py:embedded with the overrides below, run once per seed (train.seed: head,
data order and dropout together). Results go to WORKDIR/results.json as each run ends (a rerun skips the
runs already there); the table printed at the end is the fine-tuning guide's (docs/guides/finetuning.md): dev accuracy mean +- std (ddof=1)
over seeds, the expected best of n runs (Dodge et al. 2019) and the trainable share.
"""
from __future__ import annotations

import argparse
import json
import os
import time

import jax
import numpy as np

METHODS = {
    "fine-tuning": [],
    "adapters (64)": ["--config.train.mode=adapters"],
    "SMART": ["--config.smart.enabled=true"],
    "feature-based": ["--config.train.mode=feature"],
    "feature-based, layer mix": ["--config.train.mode=feature", "--config.head.pooling=layer_mix"],
    "fine-tuning, layer mix": ["--config.head.pooling=layer_mix"],
}


def run_one(method: str, seed: int, init_from: str, workdir: str) -> dict:
  from bert_jax.config_utils import load_config  # pylint: disable=import-outside-toplevel
  from bert_jax.finetune import trainer  # pylint: disable=import-outside-toplevel
  overrides = METHODS[method] + [f"--config.init_from={init_from}", f"--config.train.seed={seed}",
                                 "--config.train.tensorboard=false"]
  config = load_config("configs/glue.py:embedded", overrides)
  run_dir = os.path.join(workdir, method.replace(" ", "_").replace(",", "").replace("(", "").replace(")", ""),
                         f"seed{seed}")
  start = time.time()
  results = trainer.finetune(config, run_dir)
  with open(os.path.join(run_dir, "config.json")) as f:
    share = json.load(f)["trainable_parameters"]["share"]
  return {"accuracy": results["dev"]["accuracy"], "seconds": time.time() - start, "trainable_share": share}


def table(done: dict) -> str:
  from bert_jax.finetune.sweep import expected_max  # pylint: disable=import-outside-toplevel
  lines = ["| method | trains | dev accuracy (mean ± std) | expected best of 1 / 3 / 5 runs | s per run |",
           "|---|---|---|---|---|"]
  for method in METHODS:
    runs = [r for key, r in done.items() if key.rsplit("/", 1)[0] == method]
    if not runs:
      continue
    acc = np.array([r["accuracy"] for r in runs])
    best = " / ".join(f"{expected_max(acc, n):.3f}" for n in (1, 3, 5))
    std = acc.std(ddof=1) if len(acc) > 1 else 0.0
    lines.append(f"| {method} | {100 * runs[0]['trainable_share']:.3g}% | {acc.mean():.3f} ± {std:.3f} "
                 f"(n={len(acc)}) | {best} | {np.mean([r['seconds'] for r in runs]):.0f} |")
  return "\n".join(lines)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--init_from", default="runs/demo")
  parser.add_argument("--workdir", default="runs/tricks")
  parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
  parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
  args = parser.parse_args()
  os.makedirs(args.workdir, exist_ok=True)
  jax.config.update("jax_compilation_cache_dir", os.path.join(args.workdir, "xla_cache"))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  path = os.path.join(args.workdir, "results.json")
  done = {}
  if os.path.exists(path):
    with open(path) as f:
      done = json.load(f)
  for seed in args.seeds:  # seeds outermost: a cut-short run still compares every method
    for method in args.methods:
      key = f"{method}/{seed}"
      if key not in done:
        done[key] = run_one(method, seed, args.init_from, args.workdir)
        with open(path, "w") as f:
          json.dump(done, f, indent=1)
        print(f"{key}: {done[key]}", flush=True)
  print(table(done))


if __name__ == "__main__":
  main()
