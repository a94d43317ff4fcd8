"""A step's gradient over its micro-batches, reduced across devices once.

Under plain `jit` the gradient of a parameter held whole on every device, from rows split over the
devices, is all-reduced where XLA computes it: in a scan over micro-batches that is inside the loop,
the whole gradient once per micro-batch (BERT-large's 32 micro-batches on v4-32 sent 47.6 GB per chip
per step). Here the loop runs in `jax.shard_map` over the data-parallel mesh axes (`data`, `fsdp`;
`tensor` stays with XLA): each device sums the gradients of its own rows, unreduced, and after the
loop each leaf is reduced once, `psum_scatter` over the axes it is stored split over (fsdp) and `psum`
over the rest, optionally in bfloat16 (`train.grad_reduce_dtype`, as MLPerf's TPU BERT did).
fsdp's all-gathers of the parameters stay per micro-batch (the forward needs them whole); they happen
outside the differentiated function, so their transpose (a reduce-scatter) is not in the loop either.

Nothing else changes: micro-batch `a` is rows a, a + A, a + 2A, ... of the global batch on every mesh
(taken from each device's rows, which the batch sharding splits in order), each with the key
fold_in(rng, a), and dropout's counters number the rows globally (models/batch_rows.py), so the step
is the one GSPMD computed before, up to the order of float additions. A carrying objective's per-row
output (sums[CARRY], XLNet's next memory) is not summed: its micro-batches' rows are put back in order,
left split over the data axes like the batch.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from bert_jax.models import batch_rows
from bert_jax.training.objectives.base import CARRY

DATA_AXES = ("data", "fsdp")
REDUCE_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}

# (params, micro_batch, rng) -> ((loss, sums), grads), additive over rows.
GradFn = Callable[[Any, dict, jax.Array], tuple[tuple[jax.Array, dict], Any]]


def one_pass(num_micro: int, reduce_dtype: str) -> bool:
  """Does the train step compute the global batch's gradient in one pass under plain jit (no micro-batches,
  a float32 reduction), rather than through `gradients`?"""
  return num_micro == 1 and reduce_dtype == "float32"


def parts(mesh) -> int:
  """The slices of the batch `gradients` computes apart, one per device over the data axes (1: none)."""
  return math.prod(mesh.shape.get(a, 1) for a in DATA_AXES)


def _names(entry) -> tuple[str, ...]:
  return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def _keep(entry, axes: tuple[str, ...]):
  """A PartitionSpec entry (None, an axis or a tuple of axes) with only the axes in `axes`."""
  kept = tuple(n for n in _names(entry) if n in axes)
  return kept if len(kept) > 1 else (kept[0] if kept else None)


def _gather(x: jax.Array, spec: PartitionSpec) -> jax.Array:
  """The whole of a leaf stored split along `spec`'s (manual) axes."""
  for dim, entry in enumerate(spec):
    if _names(entry):
      x = jax.lax.all_gather(x, _names(entry), axis=dim, tiled=True)
  return x


def _reduce(g: jax.Array, spec: PartitionSpec, axes: tuple[str, ...], dtype) -> jax.Array:
  """Sum of every device's `g` [the leaf's whole shape], left split along `spec` like its parameter."""
  out = g.dtype
  g = g.astype(dtype)
  for dim, entry in enumerate(spec):
    if _names(entry):
      g = jax.lax.psum_scatter(g, _names(entry), scatter_dimension=dim, tiled=True)
  rest = tuple(a for a in axes if a not in {n for entry in spec for n in _names(entry)})
  return (jax.lax.psum(g, rest) if rest else g).astype(out)


