"""SMART (Jiang et al. 2019): smoothness-inducing adversarial regularisation and the Bregman proximal
point update with a momentum teacher, as additive sums for the fine-tuning objective.

The loss of a batch becomes  L(theta) + lambda_s R_s(theta) + mu D_Breg(theta, teacher):
  R_s     = l_s(f(x + delta; theta), f(x; theta)), delta an adversarial perturbation of the embedding
            output (the encoder's input), found by Algorithm 1's steps: delta_0 ~ N(0, sigma^2), then
            `iterations` times delta <- clip(delta + eta g / ||g||_inf, -eps, eps) with
            g = grad_delta l_s(f(x + delta), stop_gradient(f(x))) and the infinity norm per example.
  D_Breg  = l_s(f(x; theta), f(x; teacher)); the teacher follows the parameters after each update,
            teacher <- (1 - beta) theta + beta teacher (training/step.py keeps it in the train state),
            beta 0.99 for the first 10% of the steps and 0.999 after, as the paper.
l_s is the symmetric KL divergence KL(P||Q) + KL(Q||P) = sum (p - q)(log p - log q) for classes (per
row; per labelled token for the token head; the mean of the start and end distributions for spans),
and the squared difference for regression. Every pass uses the batch's dropout rng, so perturbed,
clean and teacher outputs differ only by delta or the parameters. Defaults (configs/glue.py: smart)
are the paper's: lambda_s 1 (its grid {1, 3, 5}), mu 1, sigma 1e-5, eta 1e-3, eps 1e-5, one step.
The authors' released code (mt-dnn) normalises the step instead of projecting it onto the eps-ball,
which makes the perturbation's per-token infinity norm about 1: `smart.epsilon=1` comes close to that.
"""
from __future__ import annotations

from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from bert_jax.models import batch_rows, bert, head_kinds

Array = jax.Array


def divergence(kind: str, a: dict[str, Array], b: dict[str, Array], batch: dict[str, Array]) -> Array:
  """l_s between two outputs of a head, summed over rows (or labelled tokens), as the task loss is
  (each head kind's own, models/head_kinds.py)."""
  return head_kinds.get(kind).divergence(a, b, batch)


def with_embedding_perturbation(apply: Callable[[], dict[str, Array]], delta: Array | None
                                ) -> dict[str, Array]:
  """apply() with `delta` [B, T, H] added to the embedding output (the encoder's input)."""
  if delta is None:
    return apply()

  def add_delta(next_fun, args, kwargs, context):
    out = next_fun(*args, **kwargs)
    if isinstance(context.module, bert.Embeddings) and context.method_name == "__call__":
      return out + delta.astype(out.dtype)
    return out

  with nn.intercept_methods(add_delta):
    return apply()


def perturbation(run: Callable[[Array], dict[str, Array]], clean: dict[str, Array], shape: tuple[int, ...],
                 rng: Array, cfg: ml_collections.ConfigDict, kind: str, batch: dict[str, Array]) -> Array:
  """Algorithm 1's delta for the batch: noise, then `cfg.iterations` normalised ascent steps projected
  onto the eps-ball (infinity norm). run(delta) -> outputs with delta added to the embeddings."""
  target = jax.lax.stop_gradient(clean)
  # One key per row (batch_rows): the same noise for a row whichever device computes it.
  noise = jax.vmap(lambda key: jax.random.normal(key, shape[1:], jnp.float32))(batch_rows.row_keys(rng, shape[0]))
  delta = cfg.noise_std * noise
  for _ in range(cfg.iterations):
    grad = jax.grad(lambda d: divergence(kind, run(d), target, batch))(delta)
    norm = jnp.max(jnp.abs(grad), axis=tuple(range(1, grad.ndim)), keepdims=True)
    delta = jnp.clip(delta + cfg.step_size * grad / jnp.maximum(norm, 1e-30), -cfg.epsilon, cfg.epsilon)
  return jax.lax.stop_gradient(delta)


def momentum(cfg: ml_collections.ConfigDict, num_steps: int) -> Callable[[Array], Array]:
  """step -> beta: cfg.momentum for the first cfg.momentum_switch of the steps, then cfg.late_momentum."""
  switch = int(cfg.momentum_switch * num_steps)
  return lambda step: jnp.where(step < switch, cfg.momentum, cfg.late_momentum)


def sums(apply: Callable[..., dict[str, Array]], params: Any, teacher: Any, clean: dict[str, Array],
         batch: dict[str, Array], rng: Array, cfg: ml_collections.ConfigDict, kind: str, hidden_size: int
         ) -> dict[str, Array]:
  """{"smart_adversarial": R_s, "smart_bregman": D_Breg} as sums over the batch's rows (each where its
  weight is positive; the Bregman term needs the teacher). apply(params, delta or None) -> the head's
  outputs with delta [B, T, H] added to the embeddings, under the batch's dropout rng."""
  out = {}
  if cfg.adversarial_weight > 0:
    shape = batch["input_ids"].shape + (hidden_size,)
    frozen = jax.lax.stop_gradient(params)
    delta = perturbation(lambda d: apply(frozen, d), clean, shape, jax.random.fold_in(rng, 1), cfg, kind,
                         batch)
    out["smart_adversarial"] = divergence(kind, apply(params, delta), clean, batch)
  if teacher is not None:
    out["smart_bregman"] = divergence(kind, clean, jax.lax.stop_gradient(apply(teacher, None)), batch)
  return out
