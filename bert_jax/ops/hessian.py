"""The top Hessian eigenvalue of a loss by power iteration on Hessian-vector products (Q-BERT's
sensitivity, compress/qbert.py).

A Hessian-vector product is forward-over-reverse: `jax.jvp` of `jax.grad`, one gradient's cost and
memory, without ever forming the Hessian. Power iteration v <- Hv / |Hv| converges to the eigenvector
of the eigenvalue largest in magnitude (at the rate |lambda_2 / lambda_1|); the Rayleigh quotient
v.Hv is the estimate, and it stops once that moves by less than `tol` (relative) between iterations.
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp


def hvp(loss: Callable[[Any], jax.Array], x: Any, v: Any) -> Any:
  """H(x) v for the scalar `loss` at the pytree x, v a pytree like x."""
  return jax.jvp(jax.grad(loss), (x,), (v,))[1]


def _dot(a: Any, b: Any) -> jax.Array:
  return sum(jnp.vdot(p, q) for p, q in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def _normalized(v: Any) -> Any:
  norm = jnp.sqrt(_dot(v, v))
  return jax.tree.map(lambda x: x / norm, v)


@jax.jit
def _rayleigh_and_next(v: Any, hv: Any) -> tuple[jax.Array, Any]:
  return _dot(v, hv), _normalized(hv)


def top_eigenvalue(product: Callable[[Any], Any], like: Any, rng: jax.Array, iterations: int = 100,
                   tol: float = 1e-4) -> tuple[float, int]:
  """(the eigenvalue of largest magnitude of the symmetric operator `product`, the iterations run).

  product: v -> Hv on pytrees shaped like `like` (jit it: it is called once per iteration).
  """
  leaves, treedef = jax.tree.flatten(like)
  keys = jax.random.split(rng, len(leaves))
  v = jax.jit(_normalized)(treedef.unflatten([jax.random.normal(k, jnp.shape(x), jnp.float32)
                                     for k, x in zip(keys, leaves)]))
  estimate = None
  for step in range(1, iterations + 1):
    new, next_v = _rayleigh_and_next(v, product(v))
    new = float(new)
    if estimate is not None and abs(new - estimate) <= tol * max(abs(new), 1e-12):
      return new, step
    estimate, v = new, next_v
  return estimate, iterations
