"""Does dropping attention dropout hurt? README's demo (`configs/bert.py:demo`, the embedded corpus) pretrained
with BERT's attention dropout (0.1) and without (0.0, what BERT-large's preset ships so that TPU runs splash),
for the same steps and seeds; the held-out MLM accuracy at the last step of each run. Runs in this process,
one after another, alternating the two settings (a seed sets train.seed and data.seed: init, dropout,
masking and order); each finished run is appended to `--out` (resumable).

  python benchmarks/attention_dropout_demo.py --steps 400 --seeds 0 1 2 --out benchmarks/attention_dropout_demo.jsonl
  python benchmarks/attention_dropout_demo.py --out benchmarks/attention_dropout_demo.jsonl --table
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

DROPOUTS = (0.1, 0.0)


def run(seed: int, dropout: float, steps: int, workdir: str) -> dict:
  from bert_jax import cli  # pylint: disable=import-outside-toplevel
  start, cpu = time.time(), time.process_time()
  status = cli.main(["pretrain", "--config", "configs/bert.py:demo", "--workdir", workdir, f"--config.train.seed={seed}", f"--config.data.seed={seed}",
                     f"--config.model.attention_dropout={dropout}", f"--config.train.num_steps={steps}",
                     f"--config.train.eval_every_steps={steps}", f"--config.checkpoint.every_steps={steps}"])
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    rows = [json.loads(line) for line in f if line.strip()]
  last_eval = [r for r in rows if r.get("eval")][-1]
  last_train = [r for r in rows if not r.get("eval")][-1]
  return {"seed": seed, "attention_dropout": dropout, "steps": steps, "status": status,
          "eval_step": last_eval["step"], "eval_mlm_accuracy": last_eval["mlm_accuracy"],
          "eval_mlm_loss": last_eval.get("mlm_loss"), "train_loss": last_train["loss"],
          "wall_s": time.time() - start, "cpu_s": time.process_time() - cpu}


def table(rows: list[dict]) -> str:
  lines = ["| attention dropout | seed | held-out MLM accuracy | held-out MLM loss | last train loss |",
           "|---|---|---|---|---|"]
  for r in sorted(rows, key=lambda r: (-r["attention_dropout"], r["seed"])):
    lines.append(f"| {r['attention_dropout']} | {r['seed']} | {r['eval_mlm_accuracy']:.4f} | "
                 f"{r['eval_mlm_loss']:.4f} | {r['train_loss']:.4f} |")
  for dropout in DROPOUTS:
    acc = [r["eval_mlm_accuracy"] for r in rows if r["attention_dropout"] == dropout]
    if acc:
      spread = f" +- {statistics.stdev(acc):.4f}" if len(acc) > 1 else ""
      lines.append(f"| {dropout} | mean of {len(acc)} | {statistics.mean(acc):.4f}{spread} | | |")
  return "\n".join(lines)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--steps", type=int, default=400)
  parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
  parser.add_argument("--out", default="benchmarks/attention_dropout_demo.jsonl")
  parser.add_argument("--table", action="store_true", help="print the table of --out and stop")
  args = parser.parse_args()
  done = []
  if os.path.exists(args.out):
    with open(args.out, encoding="utf-8") as f:
      done = [json.loads(line) for line in f if line.strip()]
  if not args.table:
    for seed in args.seeds:
      for dropout in DROPOUTS:
        if any(r["seed"] == seed and r["attention_dropout"] == dropout and r["steps"] == args.steps for r in done):
          continue
        with tempfile.TemporaryDirectory() as workdir:
          row = run(seed, dropout, args.steps, os.path.join(workdir, "run"))
        print(json.dumps(row), flush=True)
        done.append(row)
        with open(args.out, "a", encoding="utf-8") as f:
          f.write(json.dumps(row) + "\n")
  print(table([r for r in done if r["steps"] == args.steps]))


if __name__ == "__main__":
  main()
