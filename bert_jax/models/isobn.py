"""Normalising the [CLS] vector a sequence head reads: IsoBN (Zhou, Lin and Ren, "IsoBN: Fine-Tuning BERT with
Isotropic Batch Normalization", AAAI 2021, arXiv:2005.02178), `head.cls_norm=isobn`.

The lectures cite Zhou, Du and Ren (2019), "Improving BERT Fine-tuning with Embedding Normalization"
(arXiv:1911.03918): the pre-trained [CLS] vector's values concentrate on a few dimensions and are not
zero-centred, and normalising it helps fine-tuning. That paper was withdrawn (arXiv v2, 25 Feb 2020, no
PDF), so its exact formulation cannot be read; IsoBN is its authors' published method for the same
observation, and is what this implements.

IsoBN keeps running estimates (momentum m = 0.05) of the covariance C and standard deviations s of the
vectors h (over the batch). Each dimension j is scaled by

    scale_j = (gamma_j * s_j + eps) ** -beta,  gamma_j = mean_k clip(C_jk / (s_j s_k), -1, 1) ** 2

(beta = 0.5, eps = 1e-3): dimensions with a large spread, and those correlated with many others, shrink.
The scales are then multiplied by one factor so that the total variance sum_j C_jj scale_j^2 stays
sum_j C_jj. The output is h * scale, with no gradient through the scale. In training the estimates
first take the batch in (C <- C + m (C_batch - C), likewise s); evaluation and prediction read them as
they are. Before any training step they are zero, and the normalised vector is zero.

The estimates are parameters (head/cls_norm/running_cov, running_std) that the optimizer does not train:
the head returns `state_loss`, a term of value zero whose gradient with respect to each estimate is
(estimate - its new value), and the optimizer gives those leaves the update -gradient (finetune/optim.py:
STATE_PARAMS), so after the step they hold the new values. They are saved with the parameters, so
predict reads them.
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

MOMENTUM, EPS, BETA = 0.05, 1e-3, 0.5
STATE_PARAMS = ("running_cov", "running_std")  # leaf names the optimizer assigns instead of training


def scale(cov: jax.Array, std: jax.Array) -> jax.Array:
  """IsoBN's per-dimension scale for the estimates (cov [H, H], std [H])."""
  outer = std[:, None] * std[None, :]
  corr = jnp.clip(jnp.where(outer > 0, cov / jnp.where(outer > 0, outer, 1.0), 0.0), -1.0, 1.0)
  gamma = jnp.mean(corr ** 2, axis=1)
  s = (gamma * std + EPS) ** -BETA
  diagonal = jnp.diagonal(cov)
  return s * jnp.sqrt(jnp.sum(diagonal) / (jnp.sum(diagonal * s ** 2) + EPS))


def updated(cov: jax.Array, std: jax.Array, h: jax.Array) -> tuple[jax.Array, jax.Array]:
  """The estimates after taking in the batch h [B, H]."""
  y = h - jnp.mean(h, axis=0)
  batch_std = jnp.sqrt(jnp.mean(y ** 2, axis=0))
  batch_cov = y.T @ y / h.shape[0]
  return cov + MOMENTUM * (batch_cov - cov), std + MOMENTUM * (batch_std - std)


class IsoBN(nn.Module):
  """h [B, H] -> (h * scale, state_loss): state_loss (None when deterministic) is the zero-valued term whose
  gradient moves the estimates to their new values (see the module docstring)."""

  @nn.compact
  def __call__(self, h: jax.Array, deterministic: bool) -> tuple[jax.Array, jax.Array | None]:
    width = h.shape[-1]
    zeros = nn.with_logical_partitioning(nn.initializers.zeros, (None, None))
    cov = self.param("running_cov", zeros, (width, width), jnp.float32)
    std = self.param("running_std", nn.with_logical_partitioning(nn.initializers.zeros, (None,)), (width,),
                     jnp.float32)
    if deterministic:
      return h * jax.lax.stop_gradient(scale(cov, std)).astype(h.dtype), None
    new_cov, new_std = jax.tree.map(jax.lax.stop_gradient, updated(cov, std, jax.lax.stop_gradient(h.astype(jnp.float32))))
    state_loss = (jnp.sum(jax.lax.stop_gradient(cov - new_cov) * (cov - jax.lax.stop_gradient(cov)))
                  + jnp.sum(jax.lax.stop_gradient(std - new_std) * (std - jax.lax.stop_gradient(std))))
    return h * jax.lax.stop_gradient(scale(new_cov, new_std)).astype(h.dtype), state_loss
