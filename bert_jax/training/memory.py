"""Will the train step fit in memory? An estimate from abstract shapes, made before the step compiles.

Per device: the train state (parameters and optimizer moments, as sharded), a frozen teacher's
parameters, the gradients (twice with micro-batches: the accumulator and the micro-batch's own), and
the activations the backward pass keeps from one micro-batch's forward pass. Those are the residuals
of the loss's `jax.vjp`, traced abstractly (nothing is allocated or compiled) with the step's mesh and
rules, less the residuals that are the step's own inputs (parameters, batch): whatever the family,
remat setting or dtype, what the trace keeps is what the compiled step keeps, plus XLA's workspace.
Against the compiled CPU step's memory_analysis (arguments + temporaries), the sum of these parts came
to 1.01x (`mini`, 64 rows) and 1.02x (BERT-base, 8 rows), 1.22x at the tests' tiny sizes
(BENCHMARKS.md); the x1.1 is a margin for workspace and fragmentation, which the trace does not see.

A CPU's devices share the host's memory: there the need is the sum over this process's devices plus
the process itself (Python, TensorFlow's input pipeline), against the memory the host has available
(MemAvailable, or what the cgroup still allows). A GPU or TPU: per device, against its free memory.
"""
from __future__ import annotations

import dataclasses
import math

import jax
from jax.extend import core as jax_core

from bert_jax.data_pipelines import features
from bert_jax.errors import UserError
from bert_jax.training import info, objectives, partitioning

GIB = 2 ** 30
_WORKSPACE = 1.1  # a margin for XLA's workspace beyond the residuals (module docstring)
_CPU_PROCESS_BYTES = GIB  # the Python process before its first step: jax, TensorFlow, the input pipeline
_SUGGEST = 0.8  # suggested settings leave a fifth of the capacity free (other processes, the estimate's error)


@dataclasses.dataclass(frozen=True)
class Estimate:
  """Bytes per device; the activations are those of one micro-batch of `rows` rows, split over the
  data-parallel devices, with `accum` micro-batches per step."""
  state: int
  params: int
  activations: int
  rows: int
  accum: int
  devices: int  # devices whose memory adds up against the capacity (a CPU's share one host)
  process: int  # bytes outside the devices counted against the capacity (the host process on a CPU)

  @property
  def gradients(self) -> int:
    return self.params * (2 if self.accum > 1 else 1)

  @property
  def per_device(self) -> int:
    return int(_WORKSPACE * (self.state + self.gradients + self.activations))

  @property
  def needed(self) -> int:
    return self.per_device * self.devices + self.process

  def with_batch(self, batch: int, accum: int) -> "Estimate":
    """The same run with a global batch of `batch` rows in `accum` micro-batches."""
    rows = batch // accum
    return dataclasses.replace(self, rows=rows, accum=accum, activations=self.activations * rows // self.rows)


def _nbytes(aval) -> int:
  return math.prod(aval.shape) * aval.dtype.itemsize


def residual_bytes(setup, rows: int) -> int:
  """Bytes of what the backward pass keeps from the forward pass of `rows` rows (all devices together)."""
  config, objective = setup.config, setup.objective
  batch = {k: jax.ShapeDtypeStruct(shape, dtype)
           for k, (dtype, shape) in features.feature_shapes(config.data, rows).items()}
  if setup.abstract_state.carry is not None:  # a CarryingObjective reads it as its rows' feature (XLNet's memory)
    batch[objectives.CARRY] = jax.tree.map(lambda a: jax.ShapeDtypeStruct((rows, *a.shape[1:]), a.dtype),
                                           setup.abstract_state.carry)
  params = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), setup.abstract_state.params)
  frozen = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), setup.frozen)

  def backward_of(params, batch, rng, *frozen):
    scored = objective.with_teacher(*frozen) if frozen else objective

    def loss(p):
      return scored.loss(scored.sums(p, batch, rng, deterministic=False), scored.counts(batch))
    return jax.vjp(loss, params)[1]

  traced = partitioning.in_mesh(backward_of, setup.mesh, partitioning.rules(config.mesh))
  jaxpr = jax.make_jaxpr(traced)(params, batch, jax.eval_shape(lambda: jax.random.key(0)), *frozen).jaxpr
  inputs = set(jaxpr.invars)
  return sum(_nbytes(v.aval) for v in jaxpr.outvars if isinstance(v, jax_core.Var) and v not in inputs)


