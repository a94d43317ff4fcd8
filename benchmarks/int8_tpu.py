"""What runs in int8 on a TPU, and the compression table's TPU column: the fine-tuned classifier's
forward compiled here by libtpu for one TPU chip (no TPU needed; the [tpu] extra), float (float32
parameters, as fine-tuning writes them; XLA:TPU multiplies in bf16 passes) and `quantize`'s int8 model, for a teacher and a student of the same width.

  python benchmarks/int8_tpu.py                       # all-MiniLM-L6-v2's shape, 6 vs 3 layers, v5e and v6e
  python benchmarks/int8_tpu.py --layers 12 6 --hidden 768 --heads 12 --intermediate 3072   # BERT-base

Printed per model: the compiler's matmul element types (hlo.matmul_types; "s32 <- s8 x s8" is an int8
matmul on the MXU), the forward's FLOPs (counted analytically) and a roofline time: FLOPs at the chip's
int8 peak where every compiled matmul is int8, at its bf16 peak otherwise. A roofline, not a
measurement: it leaves out HBM bandwidth, the non-matmul work and the host. (Unrolled layers would let
the compiler count the FLOPs itself, but libtpu 0.0.42.1 overflows its stack compiling the unrolled
int8 model, and so it does a scanned one with bfloat16 compute.)
"""
from __future__ import annotations

import argparse
import json

# Per chip, from cloud.google.com/tpu/docs/v5e and /v6e: bf16 and int8 peak.
CHIPS = {"v5litepod-1": (197e12, 394e12), "v6e-1": (918e12, 1836e12)}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--layers", type=int, nargs="+", default=[6, 3], help="the teacher's first, then students")
  parser.add_argument("--hidden", type=int, default=384)
  parser.add_argument("--heads", type=int, default=12)
  parser.add_argument("--intermediate", type=int, default=1536)
  parser.add_argument("--vocab", type=int, default=30522)
  parser.add_argument("--batch", type=int, default=128)
  parser.add_argument("--seq", type=int, default=128)
  parser.add_argument("--topologies", nargs="+", default=sorted(CHIPS), choices=sorted(CHIPS))
  args = parser.parse_args()
  import jax  # pylint: disable=import-outside-toplevel
  jax.config.update("jax_platforms", "cpu")  # compiling for the TPU needs no accelerator here
  from bert_jax.models.config import ModelConfig  # pylint: disable=import-outside-toplevel
  from bert_jax.tpu import aot  # pylint: disable=import-outside-toplevel
  rows = []
  for topology in args.topologies:
    bf16_peak, int8_peak = CHIPS[topology]
    base = None
    for layers in args.layers:
      for int8 in (False, True):
        config = ModelConfig(num_layers=layers, hidden_size=args.hidden, num_heads=args.heads,
                             intermediate_size=args.intermediate, vocab_size=args.vocab)
        r = aot.compile_forward(config, "classification", 2, topology, args.batch, args.seq, int8=int8)
        all_int8 = set(r["matmuls"]) == {"s32 <- s8 x s8"}
        r.update(layers=layers, int8=int8, all_matmuls_int8=all_int8,
                 roofline_seconds=r["flops"] / (int8_peak if all_int8 else bf16_peak))
        base = base or r["roofline_seconds"]
        r["roofline_speedup"] = base / r["roofline_seconds"]
        rows.append(r)
        print(json.dumps(r), flush=True)
  print(f"\n| chip | layers | compute | compiled matmuls | GFLOPs | roofline ms | speedup |\n|{'---|' * 7}")
  for r in rows:
    kinds = ", ".join(f"{n} x {k}" for k, n in sorted(r["matmuls"].items()))
    print(f"| {r['device_kind']} | {r['layers']} | {'int8' if r['int8'] else 'bf16'} | {kinds} | "
          f"{r['flops'] / 1e9:.1f} | {r['roofline_seconds'] * 1e3:.3f} | "
          f"{r['roofline_speedup']:.2f}x |")


if __name__ == "__main__":
  main()
