"""Where a compiled train step's estimated time goes, op by op (tpu/estimate.py's model, per op).

  python benchmarks/step_breakdown.py --save step.hlo -- compile --config configs/bert.py:large --topology v4-8 \
      --config.data.max_seq_length=512 --config.train.batch_size=32 --config.train.grad_accum_steps=1
  python benchmarks/step_breakdown.py --hlo step.hlo --devices 4

The first runs `bert-jax compile` and keeps the train step's compiled module; the second reads a kept one. Both
print the compute-bound and memory-bound time (without splash's kernel FLOPs, which `compile` adds from the
model), the memory-bound ops grouped by where they run (inside the layers' loop or outside it) and the ops that
spend the most HBM time with their result shapes.
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this tree's bert_jax


def op_rows(text: str, topology: str, num_devices: int) -> list[dict]:
  """One row per op: its computation, opcode, trip count, FLOPs, HBM bytes and seconds, as tpu/estimate.py counts."""
  from bert_jax.tpu import estimate, hlo, slices  # pylint: disable=import-outside-toplevel
  chip = slices.parse(topology).chip
  module, analyse = hlo.parse(text), estimate._cost_analysis()  # pylint: disable=protected-access
  peak, hbm = chip.peak_bf16_flops / chip.devices_per_chip, chip.hbm_bytes_per_s / chip.devices_per_chip
  rows = []
  for computation, line, match, times, _ in hlo.walk(module):
    opcode = match.group(2)
    if (hlo.collective_kind(opcode) or opcode in estimate._FREE or opcode.endswith("-done")  # pylint: disable=protected-access
        or (opcode == "custom-call" and estimate._NO_DATA_CALL.search(line))):  # pylint: disable=protected-access
      continue
    one = hlo.op_module(module, computation, line)
    operands = re.findall(r"%p\d+ = (.*) parameter", one)
    if opcode == "custom-call":
      flops = 0.0
      nbytes = sum(hlo.buffer_bytes(t) for t in operands + [match.group(1)] if not estimate._ON_CHIP.search(t))  # pylint: disable=protected-access
    else:
      costs = analyse(one)
      flops, nbytes = costs.get("flops", 0.0), estimate._hbm_bytes(costs, operands, match.group(1))  # pylint: disable=protected-access
    compute, memory = flops / peak, nbytes / hbm
    rows.append({"computation": computation, "opcode": opcode, "times": times, "result": match.group(1)[:120],
                 "flops": flops * times, "bytes": nbytes * times,
                 "compute_s": compute * times if compute >= memory else 0.0,
                 "memory_s": memory * times if memory > compute else 0.0})
  return rows


def report(rows: list[dict], top: int = 25) -> str:
  lines = [f"compute-bound {sum(r['compute_s'] for r in rows) * 1e3:.2f} ms, memory-bound "
           f"{sum(r['memory_s'] for r in rows) * 1e3:.2f} ms, HBM {sum(r['bytes'] for r in rows) / 1e9:.2f} GB, "
           f"{sum(r['flops'] for r in rows) / 1e12:.3f} TFLOP per device (splash's kernel FLOPs not included)"]
  groups = collections.defaultdict(lambda: [0.0, 0.0, 0])
  for r in rows:
    group = groups[(r["opcode"], "in a loop" if r["times"] > 1 else "outside loops")]
    group[0] += r["memory_s"]
    group[1] += r["bytes"]
    group[2] += 1
  lines.append("memory-bound time by opcode and place:")
  for (opcode, where), (seconds, nbytes, count) in sorted(groups.items(), key=lambda kv: -kv[1][0]):
    if seconds >= 5e-6:  # 0.005 ms
      lines.append(f"  {seconds * 1e3:7.2f} ms {nbytes / 1e9:7.2f} GB  {count:4d} x {opcode} {where}")
  lines.append(f"the {top} ops with the most memory-bound time:")
  for r in sorted(rows, key=lambda r: -r["memory_s"])[:top]:
    lines.append(f"  {r['memory_s'] * 1e3:7.3f} ms {r['bytes'] / 1e9:6.2f} GB x{r['times']} {r['opcode']} | {r['result']}")
  return "\n".join(lines)


def compile_and_keep(path: str, argv: list[str]) -> tuple[str, str, int]:
  """Runs `bert-jax compile argv`, keeping the train step's module text (the first one estimated) in `path`."""
  from bert_jax import cli  # pylint: disable=import-outside-toplevel
  from bert_jax.tpu import estimate  # pylint: disable=import-outside-toplevel
  kept: list[tuple[str, int]] = []
  step_time = estimate.step_time

  def keeping(text, chip, num_devices):
    kept.append((text, num_devices))
    return step_time(text, chip, num_devices)

  estimate.step_time = keeping
  try:
    status = cli.main(argv)
  finally:
    estimate.step_time = step_time
  if status or not kept:
    sys.exit(status or 1)
  with open(path, "w") as f:
    f.write(kept[0][0])
  return kept[0][0], argv[argv.index("--topology") + 1], kept[0][1]


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--hlo", help="a train step's module kept by --save")
  parser.add_argument("--devices", type=int, default=0, help="with --hlo: the slice's device count")
  parser.add_argument("--topology", default="v4-8", help="with --hlo: the chip's kind (its peak and HBM bandwidth)")
  parser.add_argument("--save", help="compile (the arguments after --) and keep the train step's module here")
  parser.add_argument("--top", type=int, default=25)
  args, rest = parser.parse_known_args()
  rest = [a for a in rest if a != "--"]
  if args.save:
    text, topology, devices = compile_and_keep(args.save, rest)
  elif args.hlo and args.devices:
    text, topology, devices = open(args.hlo).read(), args.topology, args.devices
  else:
    parser.error("--save PATH -- compile ..., or --hlo PATH --devices N")
  print(report(op_rows(text, topology, devices), args.top))


if __name__ == "__main__":
  main()
