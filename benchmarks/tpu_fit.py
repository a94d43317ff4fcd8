"""What fits where: BERT-base/large x seq 128/512 x global batch 8k/32k on TPU slices, each row from a
`bert-jax compile --json` run on this machine (libtpu, no TPU), in bf16 with the LAMB optimizer.

For each row the data-parallel mesh (parameters and optimizer state replicated: 4 bytes x 3 x params
is 1.3 GB for BERT-base, 4 GB for BERT-large, small next to 16-95 GiB of HBM), no remat, and the
fewest micro-batches (`train.grad_accum_steps`) whose step fits with 8% of HBM to spare. The
micro-batch size is predicted from the activation bytes per row that earlier compiles of the same
model and sequence length measured, then confirmed by compiling; a row that does not fit is retried
with half the micro-batch. Results append to --out as JSON lines (a re-run skips finished rows), and
the markdown table is printed from them:

  nice -n 19 python benchmarks/tpu_fit.py --out benchmarks/tpu_fit.jsonl
  python benchmarks/tpu_fit.py --out benchmarks/tpu_fit.jsonl --table
  # recompile an earlier table with today's step, each row from the micro-batches that fitted there:
  nice -n 19 python benchmarks/tpu_fit.py --out NEW.jsonl --again benchmarks/tpu_fit.jsonl [--presets large]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from bert_jax.configs import bert
from bert_jax.tpu import slices

PRESETS = ("large", "base")
SEQS = {128: 20, 512: 80}  # max_predictions_per_seq as in BERT's recipes
BATCHES = (32768, 8192)
SLICES = ("v4-32", "v4-128", "v4-1024", "v5p-128", "v5litepod-256")
HEADROOM = 0.92


def _command(preset: str, seq: int, batch: int, topology: str, accum: int, hosts: int) -> list[str]:
  return [sys.executable, "-m", "bert_jax.cli", "compile", "--json", "--config", f"configs/bert.py:{preset}",
          "--topology", topology, "--config.model.dtype=bfloat16", "--config.model.remat=none",
          "--config.optimizer.name=lamb", "--config.mesh.data=-1", "--config.mesh.fsdp=1",
          f"--config.data.max_seq_length={seq}", f"--config.data.max_predictions_per_seq={SEQS[seq]}",
          f"--config.train.batch_size={batch}", f"--config.train.grad_accum_steps={accum}",
          f"--config.train.eval_batch_size={batch // accum}", f"--config.data.num_shards={max(8, hosts)}"]


def _compile(preset, seq, batch, topology, accum, hosts) -> dict:
  start, cpu = time.time(), os.times()
  result = subprocess.run(_command(preset, seq, batch, topology, accum, hosts), capture_output=True, text=True,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})
  end = os.times()
  if result.returncode not in (0, 1):
    raise RuntimeError(f"{preset} {seq} {batch} {topology} accum {accum}: {result.stderr.strip()[-2000:]}")
  report = json.loads(result.stdout.strip().splitlines()[-1])
  report.update(preset=preset, seq=seq, batch=batch, grad_accum_steps=accum, wall_seconds=time.time() - start,
                cpu_seconds=(end.children_user + end.children_system) - (cpu.children_user + cpu.children_system))
  return report


def _activation_bytes_per_row(done: list[dict], preset: str, seq: int) -> float | None:
  """The most activation memory per micro-batch row that a compile of this model and length needed."""
  per_row = []
  for r in done:
    if (r["preset"], r["seq"]) == (preset, seq):
      rows = r["batch"] // (r["grad_accum_steps"] * r["devices"])
      per_row.append((r["train_step"]["device_bytes"] - r["state_bytes_per_chip"] * 5 / 3) / rows)
  return max(per_row) if per_row else None


def _guess_bytes_per_row(preset: str, seq: int) -> float:
  """Before any compile: twice Korthikanti et al. (2022)'s s*h*(34 + 5*a*s/h) bytes per layer and row
  (bf16, no recompute); the factor 2 is what BERT-large at seq 128 measured here."""
  layers, hidden, heads, _ = bert.SIZES[preset]
  return 2 * layers * seq * hidden * (34 + 5 * heads * seq / hidden)


def _first_accum(rows_per_device: int, capacity: float, state: float, per_row: float) -> int:
  """Fewest micro-batches (a power of two dividing the rows) predicted to fit."""
  guess_rows = (HEADROOM * capacity - state * 5 / 3) / per_row
  accum = 1
  while accum < rows_per_device and rows_per_device // accum > max(guess_rows, 1):
    accum *= 2
  return accum


def _rows(presets=PRESETS):
  """The smallest slice first, where the presets' defaults are decided; then the rest of the table."""
  for topology in SLICES:
    for batch in BATCHES:
      for seq in SEQS:
        for preset in presets:
          yield preset, seq, batch, topology


