"""Matmul FLOPs of a compiled XLA module, read from its optimized HLO text: what bounds a CPU train step.

  python benchmarks/hlo_dots.py /tmp/hlo/bert_jax          # a folder of XLA_FLAGS=--xla_dump_to dumps
  python benchmarks/hlo_dots.py module.cpu_after_optimizations.txt

Every `dot` counts 2 x (output elements) x (contracted size), wherever it sits: at the top level or inside a
fusion (XLA:CPU puts most matmuls in YNNPACK fusions). Given a folder, the `*after_optimizations.txt` module
with the most matmul FLOPs is read (a train step's, beside small init functions). `kerashub_compare.py --dump-hlo DIR` dumps each JAX worker's modules and
reports these counts beside the step times: a step that runs its matmuls at the machine's matmul rate cannot
beat a peer by more than the ratio of their matmul FLOPs plus what the peer spends outside matmuls.
"""
from __future__ import annotations

import collections
import glob
import os
import re
import sys

_ARRAY = r"\w+\[([\d,]*)\]"
# `%name = f32[a,b]{1,0} ...` (an instruction) and `name: f32[a,b]` (a computation's parameter).
_DEFINITION = re.compile(r"%([\w.\-]+) = " + _ARRAY + r"|\b([\w.\-]+): " + _ARRAY)
_DOT = re.compile(r"= " + _ARRAY + r"\S* dot\((?:\S+ )?%([\w.\-]+), (?:\S+ )?%[\w.\-]+\)[^\n]*?"
                  r"lhs_contracting_dims=\{([\d,]*)\}")


def _dims(text: str) -> tuple[int, ...]:
  return tuple(int(d) for d in text.split(",") if d)


def dot_flops(hlo: str) -> collections.Counter:
  """{(output shape, contracted size): FLOPs} over every dot in an HLO module's text."""
  shapes = {}
  for m in _DEFINITION.finditer(hlo):
    name, dims = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
    shapes.setdefault(name, _dims(dims))
  flops = collections.Counter()
  for m in _DOT.finditer(hlo):
    out, lhs = _dims(m.group(1)), shapes[m.group(2)]
    contracted = 1
    for axis in _dims(m.group(3)):
      contracted *= lhs[axis]
    elements = 1
    for d in out:
      elements *= d
    flops[(out, contracted)] += 2 * elements * contracted
  return flops


def step_module(folder: str) -> tuple[str, collections.Counter]:
  """The optimized module of an XLA dump folder with the most matmul FLOPs, and its dot_flops."""
  paths = glob.glob(os.path.join(folder, "*after_optimizations.txt"))
  if not paths:
    raise FileNotFoundError(f"no *after_optimizations.txt in {folder} (dump with --xla_dump_hlo_as_text)")
  counted = []
  for path in paths:
    with open(path) as f:
      counted.append((path, dot_flops(f.read())))
  return max(counted, key=lambda pc: sum(pc[1].values()))


def main(argv=None) -> None:
  for path in (argv or sys.argv[1:]):
    if os.path.isdir(path):
      path, flops = step_module(path)
    else:
      with open(path) as f:
        flops = dot_flops(f.read())
    print(f"{path}: {sum(flops.values()) / 1e9:.2f} GFLOP in {len(flops)} dot shapes")
    for (out, k), n in flops.most_common(12):
      print(f"  {str(list(out)):22s} K={k:<6d} {n / 1e9:6.2f} GFLOP")


if __name__ == "__main__":
  main()
