"""`bert-jax info`: parameter counts and per-device memory of a config, computed abstractly."""
from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import ml_collections

from bert_jax.training.step import TrainSetup


def count(tree: Any) -> int:
  return sum(math.prod(x.shape) for x in jax.tree.leaves(tree))


def bytes_per_device(abstract: Any, shardings: Any) -> int:
  """The largest shard each array puts on one device, summed (replicated arrays count whole)."""
  return sum(math.prod(s.shard_shape(a.shape)) * a.dtype.itemsize
             for a, s in zip(jax.tree.leaves(abstract), jax.tree.leaves(shardings)))


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
      "devices": jax.device_count(),
      "platform": jax.default_backend(),
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
      f"mesh              {mesh} on {info['devices']} {info['platform']} device(s)",
      f"params/device     {info['param_bytes_per_device'] / mib:,.1f} MiB",
      f"optimizer/device  {info['optimizer_bytes_per_device'] / mib:,.1f} MiB",
  ])