def _best(records: list[dict]) -> dict:
  """(preset, seq, batch, topology) -> the fitting compile with the fewest micro-batches."""
  best = {}
  for r in records:
    key = (r["preset"], r["seq"], r["batch"], r["topology"])
    if r["fits"] and (key not in best or r["grad_accum_steps"] < best[key]["grad_accum_steps"]):
      best[key] = r
  return best


def run(out: str, presets=PRESETS, again: str = "") -> None:
  """Compiles the table's missing rows into `out`; with `again` (an earlier table's JSON lines) each row
  starts from the micro-batches that fitted there (a recompile of that table with today's step)."""
  done = [json.loads(line) for line in open(out)] if os.path.exists(out) else []
  finished = {(r["preset"], r["seq"], r["batch"], r["topology"]) for r in done if r["fits"]}
  earlier = _best([json.loads(line) for line in open(again)]) if again else {}
  for preset, seq, batch, topology in _rows(presets):
    if (preset, seq, batch, topology) in finished:
      continue
    tpu = slices.parse(topology)
    rows = batch // tpu.devices
    # parameters and LAMB's two moments in f32, 12 bytes per parameter, until a compile measures them
    state = max([r["state_bytes_per_chip"] for r in done if r["preset"] == preset]
                or [12 * {"base": 110e6, "large": 335e6}[preset]])
    per_row = _activation_bytes_per_row(done, preset, seq) or _guess_bytes_per_row(preset, seq)
    accum = _first_accum(rows, tpu.chip.hbm_bytes, state, per_row)
    if (preset, seq, batch, topology) in earlier:
      accum = earlier[preset, seq, batch, topology]["grad_accum_steps"]
    tried = set()
    while accum not in tried:
      tried.add(accum)
      report = _compile(preset, seq, batch, topology, accum, tpu.hosts)
      done.append(report)
      with open(out, "a") as f:
        f.write(json.dumps(report) + "\n")
      print(f"{preset} seq {seq} batch {batch} {topology} accum {accum}: fits={report['fits']} "
            f"{report['hbm_per_chip_bytes'] / 2 ** 30:.1f} GiB, {report['wall_seconds']:.0f} s wall, "
            f"{report['cpu_seconds']:.0f} s CPU", flush=True)
      if not report["fits"]:
        accum = min(accum * 2, rows)
      else:  # fewer micro-batches if the activations measured so far predict that they fit
        state = report["state_bytes_per_chip"]
        fewer = _first_accum(rows, tpu.chip.hbm_bytes, state, _activation_bytes_per_row(done, preset, seq))
        accum = fewer if fewer < accum else accum


def table(out: str) -> str:
  best = _best([json.loads(line) for line in open(out)])
  lines = ["| model | seq | global batch | slice | chips (hosts) | mesh | remat | micro-batches x rows/chip | "
           "HBM/chip (of) | collectives/step (GB sent/chip) | est. step | compute / memory / comm. bound | "
           "est. MFU | input workers/host | compile CPU s |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for key in sorted(best, key=lambda k: (PRESETS.index(k[0]), k[1], -k[2], SLICES.index(k[3]))):
    r = best[key]
    mesh = " ".join(f"{k}={v}" for k, v in r["mesh"].items() if v > 1) or "1 device"
    per_chip = r["batch"] // (r["grad_accum_steps"] * r["chips"])
    sent = sum(c["bytes"] for c in r["collectives"]) / 1e9
    count = sum(c["count"] for c in r["collectives"])
    lines.append(
        f"| {r['preset']} | {r['seq']} | {r['batch']} | {r['topology']} | {r['chips']} ({r['hosts']}) | {mesh} | "
        f"none | {r['grad_accum_steps']} x {per_chip} | {r['hbm_per_chip_bytes'] / 2 ** 30:.1f} "
        f"({r['hbm_capacity_bytes'] / 2 ** 30:.0f}) GiB | {count} ({sent:.1f}) | "
        f"{r['estimated_step_seconds'] * 1e3:.0f} ms | {_shares(r)} | {r['estimated_mfu']:.0%} | "
        f"{r['input_workers_per_host']} | "
        f"{r['cpu_seconds']:.0f} |")
  return "\n".join(lines)


def _shares(r: dict) -> str:
  e = r.get("estimate")  # tables compiled before tpu/estimate.py have none
  if not e:
    return "n/a"
  return f"{e['compute_bound_share']:.0%} / {e['memory_bound_share']:.0%} / {e['comm_bound_share']:.0%}"


if __name__ == "__main__":
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default="benchmarks/tpu_fit.jsonl")
  parser.add_argument("--table", action="store_true", help="print the markdown table from --out and stop")
  parser.add_argument("--presets", default=",".join(PRESETS), help="comma-separated: large,base")
  parser.add_argument("--again", default="", help="an earlier table's JSON lines: start each row from its "
                      "micro-batches (recompiling that table with today's step)")
  args = parser.parse_args()
  if not args.table:
    run(args.out, tuple(args.presets.split(",")), args.again)
  print(table(args.out))
