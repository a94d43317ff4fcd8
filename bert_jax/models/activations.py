"""What a layer computes and keeps of its activations: the activation functions a model config names
(model.hidden_act, ModernBERT's head_act, DeBERTa's pooler_act) and the rematerialisation policies (model.remat,
which activations the backward pass recomputes). One entry each: every family's config check and module read
these tables, so a new activation or policy is one line here."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

Array = jax.Array


def gelu(x: Array) -> Array:
  """Exact GELU as the original BERT code and PyTorch write it: 0.5 x (1 + erf(x / sqrt(2))).

  jax.nn.gelu(approximate=False) uses erfc for relative accuracy far in the negative tail, which
  XLA:CPU lowers through exp and selects; erf is cheaper (BENCHMARKS.md, "GELU with erf") and the
  values differ by less than 1e-6 absolute (tests/test_dropout.py).
  """
  return 0.5 * x * (1.0 + jax.lax.erf(x * jnp.asarray(2 ** -0.5, x.dtype)))


ACTIVATIONS = {
    "gelu": gelu,
    "gelu_tanh": functools.partial(jax.nn.gelu, approximate=True),
    "relu": jax.nn.relu,
}
NAMES = tuple(ACTIVATIONS)

REMAT_POLICIES = {
    "full": None,
    "dots": jax.checkpoint_policies.checkpoint_dots,
    "dots_no_batch": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
}
REMAT = ("none", *REMAT_POLICIES)
