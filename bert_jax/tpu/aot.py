"""`bert-jax compile`: a job's train and eval steps (bert_jax/jobs.py: `Job.step`), compiled ahead of
time for a TPU slice.

libtpu compiles for a slice it only describes (`jax.experimental.topologies`), so the HBM a step
needs on each chip and the collectives it runs are known on any machine, before a TPU hour is spent.
The steps are the ones the job runs (pretraining's `build_train_setup`, general distillation's with the
student resolved from its teacher), lowered with abstract inputs carrying their shardings on the
slice's mesh; nothing is allocated.

Measured (by the TPU compiler): per-chip HBM (arguments: parameters, optimizer state, batch;
temporaries: activations and workspace), whether it fits, the collectives and the bytes they move.
Estimated from the compiled train step (tpu/estimate.py: each op's FLOPs and HBM bytes from XLA's
cost analysis, loops multiplied out, collectives over ICI overlapping with their loop iteration's
ops; splash's kernels, which the cost analysis cannot read, counted from the model: `kernel_flops`):
the step time as compute-bound, memory-bound and exposed-communication parts; MFU = model FLOPs
(counted analytically, training/benchmark.py) / (step time x chips x bf16 peak). The host and the
input are not in it, so read the step as a floor and MFU as a ceiling.
"""
from __future__ import annotations

import contextlib
import math
import re
import threading
import time
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from bert_jax.data_pipelines import features
from bert_jax.errors import UserError
from bert_jax.finetune import features as finetune_features, heads
from bert_jax.models import attention
from bert_jax.ops import int8 as int8_lib
from bert_jax.training import benchmark, info, objectives, partitioning
from bert_jax.training.step import TrainSetup
from bert_jax.tpu import estimate, hlo, slices

# XLA:TPU's out-of-memory messages: "... memory required for HLO temporaries (104.29G) exceeds
# available HBM (30.75G)" (temporaries alone), or "Used 45.12G of 30.75G hbm" (everything).
_OOM = (re.compile(r"HLO temporaries \(([\d.]+)([KMGT]?)\) exceeds available HBM \(([\d.]+)([KMGT]?)\)"),
        re.compile(r"Used ([\d.]+)([KMGT]?) of ([\d.]+)([KMGT]?) hbm"))
