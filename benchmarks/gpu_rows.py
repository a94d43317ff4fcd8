"""The GPU rows of issue 54, in one run on one GPU: not run yet (no GPU was lent to the session that wrote it).

  pip install -e '.[bench]' 'jax[cuda12]'
  python benchmarks/gpu_rows.py --out gpu_rows.json              # on the GPU machine, ~5-8 minutes
  python benchmarks/gpu_rows.py --dry-run --out /tmp/gpu_dry.json  # the same rows at toy sizes on a CPU

Rows (each a JSON object in `--out`, with the device, versions and date; a row that fails records its error
and the next runs):
  bert_large_512   BERT-large, seq 512, bf16, attention dropout 0, batch --large-batch: bert_jax's compiled
                   train step with model.attention=dot (XLA) and =cudnn; tokens/s and MFU against the spec-sheet
                   bf16 peak (training/benchmark.py; H100/H200 989 TFLOP/s). Target: MFU >= 50%.
  torch_sdpa_512   transformers' BertForPreTraining, PyTorch SDPA, bf16 autocast, the same size, batch and
                   predictions (benchmarks/hf_compare.py's torch worker, in this process): tokens/s, and
                   bert_jax's best backend over it. Target: >= 1.5x.
  modernbert_base  ModernBERT-base at 1024 tokens (its phase 1), bf16, model.attention=cudnn: tokens/s against
                   the ModernBERT paper's ~307k tokens/s per H100 (1.7T tokens in 194 h on 8 H100s; unpadded,
                   FlashAttention 2/3: its rows are packed, as bert_jax's synthetic ones are full).
  input_512        the input pipeline on this host at seq 512 (benchmarks/data_throughput.py on the embedded
                   corpus: raw text and prepared records, one process each): rows/s x 512 (the tokens a step
                   consumes, padding included) and real tokens per CPU second, against bert_jax's step rate.
Module imports are light (no TensorFlow, no torch, no jax at import): each row imports what it needs.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import time
import traceback
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

MODERNBERT_PAPER_TOKENS_PER_S = 1.7e12 / (194 * 3600) / 8  # ~304k per H100 (the "~307k")
# Full sizes, and the dry run's toy ones (a CPU, seconds): preset, batch, sequence length.
SIZES = {False: {"bert": ("large", 16, 512), "modernbert": ("base", 32, 1024)},
         True: {"bert": ("tiny", 2, 128), "modernbert": ("tiny", 2, 128)}}


def _bert_config(preset: str, attention: str):
  from bert_jax.config_utils import load_config  # pylint: disable=import-outside-toplevel
  return load_config(f"configs/bert.py:{preset}", [
      "--config.model.dtype=bfloat16", f"--config.model.attention={attention}", "--config.model.attention_dropout=0",
      "--config.train.grad_accum_steps=1", "--config.optimizer.name=adamw"])


def bert_rows(dry: bool, steps: int) -> list[dict]:
  from bert_jax.training import benchmark  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  preset, batch, seq = SIZES[dry]["bert"]
  backends = ("dot", "cudnn") if jax.default_backend() == "gpu" else ("dot",)
  rows = []
  for backend in backends:
    r = benchmark.run_benchmark(_bert_config(preset, backend), batch, seq, steps)
    rows.append({"row": "bert_large_512", "model": f"bert-{preset}", "attention": backend, **r,
                 "target_mfu": 0.5, "meets_target": r["mfu"] >= 0.5})
  return rows


def torch_row(dry: bool, steps: int, jax_rows: list[dict]) -> dict:
  import hf_compare  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  import torch  # pylint: disable=import-outside-toplevel
  from bert_jax.training.benchmark import predictions_for, synthetic_batch  # pylint: disable=import-outside-toplevel
  preset, batch_size, seq = SIZES[dry]["bert"]
  args = types.SimpleNamespace(model=hf_compare._sizes(preset), device="gpu" if torch.cuda.is_available() else "cpu",  # pylint: disable=protected-access
                               dtype="bfloat16", hidden_dropout=0.1, attention_dropout=0.0, torch_compile=False)
  batch = synthetic_batch(batch_size, seq, predictions_for(seq), args.model["vocab_size"])
  step, info = hf_compare.torch_worker(args, {k: np.asarray(v) for k, v in batch.items()})
  for _ in range(2):
    step()
  times = []
  for _ in range(3):
    start = time.perf_counter()
    for _ in range(steps):
      step()
    times.append((time.perf_counter() - start) / steps)
  tokens = batch_size * seq / sorted(times)[1]
  best = max((r for r in jax_rows if "tokens_per_sec" in r), key=lambda r: r["tokens_per_sec"], default=None)
  return {"row": "torch_sdpa_512", "model": f"bert-{preset}", "batch_size": batch_size, "seq_length": seq,
          "step_times_s": times, "tokens_per_sec": tokens, **info,
          "bert_jax_backend": best and best["attention"],
          "bert_jax_over_torch": best and best["tokens_per_sec"] / tokens, "target_ratio": 1.5}


def modernbert_row(dry: bool, steps: int) -> dict:
  from bert_jax.config_utils import load_config  # pylint: disable=import-outside-toplevel
  from bert_jax.training import benchmark  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  preset, batch, seq = SIZES[dry]["modernbert"]
  backend = "cudnn" if jax.default_backend() == "gpu" else "dot"
  config = load_config(f"configs/modernbert.py:{preset}", [
      "--config.model.dtype=bfloat16", f"--config.model.attention={backend}", "--config.model.attention_dropout=0",
      "--config.train.grad_accum_steps=1", "--config.train.batch_warmup_steps=0"])
  r = benchmark.run_benchmark(config, batch, seq, steps)
  return {"row": "modernbert_base", "model": f"modernbert-{preset}", "attention": backend, **r,
          "paper_tokens_per_sec_per_h100": MODERNBERT_PAPER_TOKENS_PER_S,
          "over_paper": r["tokens_per_sec"] / MODERNBERT_PAPER_TOKENS_PER_S}


def input_row(dry: bool, step_tokens_per_sec: float | None) -> dict:
  """benchmarks/data_throughput.py in a process of its own (it imports TensorFlow); its table as printed,
  and the largest real-tokens-per-second figure it gives, per process."""
  seq = "128" if dry else "512"
  cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "data_throughput.py"), "--seq", seq, "--masking", "token",
         "--sources", "raw,prepared", "--workers", "0", "--batches", "3" if dry else "30",
         "--batch-size", "8" if dry else "64"]
  done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False,
                        env=dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu"))
  # Its rows: source, seq, masking, workers, examples/s (wall), per worker, per CPU s, real tokens/s per CPU s.
  rows = [line.split() for line in done.stdout.splitlines() if re.match(r"(raw|prepared)\s+\d", line)]
  per_source = {r[0]: {"examples_per_sec": float(r[4]), "real_tokens_per_cpu_sec": float(r[7])} for r in rows}
  return {"row": "input_512", "command": " ".join(cmd[1:]), "returncode": done.returncode,
          "output": done.stdout[-4000:], "stderr_tail": done.stderr[-1500:], "sources": per_source,
          "padded_tokens_per_sec": {k: v["examples_per_sec"] * int(seq) for k, v in per_source.items()},
          "step_tokens_per_sec": step_tokens_per_sec}


def _guarded(rows: list[dict], name: str, run) -> None:
  try:
    got = run()
    rows.extend(got if isinstance(got, list) else [got])
  except Exception as e:  # pylint: disable=broad-except  (one row's failure must not lose the others)
    rows.append({"row": name, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]})
  print(json.dumps(rows[-1], default=str)[:600], flush=True)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--out", default="gpu_rows.json")
  parser.add_argument("--dry-run", action="store_true", help="toy sizes, for a CPU: checks the script runs")
  parser.add_argument("--steps", type=int, default=10)
  parser.add_argument("--rows", default="bert,torch,modernbert,input")
  args = parser.parse_args(argv)
  os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # torch shares the GPU in this process
  os.chdir(ROOT)  # configs/ paths
  wanted, rows = args.rows.split(","), []
  steps = 1 if args.dry_run else args.steps
  if "bert" in wanted:
    _guarded(rows, "bert_large_512", lambda: bert_rows(args.dry_run, steps))
  if "torch" in wanted:
    _guarded(rows, "torch_sdpa_512", lambda: torch_row(args.dry_run, steps, rows))
  if "modernbert" in wanted:
    _guarded(rows, "modernbert_base", lambda: modernbert_row(args.dry_run, steps))
  if "input" in wanted:
    step_rate = max((r.get("tokens_per_sec", 0) for r in rows if r.get("row") == "bert_large_512"), default=None)
    _guarded(rows, "input_512", lambda: input_row(args.dry_run, step_rate))
  import jax  # pylint: disable=import-outside-toplevel
  header = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": jax.devices()[0].device_kind, "jax": jax.__version__, "dry_run": args.dry_run}
  with open(args.out, "w", encoding="utf-8") as f:
    json.dump({**header, "rows": rows}, f, indent=1, default=str)
  return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
  sys.exit(main())
