"""The device mesh and the mapping from logical axis names to it.

Parameters carry logical names (`embed`, `mlp`, `heads`, `layers`, ...); `config.mesh.rules` maps
them to the mesh axes `data`, `fsdp`, `tensor`. Shardings for any pytree of abstract, boxed values
come from `logical_shardings`.
"""
from __future__ import annotations

import functools
import math
import re
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import ml_collections
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from bert_jax.errors import UserError

MESH_AXES = ("data", "fsdp", "tensor")


def mesh_shape(mesh_cfg: ml_collections.ConfigDict, num_devices: int) -> tuple[int, int, int]:
  """Resolves the one -1 entry ("all remaining devices") and checks the product."""
  sizes = [int(mesh_cfg[a]) for a in MESH_AXES]
  if sizes.count(-1) > 1:
    raise UserError(f"at most one of mesh.data/fsdp/tensor may be -1, got {dict(zip(MESH_AXES, sizes))}")
  if any(s == 0 or s < -1 for s in sizes):
    raise UserError(f"mesh sizes must be positive or -1, got {dict(zip(MESH_AXES, sizes))}")
  known = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if num_devices % known:
      raise UserError(f"mesh {dict(zip(MESH_AXES, sizes))} does not fit {num_devices} devices: "
                      f"{known} does not divide {num_devices}")
    sizes[sizes.index(-1)] = num_devices // known
  if math.prod(sizes) != num_devices:
    raise UserError(f"mesh {dict(zip(MESH_AXES, sizes))} needs {math.prod(sizes)} devices but "
                    f"{num_devices} are available; set e.g. --config.mesh.data=-1")
  return tuple(sizes)


def make_mesh(mesh_cfg: ml_collections.ConfigDict, devices: Sequence[jax.Device] | None = None) -> Mesh:
  devices = list(devices if devices is not None else jax.devices())
  shape = mesh_shape(mesh_cfg, len(devices))
  # Auto axes: shardings come from jit's in/out shardings and the logical constraints.
  axis_types = (jax.sharding.AxisType.Auto,) * len(MESH_AXES)
  if len(devices) == len(jax.devices()):
    return torus_mesh(shape, devices)
  return Mesh(np.asarray(devices).reshape(shape), MESH_AXES, axis_types=axis_types)


def torus_mesh(shape: Sequence[int], devices: Sequence[jax.Device]) -> Mesh:
  """jax.make_mesh: the axes laid along the physical torus (rings for the collectives); a shape the torus cannot
  hold is one line."""
  try:
    return jax.make_mesh(tuple(shape), MESH_AXES, devices=devices, axis_types=(jax.sharding.AxisType.Auto,) * len(shape))
  except NotImplementedError as e:  # JAX's own exception for a mesh the torus cannot hold; not a stub
    physical = re.search(r"mesh \[([\d, ]+)\]", str(e))
    torus = f" ({physical.group(1).replace(', ', 'x')} torus)" if physical else ""
    raise UserError(f"mesh {dict(zip(MESH_AXES, shape))} does not lay out on these {len(devices)} devices{torus}: "
                    "each mesh axis must be a product of some of the torus's axes (e.g. data=4, fsdp=16 on 4x4x4)") from None


# What `mesh.shard_sequence` moves: the tensor axis splits the sequence instead of these weight axes.
_TENSOR_WEIGHT_AXES = ("vocab", "mlp", "heads")


def rules(mesh_cfg: ml_collections.ConfigDict) -> tuple:
  """The logical axis rules of `mesh_cfg`. With mesh.shard_sequence, the `tensor` axis splits each row's
  tokens (logical `length`: sequence sharding, for rows too long for one chip) and no longer the weights'
  wide axes, which stay whole (or split over fsdp along `embed`); splash attention then runs each device's
  queries against the whole row's keys (bert_jax/models/attention.py)."""
  pairs = tuple((name, tuple(axes) if isinstance(axes, list) else axes) for name, axes in mesh_cfg.rules)
  if not mesh_cfg.get("shard_sequence", False):
    return pairs
  moved = {name: None for name in _TENSOR_WEIGHT_AXES}
  return tuple((name, "tensor" if name == "length" else moved.get(name, axes)) for name, axes in pairs)


def in_mesh(fn: Callable, mesh: Mesh, axis_rules: Sequence) -> Callable:
  """fn traced with `mesh` and the logical axis rules in context, so the model's
  `nn.with_logical_constraint`s (activation shardings) take effect inside jit."""
  @functools.wraps(fn)
  def traced(*args, **kwargs):
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), nn.logical_axis_rules(axis_rules):
      return fn(*args, **kwargs)
  return traced


def logical_shardings(abstract_boxed: Any, mesh: Mesh, axis_rules: Sequence) -> Any:
  """NamedShardings for a pytree whose leaves may be nn.LogicallyPartitioned (unboxed structure)."""
  return nn.logical_to_mesh_sharding(nn.get_partition_spec(abstract_boxed), mesh, axis_rules)


def data_parallel_size(mesh: Mesh) -> int:
  return mesh.shape["data"] * mesh.shape["fsdp"]


def batch_sharding(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec(("data", "fsdp")))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())


def stacked_layers_tree(abstract_boxed_params: Any) -> Any:
  """bool per parameter: does its leading axis stack layers (scanned encoder)?"""
  specs = nn.get_partition_spec(abstract_boxed_params)
  return jax.tree.map(lambda s: len(s) > 0 and s[0] == "layers", specs,
                      is_leaf=lambda x: isinstance(x, PartitionSpec))


def global_batch(local: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
  """Assembles this host's rows into global arrays sharded along the batch axis."""
  sharding = batch_sharding(mesh)
  return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in local.items()}
