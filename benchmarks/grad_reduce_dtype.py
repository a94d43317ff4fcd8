"""What train.grad_reduce_dtype=bfloat16 changes: the gradient's relative error after the reduction and
the loss over a short run, against float32, on an 8-device CPU mesh (data=8).

  python benchmarks/grad_reduce_dtype.py --config configs/bert.py:mini --steps 100 [--json]

Both runs start from the same parameters and see the same synthetic batches (training/benchmark.py's,
a fresh one per step) and dropout; micro-batches (--accum) make the step take the shard_map path where
the dtype applies. The relative error is ||g_bf16 - g_f32|| / ||g_f32|| of the whole reduced gradient
at the initial parameters (each device's gradient rounded to bf16, summed over the 8 devices, cast
back; XLA:CPU promotes bf16 all-reduces to f32, so the sum itself is f32 here, where a TPU sums in bf16).
"""
from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import argparse  # noqa: E402  (the device count must be set before jax is imported)
import functools  # noqa: E402
import json  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

from bert_jax.config_utils import load_config  # noqa: E402
from bert_jax.training import accumulate, partitioning  # noqa: E402
from bert_jax.training.benchmark import predictions_for, synthetic_batch  # noqa: E402
from bert_jax.training.step import build_train_setup  # noqa: E402


def _config(args, dtype):
  seq = args.seq_length
  return load_config(args.config, [f"--config.train.batch_size={args.batch_size}",
                                   f"--config.train.grad_accum_steps={args.accum}",
                                   f"--config.train.grad_reduce_dtype={dtype}", "--config.mesh.data=8",
                                   f"--config.data.max_seq_length={seq}",
                                   f"--config.data.max_predictions_per_seq={predictions_for(seq)}",
                                   "--config.optimizer.warmup_steps=10", "--config.optimizer.learning_rate=1e-3"])


def _gradient(setup, state, batch, rng, dtype):
  """The reduced gradient of one step at `state` (the step's own accumulation and reduction)."""
  objective, axis_rules = setup.objective, partitioning.rules(setup.config.mesh)
  specs = jax.tree.map(lambda s: s.spec, setup.state_shardings.params)

  def grads(params, batch, rng):
    counts = objective.counts(batch)

    def loss_fn(p, b, r):
      sums = objective.sums(p, b, r, deterministic=False)
      return objective.loss(sums, counts), sums
    return accumulate.gradients(jax.value_and_grad(loss_fn, has_aux=True), params, batch, rng, param_specs=specs,
                                num_micro=setup.config.train.grad_accum_steps, axis_rules=axis_rules,
                                reduce_dtype=dtype)[0]

  return jax.jit(partitioning.in_mesh(grads, setup.mesh, axis_rules))(state.params, batch, rng)


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--config", default="configs/bert.py:mini")
  p.add_argument("--steps", type=int, default=100)
  p.add_argument("--batch-size", type=int, default=64)
  p.add_argument("--seq-length", type=int, default=128)
  p.add_argument("--accum", type=int, default=2)
  p.add_argument("--json", action="store_true")
  args = p.parse_args()
  setups = {d: build_train_setup(_config(args, d)) for d in ("float32", "bfloat16")}
  cfg = setups["float32"].objective.config
  batches = [functools.partial(synthetic_batch, args.batch_size, args.seq_length, predictions_for(args.seq_length),
                               cfg.vocab_size, seed=i) for i in range(args.steps)]
  rng = jax.random.key(1)
  first = partitioning.global_batch(batches[0](), setups["float32"].mesh)
  init = setups["float32"].init_state(jax.random.key(0))
  g32, g16 = (jax.device_get(_gradient(setups["float32"], init, first, rng, d)) for d in ("float32", "bfloat16"))
  flat32, flat16 = (np.concatenate([np.ravel(x) for x in jax.tree.leaves(g)]) for g in (g32, g16))
  relative = float(np.linalg.norm(flat16 - flat32) / np.linalg.norm(flat32))
  losses = {}
  for dtype, setup in setups.items():
    state = setup.init_state(jax.random.key(0))
    losses[dtype] = []
    for make in batches:
      state, metrics = setup.train_step(state, partitioning.global_batch(make(), setup.mesh), rng)
      losses[dtype].append(float(metrics["loss"]))
  diff = np.abs(np.array(losses["bfloat16"]) - np.array(losses["float32"]))
  result = {"config": args.config, "steps": args.steps, "batch_size": args.batch_size, "accum": args.accum,
            "gradient_relative_error": relative, "max_abs_loss_difference": float(diff.max()),
            "final_loss": {k: v[-1] for k, v in losses.items()},
            "loss_first_last": {k: (v[0], v[-1]) for k, v in losses.items()}}
  print(json.dumps(result) if args.json else "\n".join(f"{k}: {v}" for k, v in result.items()))


if __name__ == "__main__":
  main()
