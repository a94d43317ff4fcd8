"""XLNet-tiny against BERT-tiny: training tokens/s on this machine's CPU, the same run (BENCHMARKS.md "XLNet-tiny
and BERT-tiny on CPU").

Each round pretrains every model for `--steps` steps on the embedded corpus (a fresh workdir, no evaluation or
checkpoint), in turn, and reads the training tokens/s of the run's last logged interval (after the compile) from
its metrics.jsonl; the rounds alternate the models so that a change of the machine's load falls on all of them.
Prints one JSON object: per model its tokens/s per round, their median, and the median of the per-round ratios
to BERT-tiny.

  python benchmarks/xlnet_vs_bert.py --rounds 3 --steps 40
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

# name: (preset, overrides). XLNet-tiny is 4 layers against BERT-tiny's 2: also at 2 layers, the same width.
MODELS = {
    "bert-tiny": ("configs/bert.py:tiny", []),
    "xlnet-tiny": ("configs/xlnet.py:tiny", []),
    "xlnet-tiny-2-layers": ("configs/xlnet.py:tiny", ["--config.model.num_layers=2"]),
}
COMMON = ["--config.train.batch_size=32", "--config.data.max_seq_length=128", "--config.train.eval_every_steps=0",
          "--config.checkpoint.every_steps=0", "--config.train.tensorboard=false"]


def tokens_per_sec(preset: str, overrides: list[str], steps: int, workdir: str) -> float:
  from bert_jax.training import trainer  # pylint: disable=import-outside-toplevel
  log = max(steps // 4, 1)
  config = trainer.load_run_config(preset, [*COMMON, *overrides, f"--config.train.num_steps={steps}",
                                            f"--config.train.log_every_steps={log}"])
  trainer.pretrain(config, workdir)
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  return [r for r in rows if "tokens_per_sec" in r][-1]["tokens_per_sec"]


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--steps", type=int, default=40)
  args = parser.parse_args()
  os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))  # configs/ are relative
  rates: dict[str, list[float]] = {name: [] for name in MODELS}
  with tempfile.TemporaryDirectory() as scratch:
    for r in range(args.rounds):
      for name, (preset, overrides) in MODELS.items():
        rates[name].append(tokens_per_sec(preset, overrides, args.steps, os.path.join(scratch, f"{name}-{r}")))
        print(f"round {r + 1}: {name} {rates[name][-1]:.0f} tokens/s", file=sys.stderr, flush=True)
  base = rates["bert-tiny"]
  report = {name: {"tokens_per_sec": [round(x) for x in xs], "median": round(statistics.median(xs)),
                   "ratio_to_bert_tiny": round(statistics.median(x / b for x, b in zip(xs, base)), 3)}
            for name, xs in rates.items()}
  report["load_average"] = os.getloadavg()[0]
  print(json.dumps(report, indent=1))


if __name__ == "__main__":
  main()
