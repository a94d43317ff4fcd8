"""Input pipeline scaling with the host's cores: `bert-jax data throughput --json` under `taskset -c 0` and
`taskset -c 0,1`, alternating, for raw text (`raw`: in the training process; `workers`: in
data.num_workers=-1 worker processes, one per core) and for prepared rows (`rows`: `bert-jax data
prepare --format bert_tfrecord`, read by the pure tf.data pipeline), seq 128 and 512, token and span
masking.

  python benchmarks/data_scaling.py --rounds 3 --batches 40 [--cpus 0 --cpus 0,1] [--json]

The embedded corpus and WordPiece vocabulary, NSP, batch 256, data.num_shards 8. Medians over rounds of
real tokens/s (wall) and per CPU second; the speed-up is the median wall rate of the last --cpus over the first.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

_PREDICTIONS = {128: 20, 512: 80}


def _overrides(seq, masking, rows_dir=None, workers=False):
  out = [f"--config.data.max_seq_length={seq}", f"--config.data.max_predictions_per_seq={_PREDICTIONS[seq]}",
         "--config.model.max_position_embeddings=512", f"--config.data.masking={masking}",
         "--config.train.batch_size=256"]
  if workers:  # text input in one worker process per core taskset leaves it
    out.append("--config.data.num_workers=-1")
  if rows_dir:
    out += ["--config.data.format=bert_tfrecord", f"--config.data.corpus={rows_dir}/*.tfrecord"]
  return out


def _bert_jax(*args, cpus=None):
  command = (["taskset", "-c", cpus] if cpus else []) + [sys.executable, "-m", "bert_jax.cli", *args]
  out = subprocess.run(command, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"), capture_output=True, text=True,
                       check=True, timeout=900)
  return out.stdout


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--cpus", action="append", default=[], help="taskset CPU lists (default: 0 and 0,1)")
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--batches", type=int, default=40)
  parser.add_argument("--cases", default="raw:128:token,raw:128:span,rows:128:token,rows:128:span,"
                      "rows:512:token,rows:512:span", help="source:seq:masking, comma separated")
  parser.add_argument("--json", action="store_true")
  args = parser.parse_args()
  cpus = args.cpus or ["0", "0,1"]
  cases = [(s, int(q), m) for s, q, m in (c.split(":") for c in args.cases.split(","))]
  results = {}
  with tempfile.TemporaryDirectory() as tmp:
    for seq in sorted({q for s, q, _ in cases if s == "rows"}):
      _bert_jax("data", "prepare", "--format", "bert_tfrecord", "--config", "configs/bert.py:demo", "--output",
                f"{tmp}/rows{seq}", *_overrides(seq, "token")[:3])
    for _ in range(args.rounds):
      for source, seq, masking in cases:
        for c in cpus:
          over = _overrides(seq, masking, f"{tmp}/rows{seq}" if source == "rows" else None, source == "workers")
          line = _bert_jax("data", "throughput", "--config", "configs/bert.py:demo", "--batches", str(args.batches),
                           "--json", *over, cpus=c)
          run = json.loads(line.strip().splitlines()[-1])
          results.setdefault((source, seq, masking, c), []).append(run)
          print(f"{source}:{seq}:{masking} on CPUs {c}: {run['real_tokens_per_sec'] / 1e3:,.0f}k real tokens/s",
                file=sys.stderr, flush=True)
  rows = []
  for source, seq, masking in cases:
    row = {"source": source, "seq": seq, "masking": masking}
    for c in cpus:
      runs = results[(source, seq, masking, c)]
      row[f"tokens_per_sec@{c}"] = statistics.median(r["real_tokens_per_sec"] for r in runs)
      row[f"tokens_per_cpu_sec@{c}"] = statistics.median(r["real_tokens_per_cpu_sec"] for r in runs)
    row["speedup"] = row[f"tokens_per_sec@{cpus[-1]}"] / row[f"tokens_per_sec@{cpus[0]}"]
    rows.append(row)
  if args.json:
    print(json.dumps(rows))
    return
  print("| source | seq | masking | " + " | ".join(f"tokens/s on {c} (per CPU s)" for c in cpus) + " | speed-up |")
  print("|---" * (4 + len(cpus)) + "|")
  for r in rows:
    cells = " | ".join(f"{r[f'tokens_per_sec@{c}'] / 1e3:,.0f}k ({r[f'tokens_per_cpu_sec@{c}'] / 1e3:,.0f}k)"
                       for c in cpus)
    print(f"| {r['source']} | {r['seq']} | {r['masking']} | {cells} | {r['speedup']:.2f}x |")


if __name__ == "__main__":
  main()
