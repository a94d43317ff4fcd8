"""Checks a finished README demo run (`bert-jax pretrain --config configs/bert.py:demo`) against the
learning criteria README.md states for it; `.ci/run` calls it after README's first command.

  python3 tests/readme_demo_check.py runs/demo
"""
import json
import os
import sys

# README.md, "the demo learns": keep the two in step.
CRITERIA = {
    "first train loss (steps 1-50) at least": 8.5,
    "last train loss (steps 1151-1200) at most": 6.3,
    "last train mlm_accuracy at least": 0.13,
    "final eval mlm_accuracy at least": 0.12,
}


def main(workdir: str) -> int:
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    rows = [json.loads(line) for line in f if line.strip()]
  train = [r for r in rows if not r.get("eval")]
  evals = [r for r in rows if r.get("eval")]
  seen = {
      "first train loss (steps 1-50) at least": train[0]["loss"],
      "last train loss (steps 1151-1200) at most": train[-1]["loss"],
      "last train mlm_accuracy at least": train[-1]["mlm_accuracy"],
      "final eval mlm_accuracy at least": evals[-1]["mlm_accuracy"],
  }
  failed = []
  for name, bound in CRITERIA.items():
    ok = seen[name] <= bound if name.endswith("at most") else seen[name] >= bound
    print(f"{'ok  ' if ok else 'FAIL'} {name} {bound}: {seen[name]:.4f}")
    failed += [] if ok else [name]
  if train[-1]["step"] != 1200:
    print(f"FAIL the run ended at step {train[-1]['step']}, not 1200")
    failed.append("steps")
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1]))
