"""The collectives of a compiled (SPMD-partitioned) HLO module, counted per execution of the module.

A collective inside a loop body runs once per iteration: the scanned encoder layers, micro-batches
and XLA's windowed (collective-matmul) loops all show up as `while` ops, so counts are multiplied
along the call graph from the entry computation by each loop's trip count, read from its condition
(`i < N`; JAX's loops count up from 0).

`bytes` is what one device sends per step with ring algorithms over a group of n devices:
all-reduce 2(n-1)/n x buffer, all-gather and all-to-all (n-1)/n x the (gathered) buffer,
reduce-scatter (n-1) x the scattered output, collective-permute the buffer.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import math
import re

_DTYPE_BYTES = {"pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
                "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}
KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_INSTRUCTION = re.compile(r"^\s+(?:ROOT )?%\S+ = (.*?) ([a-z][a-z0-9-]*)\((.*)$")
_METADATA = re.compile(r", metadata=\{[^}]*\}")
_ARRAY = re.compile(r"\b([a-z]+\d*[a-z0-9]*)\[([\d,]*)\]")


def _array_bytes(type_text: str) -> list[float]:
  """Bytes of each array in a (possibly tuple) HLO type, in order."""
  return [_DTYPE_BYTES[dtype] * math.prod(int(d) for d in dims.split(",") if d)
          for dtype, dims in _ARRAY.findall(type_text) if dtype in _DTYPE_BYTES]


def buffer_bytes(type_text: str) -> float:
  """Bytes of all the arrays in a (possibly tuple) HLO type."""
  return sum(_array_bytes(type_text))


def _group_size(attrs: str, num_devices: int) -> int:
  mesh = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", attrs)
  if mesh:
    sizes = {name: int(size) for name, size in re.findall(r"'(\w+)'=(\d+)", mesh.group(1))}
    return math.prod(sizes.get(name, 1) for name in re.findall(r"'(\w+)'", mesh.group(2)))
  explicit = re.search(r"replica_groups=\{\{([\d,]*)\}", attrs)
  if explicit:
    return len(explicit.group(1).split(","))
  iota = re.search(r"replica_groups=\[\d+,(\d+)\]<=", attrs)
  return int(iota.group(1)) if iota else num_devices


def _sent_bytes(kind: str, opcode: str, type_text: str, attrs: str, num_devices: int) -> float:
  arrays = _array_bytes(type_text)
  if opcode == "all-gather-start":  # (operands..., outputs...)
    arrays = arrays[len(arrays) // 2:]
  elif opcode == "collective-permute-start":  # (operand, output, context scalars)
    arrays = arrays[1:2]
  size, n = sum(arrays), _group_size(attrs, num_devices)
  if kind == "all-reduce":
    return 2 * (n - 1) / n * size
  if kind == "reduce-scatter":
    return (n - 1) * size
  if kind in ("all-gather", "all-to-all"):
    return (n - 1) / n * size
  return size


@dataclasses.dataclass
class Module:
  """A compiled module's text cut into computations: name -> instruction lines (source metadata
  dropped), name -> header line, and the entry computation's name."""
  bodies: dict[str, list[str]]
  headers: dict[str, str]
  entry: str

  @functools.cached_property
  def types(self) -> dict[str, dict[str, str]]:
    """computation -> instruction name -> its HLO type text."""
    return {c: {m.group(1): m.group(2) for m in map(_DEFINED.match, lines) if m} for c, lines in self.bodies.items()}


def parse(hlo_text: str) -> Module:
  bodies, headers, entry, current = {}, {}, "", None
  for line in hlo_text.splitlines():
    header = re.match(r"^(ENTRY )?%(\S+) ", line)
    if header and line.rstrip().endswith("{"):
      current = header.group(2)
      bodies[current], headers[current] = [], line
      entry = current if header.group(1) else entry
    elif line.rstrip() == "}":
      current = None
    elif current is not None and bodies[current] and not line.startswith(" "):
      # A string of the last instruction's backend config spans lines (Pallas kernels' xprof_metadata: one
      # of its lines starts with "}}", which once ended the computation there and lost the rest of the step).
      bodies[current][-1] = _METADATA.sub("", bodies[current][-1] + "\\n" + line)
    elif current is not None:
      bodies[current].append(_METADATA.sub("", line))
  return Module(bodies, headers, entry)


def _trip_count(condition: str, bodies: dict[str, list[str]]) -> int:
  """N of a loop condition `i < N` (XLA:CPU wraps the compare in a fusion: its callee is read too)."""
  lines = list(bodies.get(condition, ()))
  lines += [line for callee in re.findall(r"calls=%([^\s,]+)", "\n".join(lines)) for line in bodies.get(callee, ())]
  constants = [int(v) for line in lines for v in re.findall(r"\bconstant\((\d+)\)", line)]
  compares_lt = any("direction=LT" in line for line in lines)
  return constants[0] if compares_lt and len(constants) == 1 else 1


