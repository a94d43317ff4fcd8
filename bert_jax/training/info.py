"""`bert-jax info`: parameter counts and per-device memory of a config, computed abstractly.

The mesh is an abstract one (`jax.sharding.AbstractMesh`: axis names and sizes, no devices), so a
machine with one CPU sizes a pod's mesh: `--devices N` says how many devices to size for.
"""
from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import ml_collections

from bert_jax.errors import UserError
from bert_jax.training import partitioning
from bert_jax.training.step import TrainSetup


def count(tree: Any) -> int:
  return sum(math.prod(x.shape) for x in jax.tree.leaves(tree))


def bytes_per_device(abstract: Any, shardings: Any) -> int:
  """The largest shard each array puts on one device, summed (replicated arrays count whole)."""
  return sum(math.prod(s.shard_shape(a.shape)) * a.dtype.itemsize
             for a, s in zip(jax.tree.leaves(abstract), jax.tree.leaves(shardings)))


def sizing_mesh(mesh_cfg: ml_collections.ConfigDict, num_devices: int = 0) -> jax.sharding.AbstractMesh:
  """config.mesh over `num_devices` devices, abstractly. 0: this machine's devices when the mesh fits
  them, else the fewest it takes (a -1 axis of size 1)."""
  if num_devices < 0:
    raise UserError(f"--devices={num_devices} must be positive (0: this machine's, or the fewest the mesh takes)")
  try:
    shape = partitioning.mesh_shape(mesh_cfg, num_devices or jax.device_count())
  except UserError:
    if num_devices:
      raise
    shape = partitioning.mesh_shape(mesh_cfg, math.prod(max(int(mesh_cfg[a]), 1) for a in partitioning.MESH_AXES))
  return jax.sharding.AbstractMesh(shape, partitioning.MESH_AXES,
                                   axis_types=(jax.sharding.AxisType.Auto,) * len(shape))


def model_info(config: ml_collections.ConfigDict, setup: TrainSetup) -> dict[str, Any]:
  """num_params (the backbone as the papers count it), head params, and bytes per device of `setup`, the
  step a job builds from `config` (bert_jax/jobs.py: `Job.step`)."""
  state = setup.abstract_state
  params = nn.meta.unbox(state.params)
  backbone = count(setup.objective.backbone(params))
  total = count(params)
  return {
      "objective": config.objective,
      "num_params": backbone,
      "head_params": total - backbone,
      "total_params": total,
      "mesh": dict(setup.mesh.shape),
      "devices": setup.mesh.size,
      "platform": jax.default_backend(),
      "machine_devices": jax.device_count(),
      "param_bytes_per_device": bytes_per_device(state.params, setup.state_shardings.params),
      "optimizer_bytes_per_device": bytes_per_device(state.opt_state, setup.state_shardings.opt_state),
  }


def format_info(info: dict[str, Any]) -> str:
  mib = 2 ** 20
  mesh = " ".join(f"{k}={v}" for k, v in info["mesh"].items())
  return "\n".join([
      f"objective         {info['objective']}",
      f"num_params        {info['num_params']:,} ({info['num_params'] / 1e6:.1f}M, backbone)",
      f"head params       {info['head_params']:,}",
      f"total params      {info['total_params']:,}",
      f"mesh              {mesh}: {info['devices']} device(s) (this machine: {info['machine_devices']} "
      f"{info['platform']})",
      f"params/device     {info['param_bytes_per_device'] / mib:,.1f} MiB",
      f"optimizer/device  {info['optimizer_bytes_per_device'] / mib:,.1f} MiB",
  ])
