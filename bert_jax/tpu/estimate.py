"""How long a compiled step should take on a TPU chip, read from the compiled (SPMD-partitioned) module.

Per op (each instruction outside fused computations, times the trip counts of the loops around it,
tpu/hlo.py: walk): FLOPs and HBM bytes from XLA's own cost analysis of that op alone (a one-op
module, hlo.op_module, through the generic HloCostAnalysis), the bytes of operands and results the
TPU compiler placed in on-chip memory (memory spaces S(1..)) left out; per collective the bytes one
device sends (hlo.py's ring model) over the chip's ICI bandwidth. A kernel's custom call moves its operands
and results across HBM once; an uninitialised allocation (custom call "AllocateBuffer") moves nothing.

The model, which is what the estimate means:
- an op takes max(FLOPs / bf16 peak, bytes / HBM bandwidth); it is compute-bound when the first term
  is the larger, memory-bound otherwise;
- collectives run asynchronously: within one iteration of a loop (a layer, a micro-batch) they
  overlap with the iteration's ops, so the iteration takes max(ops, collectives), and the excess is
  exposed communication; outside every loop (the gradient reduction after the micro-batches, the
  optimizer) nothing overlaps them;
- the step is the sum; its shares are the compute-bound ops, the memory-bound ops and the exposed
  communication.
Not modelled: MXU tile padding and low MXU occupancy of small matmuls (FLOPs count as if at peak),
vector-unit throughput of elementwise math beyond its bytes, collective latency (only bandwidth),
contention of collectives for HBM, the host and the input pipeline. So it is a floor on the step time
(a ceiling on MFU), with the HBM traffic that the old roofline ignored.
"""
from __future__ import annotations

import collections
import dataclasses
import re
from typing import Callable

from bert_jax.tpu import hlo, slices

# Instructions that move no data of their own: bookkeeping, or a loop/call whose body is walked.
_FREE = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "while", "conditional", "call",
         "after-all", "partition-id", "replica-id", "opt-barrier", "add-dependency", "async-start",
         "async-update", "async-done", "copy-done", "slice-done", "send-done", "recv-done"}
_ON_CHIP = re.compile(r"S\(([1-9])\)")
# Custom calls that move no data: "AllocateBuffer" is an uninitialised buffer, put by XLA where a loop's zeroed
# buffer has every slot overwritten before it is read (a scanned layer stack's saved activations): the loop's
# dynamic-update-slices write it and are counted there. XLA's per-op cost analysis says -1 (unknown) for it.
_NO_DATA_CALL = re.compile(r'custom_call_target="AllocateBuffer"')


@dataclasses.dataclass
class StepTime:
  """Seconds per step on one chip, split by what bounds them; totals per device and step."""
  compute_bound: float = 0.0
  memory_bound: float = 0.0
  exposed_comm: float = 0.0
  comm: float = 0.0  # all collectives' time, hidden or not
  flops: float = 0.0
  hbm_bytes: float = 0.0

  @property
  def seconds(self) -> float:
    return self.compute_bound + self.memory_bound + self.exposed_comm

  def add(self, other: StepTime, times: float = 1.0) -> None:
    for field in dataclasses.fields(self):
      setattr(self, field.name, getattr(self, field.name) + times * getattr(other, field.name))


def _cost_analysis() -> Callable[[str], dict]:
  """HLO text -> XLA's HloCostAnalysis of it (the CPU backend's: the generic per-op model). JAX offers
  cost analysis of whole executables only, where a loop body counts once; these are jaxlib's own
  bindings of the same analysis."""
  import jax  # pylint: disable=import-outside-toplevel
  from jax._src.lib import _jax  # pylint: disable=import-outside-toplevel
  from jaxlib import _hlo  # pylint: disable=import-outside-toplevel
  client = jax.devices("cpu")[0].client
  return lambda text: _jax.hlo_module_cost_analysis(client, _hlo.hlo_module_from_text(text))


def _hbm_bytes(costs: dict, operand_types: list[str], result_type: str) -> float:
  """The op's bytes accessed, less those of operands and results held in on-chip memory."""
  on_chip = [i for i, t in enumerate(operand_types) if _ON_CHIP.search(t)]
  total = costs.get("bytes accessed", 0.0)
  total -= sum(costs.get(f"bytes accessed{i}{{}}", 0.0) for i in on_chip)
  if _ON_CHIP.search(result_type):
    total -= costs.get("bytes accessedout{}", 0.0)
  return max(total, 0.0)


def step_time(hlo_text: str, chip: slices.Chip, num_devices: int) -> StepTime:
  """The model above for one device's program (`devices_per_chip` devices share a chip's peak, HBM and
  ICI bandwidth)."""
  module = hlo.parse(hlo_text)
  analyse = _cost_analysis()
  share = chip.devices_per_chip
  peak, hbm, ici = chip.peak_bf16_flops / share, chip.hbm_bytes_per_s / share, chip.ici_bytes_per_s / share
  # One iteration of each computation: its ops, its collectives (loops nested in it are their own).
  per_run: dict[str, StepTime] = collections.defaultdict(StepTime)
  runs: dict[str, tuple[float, bool]] = {}
  for computation, line, match, times, looped in hlo.walk(module):
    runs.setdefault(computation, (times, looped))
    own = per_run[computation]
    opcode = match.group(2)
    if hlo.collective_kind(opcode):
      seconds = hlo.sent_bytes(match, num_devices) / ici
      own.comm += seconds
      continue
    if opcode in _FREE or opcode.endswith("-done") or (opcode == "custom-call" and _NO_DATA_CALL.search(line)):
      continue
    text = hlo.op_module(module, computation, line)
    operand_types = re.findall(r"%p\d+ = (.*) parameter", text)
    if opcode == "custom-call":
      # A kernel (Pallas splash attention, ...): XLA's model cannot read it, so its operands and results
      # cross HBM once and its FLOPs are not counted here (tpu/aot.py adds splash's, counted from the model).
      flops = 0.0
      nbytes = sum(hlo.buffer_bytes(t) for t in operand_types + [match.group(1)] if not _ON_CHIP.search(t))
    else:
      costs = analyse(text)
      flops = costs.get("flops", 0.0)
      nbytes = _hbm_bytes(costs, operand_types, match.group(1))
    compute, memory = flops / peak, nbytes / hbm
    own.flops += flops
    own.hbm_bytes += nbytes
    if compute >= memory:
      own.compute_bound += compute
    else:
      own.memory_bound += memory
  total = StepTime()
  for computation, own in per_run.items():
    times, looped = runs[computation]
    busy = own.compute_bound + own.memory_bound
    # Collectives of a loop iteration hide behind that iteration's ops (nested loops' ops not counted:
    # a conservative choice); outside loops they are exposed.
    own.exposed_comm = max(own.comm - busy, 0.0) if looped else own.comm
    total.add(own, times)
  return total