def walk(module: Module):
  """(computation, instruction line, match, times per execution, inside a loop) for every instruction
  the module runs outside fused computations, loops expanded by their trip counts: a while's body (and
  condition) runs `trip count` times per run of the computation holding it; a call's and a
  conditional's callees once (every branch counted)."""
  bodies = module.bodies

  def visit(name: str, times: int, looped: bool):
    for line in bodies.get(name, ()):
      match = _INSTRUCTION.match(line)
      if not match:
        continue
      yield name, line, match, times, looped
      opcode, attrs = match.group(2), match.group(3)
      if opcode == "while":
        body = re.search(r"body=%([^\s,]+)", attrs).group(1)
        condition = re.search(r"condition=%([^\s,]+)", attrs).group(1)
        trips = _trip_count(condition, bodies)
        yield from visit(body, times * trips, True)
      elif opcode in ("call", "conditional", "async-start"):  # async-start: the op it wraps
        for callee in _called([line]):
          yield from visit(callee, times, looped)

  yield from visit(module.entry, 1, False)


def collective_kind(opcode: str) -> str | None:
  kind = opcode.removesuffix("-start")
  return kind if kind in KINDS else None


def sent_bytes(line_match, num_devices: int) -> float:
  """What one device sends for a collective instruction (the ring model above)."""
  type_text, opcode, attrs = line_match.groups()
  return _sent_bytes(collective_kind(opcode), opcode, type_text, attrs, num_devices)


def collectives(hlo_text: str, num_devices: int) -> list[dict]:
  """[{kind, count, bytes}] per execution of the module, one entry per collective kind present."""
  totals = collections.defaultdict(lambda: [0, 0.0])
  for _, _, match, times, _ in walk(parse(hlo_text)):
    kind = collective_kind(match.group(2))
    if kind:
      totals[kind][0] += times
      totals[kind][1] += times * sent_bytes(match, num_devices)
  return [{"kind": kind, "count": count, "bytes": int(sent)}
          for kind, (count, sent) in sorted(totals.items(), key=lambda kv: KINDS.index(kv[0]))]


_CALLS = re.compile(r"\b(?:calls|to_apply|called_computations|branch_computations|body|condition|"
                    r"true_computation|false_computation)=(\{[^}]*\}|%[^\s,]+)")


def _called(lines: list[str]) -> list[str]:
  return [name for line in lines for group in _CALLS.findall(line) for name in re.findall(r"%([^\s,{}]+)", group)]


def op_module(module: Module, computation: str, line: str) -> str:
  """A module of one instruction of `computation`: its operands become the entry's parameters, and the
  computations it calls (a fusion's, a reducer) come along, so that XLA's cost analysis can read it."""
  bodies, headers = module.bodies, module.headers
  types = module.types[computation]
  name, type_text, opcode, rest = _DEFINED_FULL.match(line).groups()
  depth, end = 1, 0
  for end, char in enumerate(rest):  # the operand list closes at the matching parenthesis
    depth += {"(": 1, ")": -1}.get(char, 0)
    if depth == 0:
      break
  operands, attrs = re.findall(r"%([^\s,()]+)", rest[:end]), rest[end + 1:]
  needed, queue = [], _called([line])
  while queue:
    callee = queue.pop()
    if callee not in needed and callee in bodies:
      needed.append(callee)
      queue.extend(_called(bodies[callee]))
  order = list(bodies)
  callees = ["\n".join([headers[c], *bodies[c], "}"]) for c in sorted(needed, key=order.index)]
  params = [f"  %p{i} = {types[o]} parameter({i})" for i, o in enumerate(operands)]
  root = f"  ROOT %{name} = {type_text} {opcode}({', '.join(f'%p{i}' for i in range(len(operands)))}){attrs}"
  return "\n\n".join(["HloModule op", *callees, "\n".join(["ENTRY %op {", *params, root, "}"])])


_NAMED = re.compile(r"^\s+(?:ROOT )?%(\S+) = \(?([a-z][a-z0-9]*)\[")
_DEFINED = re.compile(r"^\s+(?:ROOT )?%(\S+) = (.*?) [a-z][a-z0-9-]*\(")
_DEFINED_FULL = re.compile(r"^\s+(?:ROOT )?%(\S+) = (.*?) ([a-z][a-z0-9-]*)\((.*)$")


def matmul_types(hlo_text: str) -> collections.Counter:
  """The element types of every dot and convolution instruction in the module, as "out <- lhs x rhs"
  ("s32 <- s8 x s8": an int8 matmul), each instruction counted once (a loop body's once, not per
  iteration). Operand types come from the instructions that define them, in any computation."""
  types = {m.group(1): m.group(2) for m in map(_NAMED.match, hlo_text.splitlines()) if m}
  found = collections.Counter()
  for line in hlo_text.splitlines():
    match = _INSTRUCTION.match(line)
    if match and match.group(2) in ("dot", "convolution"):
      out = _ARRAY.search(match.group(1)).group(1)
      lhs, rhs = re.findall(r"%([^\s,)]+)", match.group(3))[:2]
      found[f"{out} <- {types.get(lhs, '?')} x {types.get(rhs, '?')}"] += 1
  return found