def _split(batch: dict[str, jax.Array], num_micro: int) -> dict[str, jax.Array]:
  """[R, ...] -> [A, R/A, ...]: micro-batch a holds rows a, a + A, ... (strided)."""
  def split(x):
    return jnp.swapaxes(x.reshape((x.shape[0] // num_micro, num_micro) + x.shape[1:]), 0, 1)
  return {k: split(v) for k, v in batch.items()}


def _unsplit(x: jax.Array) -> jax.Array:
  """[A, R/A, ...] -> [R, ...]: `_split` undone (row j A + a from micro-batch a's row j)."""
  return jnp.swapaxes(x, 0, 1).reshape((x.shape[0] * x.shape[1],) + x.shape[2:])


def _accumulate(grad_fn: GradFn, params: Any, batch: dict, rng: jax.Array, num_micro: int,
                gather: Callable[[Any], Any]) -> tuple[Any, dict, Any]:
  """This device's summed gradients and sums over its rows' micro-batches (nothing reduced), and the rows'
  carry (sums[CARRY], not a sum: objectives.CarryingObjective) in row order, or None."""
  if num_micro == 1:
    (_, sums), grads = grad_fn(gather(params), batch, rng)
    sums = dict(sums)
    return grads, sums, sums.pop(CARRY, None)
  micro = _split(batch, num_micro)

  def body(carry, xs):
    micro_batch, index = xs
    (_, sums), grads = grad_fn(gather(params), micro_batch, jax.random.fold_in(rng, index))
    sums = dict(sums)
    rows = sums.pop(CARRY, None)
    return jax.tree.map(jnp.add, carry, (grads, sums)), rows

  first = jax.tree.map(lambda x: x[0], micro)
  shapes = jax.eval_shape(lambda: grad_fn(gather(params), first, rng))
  summed = {k: v for k, v in shapes[0][1].items() if k != CARRY}
  zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), (shapes[1], summed))
  (grads, sums), rows = jax.lax.scan(body, zeros, (micro, jnp.arange(num_micro)))
  return grads, sums, jax.tree.map(_unsplit, rows)


def gradients(grad_fn: GradFn, params: Any, batch: dict[str, jax.Array], rng: jax.Array, *,
              param_specs: Any, num_micro: int, axis_rules: tuple, reduce_dtype: str = "float32",
              trainable: Any = None) -> tuple[Any, dict]:
  """The global batch's (gradients, sums), each reduced once.

  Traced inside the step's mesh (`partitioning.in_mesh`). params: laid out by `param_specs`
  (PartitionSpecs); batch: [B, ...] split over the data axes; trainable: bools like params (None:
  all) - a frozen leaf's gradient is zero and is not sent.
  """
  mesh = jax.sharding.get_abstract_mesh()
  axes = tuple(a for a in DATA_AXES if mesh.shape.get(a, 1) > 1)  # an axis of one device has nothing to sum
  auto = tuple(a for a in mesh.axis_names if a not in axes and mesh.shape[a] > 1)
  # With no other axis to split over, the whole mesh is manual: XLA then sees plain per-device code (a
  # partly manual region pins every op's sharding, reducers included, which XLA:CPU cannot promote
  # for a bf16 all-reduce).
  manual = set(axes) if auto else set(mesh.axis_names)
  specs = jax.tree.map(lambda s: PartitionSpec(*(_keep(e, axes) for e in s)), param_specs,
                       is_leaf=lambda x: isinstance(x, PartitionSpec))
  leaf_specs = jax.tree.structure(params).flatten_up_to(specs)
  # What XLA splits inside (tensor): said again where the data axes are gathered and reduced, or it may
  # replicate the gathered weights and the accumulated gradients over tensor.
  auto_specs = [PartitionSpec(*(_keep(e, auto) for e in s))
                for s in jax.tree.structure(params).flatten_up_to(param_specs)]
  keep = jax.tree.leaves(trainable) if trainable is not None else [True] * len(leaf_specs)
  # Inside, the data axes are manual: activation constraints may name only the others.
  inner_rules = tuple((name, _keep(target, auto)) for name, target in axis_rules)
  dtype = REDUCE_DTYPES[reduce_dtype]

  def gather(p):
    whole = [jax.lax.with_sharding_constraint(_gather(x, s), a)
             for x, s, a in zip(jax.tree.leaves(p), leaf_specs, auto_specs)]
    return jax.tree.unflatten(jax.tree.structure(p), whole)

  def local(params, batch, rng):
    with batch_rows.shard(axes), nn.logical_axis_rules(inner_rules):
      grads, sums, rows = _accumulate(grad_fn, params, batch, rng, num_micro, gather)
    reduced = [_reduce(g, s, axes, dtype) if k else jnp.zeros_like(p)
               for g, p, s, k in zip(jax.tree.leaves(grads), jax.tree.leaves(params), leaf_specs, keep)]
    return (jax.tree.unflatten(jax.tree.structure(grads), reduced), (jax.lax.psum(sums, axes) if axes else sums),
            rows)

  if not axes:
    grads, sums, rows = local(params, batch, rng)
  else:
    batch_spec = PartitionSpec(axes)
    grads, sums, rows = jax.shard_map(
        local, mesh=mesh, in_specs=(specs, {k: batch_spec for k in batch}, PartitionSpec()),
        out_specs=(specs, PartitionSpec(), batch_spec), axis_names=manual, check_vma=False)(params, batch, rng)
  return grads, (sums if rows is None else {**sums, CARRY: rows})
