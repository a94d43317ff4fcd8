"""Finite checks of parameter trees: whether every floating-point leaf is finite, which ones are not,
and the one-line refusal of parameters that hold NaN or Inf (a checkpoint of a diverged run), for
every reader of parameters (params checkpoints, conversion, the train loop's divergence guard in
training/finite.py)."""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from bert_jax.errors import UserError


@jax.jit
def _tree_finite(tree: Any) -> jax.Array:
  leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)
            if jnp.issubdtype(x.dtype, jnp.inexact)]
  return jnp.all(jnp.stack(leaves)) if leaves else jnp.bool_(True)


def tree_is_finite(tree: Any) -> bool:
  """Whether every floating-point leaf of `tree` is finite (one reduction on device, one bool back)."""
  return bool(_tree_finite(tree))


def nonfinite_leaves(tree: Any) -> list[str]:
  """Names of the floating-point leaves holding NaN or Inf (one reduction when there are none)."""
  if tree_is_finite(tree):
    return []
  return [jax.tree_util.keystr(path) for path, x in jax.tree_util.tree_leaves_with_path(tree)
          if jnp.issubdtype(x.dtype, jnp.inexact) and not bool(jnp.all(jnp.isfinite(x)))]


def check_params_finite(params: Any, source: str) -> None:
  """UserError naming the parameters of `source` that hold NaN or Inf (a checkpoint of a diverged run)."""
  bad = nonfinite_leaves(params)
  if bad:
    shown = ", ".join(bad[:4]) + (f" and {len(bad) - 4} more" if len(bad) > 4 else "")
    raise UserError(f"{source}: parameters hold NaN or Inf ({shown}); the checkpoint is from a diverged "
                    "run, load an earlier step")
