"""GradCache's memory and time against the global batch (BENCHMARKS.md, "Sentence embeddings at large batches").

For each global batch the sbert ranking step (configs/sbert.py:mnr with a tiny encoder) is compiled with
train.grad_accum_steps=1 (one pass) and with chunks of --chunk-rows rows (GradCache), and its compiled
memory_analysis() read: peak = arguments + outputs + temporaries - donated (what XLA allocates for the
step). Steps are timed only where the peak fits --run-below-gib (compiling allocates nothing). One JSON
line per (batch, mode).

  python3 benchmarks/gradcache_memory.py --batches 256,1024,4096,16384,65536 --chunk-rows 64
  python3 benchmarks/gradcache_memory.py --preset base --batches 65536 --chunk-rows 512 --length 128 \
      --modes cached --topology v4-8   # compiled for a TPU slice here (libtpu, bert_jax/tpu/aot.py): HBM per
                                       # chip and tpu/estimate.py's step time
"""
from __future__ import annotations

import argparse
import json
import time

import jax
import numpy as np

from bert_jax.config_utils import load_config
from bert_jax.finetune import init
from bert_jax.sbert import model as model_lib, train
from bert_jax.tpu import aot, slices
from bert_jax.training import partitioning

SIZES = {"tiny": ["--config.model.num_layers=2", "--config.model.hidden_size=64", "--config.model.num_heads=2",
                  "--config.model.intermediate_size=256"],
         "base": ["--config.model.num_layers=12", "--config.model.hidden_size=768", "--config.model.num_heads=12",
                  "--config.model.intermediate_size=3072"]}


def setup_for(preset: str, batch: int, chunks: int, length: int, data: int, extra: list[str], devices=None):
  args = SIZES[preset] + [f"--config.train.batch_size={batch}", f"--config.train.grad_accum_steps={chunks}",
                          f"--config.data.max_seq_length={length}", "--config.model.max_position_embeddings=512",
                          f"--config.mesh.data={data}", "--config.train.num_steps=10", *extra]
  config = load_config("configs/sbert.py:mnr", args)
  model = model_lib.SentenceEncoder(model_lib.encoder_config(init.model_config(config, None)), train.pooling(config))
  setup, _ = train.build_setup(config, train.objective_for(config, model), 2, batch,
                               partitioning.make_mesh(config.mesh, devices or jax.devices()[:data]))
  return setup


def batch_of(rows: int, length: int, vocab: int = 1000, seed: int = 0) -> dict[str, np.ndarray]:
  rng = np.random.default_rng(seed)
  lengths = rng.integers(4, length + 1, (rows, 2))
  mask = (np.arange(length) < lengths[..., None]).astype(np.int32)
  return {"input_ids": (rng.integers(5, vocab, (rows, 2, length)) * mask).astype(np.int32), "attention_mask": mask}


def abstract_batch(setup, rows: int, length: int):
  sharding = partitioning.batch_sharding(setup.mesh)
  return {k: jax.ShapeDtypeStruct((rows, 2, length), np.int32, sharding=sharding)
          for k in ("input_ids", "attention_mask")}


def measure(preset, batch, chunks, length, data, run_below, steps, extra) -> dict:
  setup = setup_for(preset, batch, chunks, length, data, extra)
  start = time.perf_counter()
  compiled = setup.train_step.lower(setup.abstract_state, abstract_batch(setup, batch, length),
                                    jax.random.key(1)).compile()
  m = compiled.memory_analysis()
  peak = m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes
  row = {"preset": preset, "batch": batch, "grad_accum_steps": chunks, "length": length, "devices": data,
         "peak_gib": round(peak / 2 ** 30, 3), "temp_gib": round(m.temp_size_in_bytes / 2 ** 30, 3),
         "compile_s": round(time.perf_counter() - start, 1)}
  if peak / 2 ** 30 < run_below:
    state = setup.init_state(jax.random.key(0))
    global_batch = partitioning.global_batch(batch_of(batch, length), setup.mesh)
    state, metrics = compiled(state, global_batch, jax.random.key(1))
    float(metrics["loss"])
    start = time.perf_counter()
    for _ in range(steps):
      state, metrics = compiled(state, global_batch, jax.random.key(1))
    jax.block_until_ready((state, metrics))
    row.update(step_s=round((time.perf_counter() - start) / steps, 3), loss=round(float(metrics["loss"]), 4))
  return row


def on_slice(preset: str, batch: int, chunks: int, length: int, topology: str, extra: list[str]) -> dict:
  """The step compiled for a TPU slice (all its devices on the data axis), as `bert-jax compile` compiles
  a step: HBM per chip and the estimated step time (bert_jax/tpu/aot.py, tpu/estimate.py)."""
  tpu = slices.parse(topology)
  devices = slices.compile_only_devices(tpu)
  setup = setup_for(preset, batch, chunks, length, len(devices), extra, devices)
  rng = jax.eval_shape(lambda: jax.random.key(0))
  rng = jax.ShapeDtypeStruct(rng.shape, rng.dtype, sharding=partitioning.replicated(setup.mesh))
  step = aot._compile(setup.train_step, setup.mesh.size, setup.abstract_state,  # pylint: disable=protected-access
                      abstract_batch(setup, batch, length), rng, say=print, what="train step", chip=tpu.chip)
  row = {"preset": preset, "topology": topology, "batch": batch, "grad_accum_steps": chunks, "length": length,
         "hbm_capacity_gib": round(tpu.chip.hbm_bytes / 2 ** 30, 1), "compile_s": round(step["compile_seconds"], 1)}
  if step["oom"]:
    return {**row, "oom": True, "needs_gib": round(step["device_bytes"] / 2 ** 30, 2)}
  return {**row, "oom": False, "peak_gib_per_device": round(step["device_bytes"] / 2 ** 30, 2),
          "estimated_step_s": float(f"{step['time'].seconds:.3g}")}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--preset", choices=sorted(SIZES), default="tiny")
  parser.add_argument("--batches", default="256,1024,4096,16384,65536")
  parser.add_argument("--chunk-rows", type=int, default=64, help="rows per GradCache chunk (per device)")
  parser.add_argument("--length", type=int, default=32)
  parser.add_argument("--mesh-data", type=int, default=1)
  parser.add_argument("--run-below-gib", type=float, default=6.0)
  parser.add_argument("--run-up-to-batch", type=int, default=1 << 30, help="time steps only up to this batch")
  parser.add_argument("--steps", type=int, default=2)
  parser.add_argument("--modes", default="one_pass,cached")
  parser.add_argument("--compile-only", action="store_true")
  parser.add_argument("--topology", default="", help="compile for this TPU slice instead (e.g. v4-8)")
  parser.add_argument("--extra", nargs="*", default=["--config.model.hidden_dropout=0.0"])
  a = parser.parse_args()
  data = len(slices.compile_only_devices(slices.parse(a.topology))) if a.topology else a.mesh_data
  for batch in map(int, a.batches.split(",")):
    for mode in a.modes.split(","):
      chunks = 1 if mode == "one_pass" else max(batch // (data * a.chunk_rows), 1)
      if a.topology:
        print(json.dumps({"mode": mode, **on_slice(a.preset, batch, chunks, a.length, a.topology, a.extra)}),
              flush=True)
        continue
      run = not a.compile_only and batch <= a.run_up_to_batch
      row = measure(a.preset, batch, chunks, a.length, a.mesh_data, a.run_below_gib if run else -1,
                    a.steps, a.extra)
      print(json.dumps({"mode": mode, **row}), flush=True)


if __name__ == "__main__":
  main()