_UNITS = {"": 1, "K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30, "T": 2 ** 40}
# Real tokens per second that the input turns into masked rows (BENCHMARKS.md, "Input pipeline throughput"):
# one text-input worker process (`data.num_workers`; measured with worker processes), and one core of
# tf.data reading prepared rows (`data.format=bert_tfrecord`, nearly full rows).
TOKENS_PER_WORKER_SECOND = 230e3
TOKENS_PER_RECORD_CORE_SECOND = 3.1e6
# From this length on, dense attention's scores outweigh a layer's other activations (BERT-base: 12 heads x T
# scores per token against ~10 H values), so a dot step that does not fit is first told to use splash.
LONG_SEQUENCE = 1024
# Splash's kernels per forward FLOP of attention (q k^T and p v: 4 units of T x T x D a head) in a train step:
# the forward 4, dq 6 (q k^T again, dO v^T, dS k), dkv 8 (q k^T, p^T dO, dO v^T, dS^T q).
SPLASH_TRAIN_FACTOR = 18 / 4


def _slice_mesh(config: ml_collections.ConfigDict, tpu: slices.Slice, devices: list) -> jax.sharding.Mesh:
  try:
    shape = partitioning.mesh_shape(config.mesh, len(devices))
  except UserError as e:
    raise UserError(f"{tpu.name} has {len(devices)} devices: {e}") from None
  try:
    return partitioning.torus_mesh(shape, devices)
  except UserError as e:
    raise UserError(f"{tpu.name}: {e}") from None


def _check_hosts(config: ml_collections.ConfigDict, tpu: slices.Slice) -> None:
  """What the input pipeline will ask of the slice's host count (data_pipelines/pipeline.py)."""
  shards = config.data.num_shards
  for name, batch in (("batch_size", config.train.batch_size), ("eval_batch_size", config.train.eval_batch_size)):
    if batch and batch % tpu.hosts:
      raise UserError(f"train.{name}={batch} is not divisible by the {tpu.hosts} hosts of {tpu.name}")
    if batch and (shards % tpu.hosts or batch % shards):
      fix = tpu.hosts * max(1, 8 // tpu.hosts)
      raise UserError(f"data.num_shards={shards} must be a multiple of the {tpu.hosts} hosts of {tpu.name} "
                      f"and divide train.{name}={batch}; set --config.data.num_shards={fix}")


def _abstract_batch(config: ml_collections.ConfigDict, batch_size: int, mesh, objective: Any = None) -> dict:
  """The batch the input pipeline gives this config (its feature contract: span, trigram, packing
  features included) plus what the objective's feed adds on the host (`objective.feature_shapes`, e.g.
  ERNIE-THU's entities), as abstract arrays split over the batch axes."""
  sharding = partitioning.batch_sharding(mesh)
  shapes = dict(features.feature_shapes(config.data, batch_size))
  if hasattr(objective, "feature_shapes"):
    shapes.update(objective.feature_shapes(batch_size, config.data.max_seq_length))
  return {name: jax.ShapeDtypeStruct(shape, dtype, sharding=sharding) for name, (dtype, shape) in shapes.items()}


def _out_of_memory(message: str, argument_bytes: float) -> dict[str, Any] | None:
  for pattern, adds_arguments in zip(_OOM, (True, False)):
    found = pattern.search(message)
    if found:
      needed = float(found.group(1)) * _UNITS[found.group(2)] + (argument_bytes if adds_arguments else 0)
      return {"oom": True, "device_bytes": needed,
              "available_bytes": float(found.group(3)) * _UNITS[found.group(4)]}
  return None


@contextlib.contextmanager
def _still_compiling(say: Callable[[str], None], what: str, every: float = 30.0):
  """Says so every `every` seconds while the block runs: XLA prints nothing while it compiles."""
  done, start = threading.Event(), time.perf_counter()

  def beat():
    while not done.wait(every):
      say(f"  still compiling the {what} ({time.perf_counter() - start:.0f} s)")

  thread = threading.Thread(target=beat, daemon=True)
  thread.start()
  try:
    yield
  finally:
    done.set()
    thread.join()


def _compile(jitted, num_devices: int, *args, say: Callable[[str], None], what: str,
             chip: slices.Chip | None = None) -> dict[str, Any]:
  """Memory per device and collectives of one step, and with `chip` its estimated time
  (tpu/estimate.py); out of memory, what the compiler reported (with the arguments' shards added where
  it counted temporaries only)."""
  start = time.perf_counter()
  try:
    with _still_compiling(say, what):
      compiled = jitted.lower(*args).compile()
  except jax.errors.JaxRuntimeError as e:
    oom = _out_of_memory(str(e), info.bytes_per_device(args, jax.tree.map(lambda a: a.sharding, args)))
    if "RESOURCE_EXHAUSTED" not in str(e) or oom is None:
      raise
    return {"compile_seconds": time.perf_counter() - start, **oom}
  seconds = time.perf_counter() - start
  memory = compiled.memory_analysis()
  text = compiled.as_text()
  return {"compile_seconds": seconds, "oom": False,
          "argument_bytes": memory.argument_size_in_bytes,
          "temp_bytes": memory.temp_size_in_bytes,
          # Outputs not aliased to donated arguments (metrics; the new state reuses the old).
          "output_bytes": memory.output_size_in_bytes - memory.alias_size_in_bytes,
          "code_bytes": memory.generated_code_size_in_bytes,
          "device_bytes": (memory.argument_size_in_bytes + memory.output_size_in_bytes
                           - memory.alias_size_in_bytes + memory.temp_size_in_bytes
                           + memory.generated_code_size_in_bytes),
          "collectives": hlo.collectives(text, num_devices),
          **({"time": estimate.step_time(text, chip, num_devices)} if chip else {})}


def _counted_model(config: ml_collections.ConfigDict, setup):
  """The model config whose FLOPs benchmark.py counts; None for objectives it does not count."""
  return setup.objective.config if config.objective == "bert" else None


def _model_flops(config: ml_collections.ConfigDict, setup) -> float | None:
  """Train FLOPs per step (benchmark.py's count); None for objectives it does not count."""
  model = _counted_model(config, setup)
  if model is None:
    return None
  return benchmark.train_flops_per_step(model, config.train.batch_size, config.data.max_seq_length,
                                        config.data.max_predictions_per_seq, heads_only=True)


def kernel_flops(config: ml_collections.ConfigDict, model_config) -> float | None:
  """The FLOPs per train step of splash's attention kernels, which XLA's cost analysis cannot see (custom
  calls; tpu/estimate.py counts only their operands' bytes): SPLASH_TRAIN_FACTOR x the forward attention
  FLOPs (training/benchmark.py: windows counted as their keys), plus one more forward where the layers are
  rematerialised. 0 with other backends; None where the model's attention is not counted."""
  if attention.configured(config.model, config.data.max_seq_length, "tpu") != "splash":
    return 0.0
  if model_config is None:
    return None
  # The pretraining objective runs BERT's last layer at the heads' positions with dot's attention.
  forward = benchmark.attention_forward_flops(model_config, config.train.batch_size, config.data.max_seq_length,
                                              last_layer=not benchmark.heads_only_applies(model_config))
  return forward * (SPLASH_TRAIN_FACTOR + (config.model.get("remat", "none") != "none"))


def _estimates(config, tpu: slices.Slice, flops: float | None, kernel: float | None,
               train: dict[str, Any]) -> dict[str, Any]:
  """tpu/estimate.py's step time and its parts, with splash's kernel FLOPs (`kernel`, per step) added as
  compute-bound time at the chip's peak; MFU where the model's FLOPs are counted; None where the train
  step did not compile."""
  if train["oom"]:
    return {"estimated_step_seconds": None, "estimated_mfu": None, "estimated_comm_seconds": None,
            "estimate": None, "model_flops_per_step": flops, "input_workers_per_host": None}
  timed: estimate.StepTime = train["time"]
  kernel_seconds = (kernel or 0.0) / (tpu.chips * tpu.chip.peak_bf16_flops)
  step, compute = timed.seconds + kernel_seconds, timed.compute_bound + kernel_seconds
  per_chip = tpu.chip.devices_per_chip
  return {"estimated_step_seconds": step,
          "estimated_mfu": None if flops is None else flops / (step * tpu.chips * tpu.chip.peak_bf16_flops),
          "estimated_comm_seconds": timed.comm,
          "estimate": {"compute_bound_seconds": compute, "memory_bound_seconds": timed.memory_bound,
                       "exposed_comm_seconds": timed.exposed_comm,
                       "compute_bound_share": compute / step, "memory_bound_share": timed.memory_bound / step,
                       "comm_bound_share": timed.exposed_comm / step,
                       "hlo_flops_per_chip": timed.flops * per_chip, "hbm_bytes_per_chip": timed.hbm_bytes * per_chip,
                       "kernel_flops_per_chip": None if kernel is None else kernel / tpu.chips,
                       "kernel_seconds": kernel_seconds},
          "model_flops_per_step": flops, **input_need(config, tpu, step)}


def input_need(config: ml_collections.ConfigDict, tpu: slices.Slice, step_seconds: float) -> dict[str, Any]:
  """What one host's input must deliver at `step_seconds` a step (rows of real corpora are nearly full,
  so every position counts as a real token), and what that asks of the host.

  Text input builds rows in `data.num_workers` processes (`input_workers_per_host`), each a core, and a
  host runs at most one per shard it reads (data.num_shards / hosts): `input_num_shards` is the fewest
  shards that allow enough workers (a multiple of the hosts that divides the batch), None when the
  configured ones do. When no shard count does (one row per shard is the most), the run is input-bound:
  `input_steps_per_second` is what a worker per row feeds.
  Prepared rows (data.format=bert_tfrecord) are read by tf.data on the host's cores
  (`input_cores_per_host`), with no worker processes.
  """
  batch, tokens_per_step = config.train.batch_size, config.train.batch_size * config.data.max_seq_length
  tokens = tokens_per_step / step_seconds / tpu.hosts
  need = {"input_tokens_per_host_second": tokens, "input_num_shards": None, "input_steps_per_second": None,
          "input_cores_per_host": math.ceil(tokens / TOKENS_PER_RECORD_CORE_SECOND)}
  if config.data.format == "bert_tfrecord":
    return {**need, "input_workers_per_host": 0, "input_workers_needed": 0}
  needed = math.ceil(tokens / TOKENS_PER_WORKER_SECOND)
  workers = min(needed, max(1, config.data.num_shards // tpu.hosts))
  if workers < needed:
    shards = next((s for s in range(needed * tpu.hosts, batch + 1, tpu.hosts) if batch % s == 0), None)
    workers, need["input_num_shards"] = (needed, shards) if shards else (batch // tpu.hosts, batch)
    if shards is None:
      need["input_steps_per_second"] = workers * TOKENS_PER_WORKER_SECOND * tpu.hosts / tokens_per_step
  return {**need, "input_workers_per_host": workers, "input_workers_needed": needed}


def _input_line(r: dict[str, Any]) -> str:
  need = f"each host needs {r['input_tokens_per_host_second'] / 1e6:.2g}M tokens/s at that step rate"
  records = (f"prepared rows (data.format=bert_tfrecord) take {r['input_cores_per_host']} core(s) of tf.data "
             f"(~3.1M tokens/s per core)")
  if r["input_workers_needed"] == 0:
    return f"input             {need}: {records}"
  shards = f"--config.data.num_shards={r['input_num_shards']} " if r["input_num_shards"] else ""
  setting = (f"{shards}--config.data.num_workers={r['input_workers_per_host']} (text input, ~0.23M tokens/s per "
             f"process{', one process per shard a host reads' if shards else ''})")
  if r["input_steps_per_second"] is None:
    return f"input             {need}: {setting}"
  return (f"input             INPUT-BOUND: {need}, {r['input_workers_needed']} text-input processes' worth; one per "
          f"row of the batch is the most: {setting} feed ~{r['input_steps_per_second']:,.0f} steps/s; {records}")


def suggest_fix(config: ml_collections.ConfigDict, state_bytes: float, capacity: float, used: float) -> str:
  """One concrete change for a step that does not fit: shard the state, remat, or micro-batches."""
  mesh, model, train = config.mesh, config.model, config.train
  if model.get("attention", "dot") == "dot" and config.data.max_seq_length >= LONG_SEQUENCE:  # XLNet: dot only
    return ("attention's T x T scores dominate at this length: --config.model.attention=splash (the blockwise TPU "
            "kernel, memory linear in the length)")
  if state_bytes > 0.5 * capacity and mesh.fsdp == 1:
    return "shard parameters and optimizer state over the slice: --config.mesh.fsdp=-1 --config.mesh.data=1"
  if model.remat == "none":
    return "recompute activations in the backward pass: --config.model.remat=full"
  activations = max(used - state_bytes, 1.0)
  factor = 2 ** math.ceil(math.log2(max(2.0, activations / max(capacity - state_bytes, 1.0))))
  return (f"split each step into micro-batches: --config.train.grad_accum_steps="
          f"{train.grad_accum_steps * factor} (train.batch_size must stay divisible by data x fsdp x that)")


def _batch_words(batch: int, dp: int, config: ml_collections.ConfigDict, accum: int = 1) -> str:
  micro = f" in {accum} micro-batches of {batch // accum}" if accum > 1 else ""
  return (f"batch {batch}{micro} ({batch // dp // accum} rows per device at a time), sequence length "
          f"{config.data.max_seq_length}, {config.data.max_predictions_per_seq} predictions per row")


def compile_for_slice(config: ml_collections.ConfigDict, topology: str,
                      build: Callable[[ml_collections.ConfigDict, jax.sharding.Mesh], tuple[Any, TrainSetup]],
                      say: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
  """Compiles the train and eval steps for `topology` (a Cloud TPU name) and reports what fits.
  build(config, mesh) -> (the config the step is built from, its TrainSetup): the job's step
  (bert_jax/jobs.py: `Job.step`); `say` gets a line as each compile starts and ends (a step compiles for
  a minute or more)."""
  tpu = slices.parse(topology)
  attention.check(config.model, config.data.max_seq_length, platform="tpu")
  devices = slices.compile_only_devices(tpu)
  mesh = _slice_mesh(config, tpu, devices)
  config, setup = build(config, mesh)
  _check_hosts(config, tpu)
  state = setup.abstract_state  # shapes with their shardings on the slice's mesh
  rng = jax.eval_shape(lambda: jax.random.key(0))
  rng = jax.ShapeDtypeStruct(rng.shape, rng.dtype, sharding=partitioning.replicated(mesh))
  dp = partitioning.data_parallel_size(mesh)
  say(f"compiling the train step for {tpu.name} ({mesh.size} devices, mesh "
      f"{' '.join(f'{k}={v}' for k, v in mesh.shape.items())}): "
      f"{_batch_words(config.train.batch_size, dp, config, config.train.grad_accum_steps)}")
  train = _compile(setup.train_step, mesh.size, state, _abstract_batch(config, config.train.batch_size, mesh, setup.objective), rng,
                   *setup.frozen, say=say, what="train step", chip=tpu.chip)
  eval_batch = config.train.eval_batch_size or config.train.batch_size
  per_chip, capacity = tpu.chip.devices_per_chip, tpu.chip.hbm_bytes
  say(f"{compiled_line('train step', train, per_chip, capacity)}; compiling the eval step: "
      f"{_batch_words(eval_batch, dp, config)}")
  eval_inputs = _abstract_batch(config, eval_batch, mesh, setup.objective)
  if state.carry is not None:  # a CarryingObjective's evaluation carries its state in the batch (XLNet's memory)
    eval_inputs[objectives.CARRY] = jax.tree.map(
        lambda a: jax.ShapeDtypeStruct((eval_batch, *a.shape[1:]), a.dtype, sharding=partitioning.batch_sharding(mesh)),
        state.carry)
  evaluation = _compile(setup.eval_step, mesh.size, state.params, eval_inputs, say=say, what="eval step")
  say(compiled_line("eval step", evaluation, per_chip, capacity))
  used = max(train["device_bytes"], evaluation["device_bytes"]) * per_chip
  fits = not train["oom"] and not evaluation["oom"] and used <= capacity
  state_bytes = info.bytes_per_device(setup.abstract_state, setup.state_shardings) * per_chip
  train_fits = not train["oom"] and train["device_bytes"] * per_chip <= capacity
  fix = None
  if not fits:  # the eval step has no micro-batches: smaller eval batches are its fix
    fix = (suggest_fix(config, state_bytes, capacity, used) if not train_fits else
           f"evaluate in smaller batches: --config.train.eval_batch_size="
           f"{config.train.batch_size // config.train.grad_accum_steps}")
  return {
      "topology": tpu.name, "libtpu_topology": tpu.topology_name, "device_kind": devices[0].device_kind,
      "chips": tpu.chips, "hosts": tpu.hosts, "devices": len(devices), "mesh": dict(mesh.shape),
      "batch_size": config.train.batch_size, "grad_accum_steps": config.train.grad_accum_steps,
      "eval_batch_size": eval_batch, "seq_length": config.data.max_seq_length,
      "attention": attention.configured(config.model, config.data.max_seq_length, "tpu"),
      "attention_setting": config.model.get("attention", "dot"),
      "fits": fits, "hbm_per_chip_bytes": int(used), "hbm_capacity_bytes": capacity,
      "state_bytes_per_chip": int(state_bytes),
      "compile_seconds": train["compile_seconds"] + evaluation["compile_seconds"],
      "train_step": _per_chip(train, per_chip), "eval_step": _per_chip(evaluation, per_chip),
      "collectives": train.get("collectives", []),
      **_estimates(config, tpu, _model_flops(config, setup), kernel_flops(config, _counted_model(config, setup)),
                   train),
      "fix": fix,
  }


def compiled_line(what: str, step: dict[str, Any], per_chip: int, capacity: float) -> str:
  """How the compile of one step (`_compile`'s result) ended: compiled, or that it does not fit (the
  compiler ran out of memory, or what it compiled needs more HBM than a chip has)."""
  seconds, needed = step["compile_seconds"], _gib(step["device_bytes"] * per_chip)
  if step["oom"]:
    return (f"the {what} does not fit: the compiler ran out of memory after {seconds:.1f} s (it needs {needed} "
            f"per chip, {_gib(step['available_bytes'] * per_chip)} available)")
  if step["device_bytes"] * per_chip > capacity:
    return f"compiled the {what} in {seconds:.1f} s: it does not fit (it needs {needed} per chip of {_gib(capacity)})"
  return f"compiled the {what} in {seconds:.1f} s"


def _per_chip(step: dict[str, Any], per_chip: int) -> dict[str, Any]:
  return {k: (v * per_chip if k.endswith("_bytes") else v) for k, v in step.items()
          if k not in ("collectives", "time")}


def _gib(n: float) -> str:
  return f"{n / 2 ** 30:.2f} GiB"


def _step_line(name: str, step: dict[str, Any], arguments: str) -> str:
  if step["oom"]:
    return (f"  {name:<16}out of memory: needs {_gib(step['device_bytes'])} per chip, the compiler has "
            f"{_gib(step['available_bytes'])}")
  return (f"  {name:<16}arguments {_gib(step['argument_bytes'])} ({arguments}), "
          f"temporaries {_gib(step['temp_bytes'])} (activations), outputs {_gib(step['output_bytes'])}, "
          f"code {_gib(step['code_bytes'])}")


def _compile_time(step: dict[str, Any]) -> str:
  return f"{step['compile_seconds']:.1f} s" + (": out of memory, not compiled" if step["oom"] else "")


def format_report(r: dict[str, Any]) -> str:
  mesh = " ".join(f"{k}={v}" for k, v in r["mesh"].items())
  collectives = ", ".join(f"{c['kind']} x{c['count']} {c['bytes'] / 1e9:.3f} GB" for c in r["collectives"])
  lines = [
      f"slice             {r['topology']} ({r['libtpu_topology']}): {r['chips']} chips ({r['device_kind']}), "
      f"{r['hosts']} host(s), {r['devices']} devices",
      f"mesh              {mesh}",
      f"batch             train {r['batch_size']}" + (f" in {r['grad_accum_steps']} micro-batches"
                                                       if r["grad_accum_steps"] > 1 else "")
      + f", eval {r['eval_batch_size']}; sequence length {r['seq_length']}; attention {r['attention']}"
      + ("" if r.get("attention_setting", r["attention"]) == r["attention"] else
         f" (model.attention={r['attention_setting']!r})"),
      f"HBM per chip      {_gib(r['hbm_per_chip_bytes'])} of {_gib(r['hbm_capacity_bytes'])}: "
      f"{'fits' if r['fits'] else 'DOES NOT FIT'}",
      _step_line("train step", r["train_step"], "params, optimizer state, batch"),
      _step_line("eval step", r["eval_step"], "params, batch"),
      f"compile           {r['compile_seconds']:.1f} s (train {_compile_time(r['train_step'])}, "
      f"eval {_compile_time(r['eval_step'])})",
      f"collectives/step  {collectives or 'none'} (bytes each device sends)" if not r["train_step"]["oom"] else
      "collectives/step  not known: the train step did not compile",
  ]
  if r["estimated_step_seconds"] is not None:
    e, ms = r["estimate"], lambda seconds: f"{seconds * 1e3:.1f} ms"  # noqa: E731
    mfu = "" if r["estimated_mfu"] is None else f"; MFU {r['estimated_mfu']:.1%}"
    lines.append(f"ESTIMATES         step {ms(r['estimated_step_seconds'])}{mfu} (a floor on the step time, not a "
                 f"measurement): compute-bound ops {ms(e['compute_bound_seconds'])} ({e['compute_bound_share']:.0%}), "
                 f"memory-bound ops {ms(e['memory_bound_seconds'])} ({e['memory_bound_share']:.0%}), exposed "
                 f"communication {ms(e['exposed_comm_seconds'])} ({e['comm_bound_share']:.0%}; "
                 f"{ms(r['estimated_comm_seconds'])} of collectives in all)")
    lines.append(f"per chip          {e['hlo_flops_per_chip'] / 1e12:.1f} TFLOP (compiled, remat included), "
                 f"{e['hbm_bytes_per_chip'] / 1e9:.1f} GB of HBM traffic per step")
    if r["attention"] == "splash":
      kernel = e.get("kernel_flops_per_chip")
      lines.append("attention kernels " + (
          "not counted: splash's FLOPs are not in XLA's cost analysis, and this objective's model is not counted"
          if kernel is None else
          f"{kernel / 1e12:.1f} TFLOP per chip, {ms(e['kernel_seconds'])} at peak, counted from the model (splash's "
          "FLOPs are not in XLA's cost analysis) and included above"))
    lines.append(_input_line(r))
  return "\n".join(lines)


def compile_forward(model_config, kind: str, num_labels: int, topology: str, batch: int, seq: int,
                    int8: bool = False) -> dict[str, Any]:
  """The fine-tuned model's forward (what `predict` runs; with int8, `quantize`'s int8 model) compiled
  for one chip of `topology`.

  Returns the compile seconds, the element types of every matmul in the compiled program
  (hlo.matmul_types: "s32 <- s8 x s8" is an int8 one) and the forward's FLOPs per call, counted
  analytically (`training/benchmark.py`; the compiler's cost analysis counts a scanned layer once)."""
  tpu = slices.parse(topology)
  device = slices.compile_only_devices(tpu)[0]
  one = jax.sharding.SingleDeviceSharding(device)
  model = heads.FinetuneModel(model_config, kind, num_labels, "pooled", 0.0)
  if int8:
    model = int8_lib.int8_model(model)
  dummy = jnp.zeros((1, seq), jnp.int32)
  params = nn.meta.unbox(jax.eval_shape(lambda: model.init(jax.random.key(0), dummy, dummy + 1, dummy)["params"]))
  params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=one), params)
  inputs = [jax.ShapeDtypeStruct((batch, seq), jnp.int32, sharding=one)] * len(finetune_features.MODEL_INPUTS)
  start = time.perf_counter()
  compiled = jax.jit(lambda p, *x: model.apply({"params": p}, *x)).lower(params, *inputs).compile()
  seconds = time.perf_counter() - start
  encoder = model_config.replace(mlm_head=False, sentence_head="none")
  return {"topology": tpu.name, "device_kind": device.device_kind, "compile_seconds": seconds,
          "flops": benchmark.train_flops_per_step(encoder, batch, seq, 0) / 3 + batch * 2 * model_config.hidden_size
          * num_labels, "matmuls": dict(hlo.matmul_types(compiled.as_text()))}
