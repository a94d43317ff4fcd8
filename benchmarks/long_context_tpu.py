"""ModernBERT-base and BERT-base at 512 / 1024 / 8192 tokens, with dot and with splash attention: HBM per
chip and the estimated step on v4-8 and v5e-8, each row a `bert-jax compile --json` run on this machine
(libtpu, no TPU).

Both models in bf16 compute, without remat, data-parallel, 8,192 tokens per chip (v4-8's 4 chips: 64 rows
of 512, 32 of 1024, 4 of 8192 per step; v5e-8's 8 chips twice that), masked-LM predictions at each
recipe's rate (BERT 15%, ModernBERT 30%). BERT-base
gets 8192 positions and no attention dropout (splash has none; dot the same, for a like-for-like pair).
Results append to --out as JSON lines (a re-run skips finished rows); the markdown table is printed
from them:

  nice -n 19 python benchmarks/long_context_tpu.py --out benchmarks/long_context_tpu.jsonl
  python benchmarks/long_context_tpu.py --out benchmarks/long_context_tpu.jsonl --table
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from bert_jax.tpu import slices

MODELS = {"modernbert-base": ("configs/modernbert.py:base", 0.30, []),
          "bert-base": ("configs/bert.py:base", 0.15, ["--config.model.max_position_embeddings=8192",
                                                       "--config.model.attention_dropout=0.0"])}
SEQS = (512, 1024, 8192)
TOPOLOGIES = ("v4-8", "v5litepod-8")
BACKENDS = ("dot", "splash")
TOKENS_PER_CHIP = 8192


def _command(model: str, seq: int, topology: str, backend: str) -> list[str]:
  spec, rate, extra = MODELS[model]
  batch = TOKENS_PER_CHIP * slices.parse(topology).chips // seq
  return [sys.executable, "-m", "bert_jax.cli", "compile", "--json", "--config", spec, "--topology", topology,
          "--config.model.dtype=bfloat16", "--config.model.remat=none", f"--config.model.attention={backend}",
          "--config.mesh.data=-1", f"--config.data.max_seq_length={seq}",
          f"--config.data.max_predictions_per_seq={round(rate * seq)}",
          f"--config.train.batch_size={batch}", f"--config.data.num_shards={min(8, batch)}",
          "--config.train.grad_accum_steps=1",
          "--config.train.batch_warmup_steps=0", *extra]


def _compile(model: str, seq: int, topology: str, backend: str) -> dict:
  start = time.time()
  result = subprocess.run(_command(model, seq, topology, backend), capture_output=True, text=True,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})
  if result.returncode not in (0, 1):
    raise RuntimeError(f"{model} {seq} {topology} {backend}: {result.stderr.strip()[-2000:]}")
  report = json.loads(result.stdout.strip().splitlines()[-1])
  report.update(model=model, seq=seq, backend=backend, wall_seconds=time.time() - start)
  return report


def _key(r: dict) -> tuple:
  return r["model"], r["seq"], r["topology"], r["backend"]


def with_kernels(r: dict) -> dict:
  """A report compiled before `bert-jax compile` counted splash's kernel FLOPs (2026-11-28): the same count
  (tpu/aot.py kernel_flops, from the row's config) added to its estimate the way compile adds it."""
  if r["backend"] != "splash" or r["estimated_step_seconds"] is None or "kernel_seconds" in (r.get("estimate") or {}):
    return r
  from bert_jax.models import families  # pylint: disable=import-outside-toplevel
  from bert_jax.tpu import aot  # pylint: disable=import-outside-toplevel
  from bert_jax import config_utils  # pylint: disable=import-outside-toplevel
  overrides = [a for a in _command(r["model"], r["seq"], r["topology"], r["backend"]) if a.startswith("--config.")]
  config = config_utils.load_config(MODELS[r["model"]][0], overrides)
  chip = slices.parse(r["topology"])
  seconds = aot.kernel_flops(config, families.model_config(config.model.to_dict())) / (
      chip.chips * chip.chip.peak_bf16_flops)
  step = r["estimated_step_seconds"] + seconds
  return {**r, "estimated_step_seconds": step, "estimated_mfu": r["estimated_mfu"] * r["estimated_step_seconds"] / step}


def table(rows: list[dict]) -> str:
  lines = ["| model | tokens | chip | attention | HBM per chip | fits | estimated step | MFU (ceiling) |",
           "|---|---|---|---|---|---|---|---|"]
  order = {(m, s, t, b): i for i, (m, s, t, b) in enumerate(
      (m, s, t, b) for m in MODELS for s in SEQS for t in TOPOLOGIES for b in BACKENDS)}
  for r in sorted(map(with_kernels, rows), key=lambda r: order[_key(r)]):
    step = "-" if r["estimated_step_seconds"] is None else f"{r['estimated_step_seconds'] * 1e3:.0f} ms"
    mfu = "-" if r["estimated_mfu"] is None else f"{r['estimated_mfu']:.0%}"
    lines.append(f"| {r['model']} | {r['seq']} | {r['device_kind']} | {r['backend']} | "
                 f"{r['hbm_per_chip_bytes'] / 2 ** 30:.1f} of {r['hbm_capacity_bytes'] / 2 ** 30:.0f} GiB | "
                 f"{'yes' if r['fits'] else 'no'} | {step} | {mfu} |")
  return "\n".join(lines)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--out", required=True, help="JSON lines, one compile report each")
  parser.add_argument("--table", action="store_true", help="only print the table from --out")
  args = parser.parse_args()
  done = []
  if os.path.exists(args.out):
    with open(args.out) as f:
      done = [json.loads(line) for line in f if line.strip()]
  if not args.table:
    finished = {_key(r) for r in done}
    for model in MODELS:
      for seq in SEQS:
        for topology in TOPOLOGIES:
          for backend in BACKENDS:
            if (model, seq, topology, backend) in finished:
              continue
            report = _compile(model, seq, topology, backend)
            with open(args.out, "a") as f:
              f.write(json.dumps(report) + "\n")
            done.append(report)
            print(f"{model} {seq} {topology} {backend}: fits={report['fits']} "
                  f"{report['hbm_per_chip_bytes'] / 2 ** 30:.1f} GiB ({report['wall_seconds']:.0f} s)", flush=True)
  print(table(done))


if __name__ == "__main__":
  main()