def estimate(setup) -> Estimate:
  """What the train step of `setup` needs, per device (see the module docstring)."""
  train = setup.config.train
  rows = train.batch_size // train.grad_accum_steps
  dp = partitioning.data_parallel_size(setup.mesh)
  state = info.bytes_per_device(setup.abstract_state, setup.state_shardings)
  state += sum(info.bytes_per_device(f, jax.tree.map(lambda a: a.sharding, f)) for f in setup.frozen)
  params = info.bytes_per_device(setup.abstract_state.params, setup.state_shardings.params)
  on_cpu = jax.devices()[0].platform == "cpu"
  return Estimate(state=state, params=params, activations=residual_bytes(setup, rows) // dp, rows=rows,
                  accum=train.grad_accum_steps, devices=len(setup.mesh.local_devices) if on_cpu else 1,
                  process=_CPU_PROCESS_BYTES if on_cpu else 0)


def _read_int(path: str) -> int | None:
  try:
    with open(path, encoding="ascii") as f:
      text = f.read().strip()
  except OSError:
    return None
  return int(text) if text.isdigit() else None


def host_available_bytes() -> int | None:
  """Memory this host can still give a new allocation: MemAvailable, less if a cgroup limit is closer."""
  try:
    with open("/proc/meminfo", encoding="ascii") as f:
      fields = dict(line.split(":", 1) for line in f)
    available = int(fields["MemAvailable"].split()[0]) * 1024
  except (OSError, KeyError, ValueError):
    return None
  for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                 ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                  "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
    limit, usage = _read_int(limit_file), _read_int(usage_file)
    if limit is not None and usage is not None:
      available = min(available, limit - usage)
  return available


def available(device: jax.Device) -> tuple[int | None, str]:
  """(bytes free for the run, what they are), None where the platform does not say."""
  if device.platform == "cpu":
    return host_available_bytes(), "available on this host"
  stats = device.memory_stats() or {}
  if "bytes_limit" not in stats:
    return None, ""
  return stats["bytes_limit"] - stats.get("bytes_in_use", 0), f"free per {device.device_kind}"


def _fitting(est: Estimate, capacity: float, batch: int, dp: int) -> tuple[int | None, int | None]:
  """The fewest micro-batches that fit `batch`, and the largest batch (a power of two times the
  data-parallel size, no micro-batches) that fits; None where nothing does."""
  fewest = next((a for a in range(est.accum, batch // dp + 1)
                 if batch % (dp * a) == 0 and est.with_batch(batch, a).needed <= capacity), None)
  largest, candidate = None, dp
  while candidate <= batch and est.with_batch(candidate, 1).needed <= capacity:
    largest, candidate = candidate, candidate * 2
  return fewest, largest


def _surely_fits(setup, capacity: int) -> bool:
  """A loose bound, no trace: four times a generous count of what each layer keeps per row (16 hidden-wide,
  4 intermediate-wide and 4 heads x length vectors per token, in float32; BERT-base keeps ~3.5 of them),
  two networks' worth (ELECTRA), plus the state three times over, within half the capacity."""
  config = setup.config
  model, length = config.model, config.data.max_seq_length
  rows = config.train.batch_size // config.train.grad_accum_steps
  per_row = 4 * 4 * length * (16 * model.hidden_size + 4 * model.intermediate_size + 4 * model.num_heads * length)
  activations = 2 * model.num_layers * per_row * rows + 3 * 4 * rows * length * model.vocab_size
  state = info.bytes_per_device(setup.abstract_state, setup.state_shardings) * len(setup.mesh.local_devices)
  return 3 * state + activations + _CPU_PROCESS_BYTES < capacity / 2


def check_fits(setup) -> Estimate | None:
  """The estimate (None when a loose bound shows it fits: no trace needed), or UserError when the train
  step will not fit: how much it needs, how much there is, and the micro-batches (same batch, same updates
  but for dropout's draws) or batch size that would fit."""
  capacity, where = available(jax.devices()[0])
  if capacity is None or _surely_fits(setup, capacity):
    return None
  est = estimate(setup)
  if est.needed <= capacity:
    return est
  train, dp = setup.config.train, partitioning.data_parallel_size(setup.mesh)
  fewest, largest = _fitting(est, _SUGGEST * capacity, train.batch_size, dp)
  parts = (f"parameters and optimizer state {est.state / GIB:.1f}, gradients {est.gradients / GIB:.1f}, "
           f"activations of {est.rows} rows x {setup.config.data.max_seq_length} tokens {est.activations / GIB:.1f}")
  unit = f" per device x {est.devices} devices" if est.devices > 1 else (" per device" if not est.process else "")
  fixes = []
  if fewest:
    fixes.append(f"--config.train.grad_accum_steps={fewest} (the same batch of {train.batch_size} in "
                 f"micro-batches of {train.batch_size // fewest})")
  if largest:
    fixes.append(f"--config.train.batch_size={largest}")
  fixes.append("a smaller model (`bert-jax presets` lists them with their sizes)")
  raise UserError(f"the train step needs about {est.needed / GIB:.1f} GiB ({parts} GiB{unit}) and "
                  f"{capacity / GIB:.1f} GiB are {where}; what fits: {' or '.join(fixes)}")
