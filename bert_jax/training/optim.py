"""Optimizers (optax): LAMB as in the reference implementation, AdamW, StableAdamW, and warmup-then-decay
schedules, among them warmup-stable-decay.

optax.lamb computes one trust ratio per array. The reference LAMB (You et al. 2020; the TF/NVIDIA
BERT recipes) computes one per layer and leaves LayerNorm and bias parameters out of weight decay and
of the trust ratio. With scanned layers one array holds every layer's weights on a leading axis, so
`scale_by_layerwise_trust_ratio` takes the norms per slice of that axis.

StableAdamW (Wortsman et al. 2023, Algorithm 2; ModernBERT's optimizer) is AdamW whose step on each
tensor is divided by max(1, RMS(g / sqrt(v_hat))): AdaFactor's update clipping, in place of clipping the
gradient's global norm. Per tensor means per layer for stacked weights, as for LAMB.

The warmup-stable-decay schedule (`decay="1-sqrt"`; Hägele et al. 2024, ModernBERT) holds the peak rate
from the end of warmup to `decay_start`, then falls as 1 - sqrt over `decay_steps`. Up to `decay_start`
it does not depend on where the decay starts, so any checkpoint of the stable phase can start a decay:
resume it with `--config.optimizer.decay_start=<its step>` (the train state does not hold the schedule).
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import optax

from bert_jax import config_schema
from bert_jax.errors import UserError

_NO_DECAY_NAMES = ("bias", "output_bias", "scale")


def _leaf_name(path) -> str:
  names = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
  return str(names[-1]) if names else ""


def decay_mask(params: Any) -> Any:
  """True for weights that get weight decay and layer adaptation: not LayerNorm, not biases."""
  return jax.tree_util.tree_map_with_path(lambda p, _: _leaf_name(p) not in _NO_DECAY_NAMES, params)


DECAYS = ("linear", "polynomial", "constant", "1-sqrt", "rsqrt")


def learning_rate_schedule(cfg: ml_collections.ConfigDict, num_steps: int,
                           learning_rate: float | None = None) -> optax.Schedule:
  """Linear warmup from 0 to the peak (`learning_rate`, default cfg.learning_rate) over
  config_schema.warmup_steps, then linear/polynomial decay to cfg.end_learning_rate at num_steps, constant,
  or stable then 1 - sqrt decay (module docstring): every job's schedule."""
  lr, warmup = learning_rate or cfg.learning_rate, config_schema.warmup_steps(cfg, num_steps)
  warm = optax.linear_schedule(0.0, lr, max(warmup, 1))
  if cfg.decay == "constant":
    after = optax.constant_schedule(lr)
  elif cfg.decay in ("linear", "polynomial"):
    power = 1.0 if cfg.decay == "linear" else cfg.decay_power
    after = optax.polynomial_schedule(lr, cfg.end_learning_rate, power, max(num_steps - warmup, 1))
  elif cfg.decay == "1-sqrt":
    return _warmup_stable_decay(cfg, num_steps, lr, warmup, warm)
  elif cfg.decay == "rsqrt":
    return inverse_sqrt(lr, warmup)
  else:
    raise UserError(f"optimizer.decay={cfg.decay!r} is not one of {DECAYS}")
  return optax.join_schedules([warm, after], [warmup])


def inverse_sqrt(lr: float, warmup: int) -> optax.Schedule:
  """T5's schedule: the peak `lr` held for `warmup` steps (no ramp), then lr * sqrt(warmup / step); T5's
  1 / sqrt(max(step, 10^4)) is lr=0.01, warmup=10^4."""
  def schedule(step):
    return lr * jnp.sqrt(max(warmup, 1) / jnp.maximum(jnp.asarray(step, jnp.float32), max(warmup, 1)))
  return schedule


def _warmup_stable_decay(cfg: ml_collections.ConfigDict, num_steps: int, lr: float, warmup: int,
                         warm: optax.Schedule) -> optax.Schedule:
  """Warmup, the peak `lr` until decay_start (-1: num_steps - decay_steps), then 1 - sqrt down to
  end_learning_rate over decay_steps, and end_learning_rate after."""
  end, length = cfg.end_learning_rate, cfg.decay_steps
  start = num_steps - length if cfg.decay_start < 0 else cfg.decay_start
  if length < 1 or start < warmup:
    raise UserError(f"optimizer.decay='1-sqrt' needs optimizer.decay_steps >= 1 (got {length}) and its start "
                    f"(optimizer.decay_start={cfg.decay_start}; -1: train.num_steps - decay_steps = {start}) at or "
                    f"after the warmup's end, step {warmup}")

  def schedule(step):
    done = jnp.clip((step - start) / length, 0.0, 1.0)
    return jnp.where(step < warmup, warm(step), end + (lr - end) * (1.0 - jnp.sqrt(done)))
  return schedule


class _EmptyState(NamedTuple):
  pass


def scale_by_layerwise_trust_ratio(adapt_mask: Callable[[Any], Any],
                                   stacked: Any = None) -> optax.GradientTransformation:
  """Multiplies each layer's update u by ||w|| / ||u|| (1 where either norm is 0).

  adapt_mask(params) -> bool tree: which arrays are adapted (others keep ratio 1).
  stacked: bool tree (or None): arrays whose leading axis stacks layers get one ratio per slice.
  """

  def update_fn(updates, state, params):
    if params is None:
      raise ValueError("scale_by_layerwise_trust_ratio needs params")
    adapt = adapt_mask(params)
    stack = stacked if stacked is not None else jax.tree.map(lambda _: False, params)

    def scale(u, w, do_adapt, is_stacked):
      if not do_adapt:
        return u
      axes = tuple(range(1, u.ndim)) if is_stacked else None
      w_norm = jnp.sqrt(jnp.sum(jnp.square(w.astype(jnp.float32)), axis=axes, keepdims=is_stacked))
      u_norm = jnp.sqrt(jnp.sum(jnp.square(u.astype(jnp.float32)), axis=axes, keepdims=is_stacked))
      ratio = jnp.where((w_norm > 0) & (u_norm > 0), w_norm / jnp.maximum(u_norm, 1e-30), 1.0)
      return (u * ratio).astype(u.dtype)

    return jax.tree.map(scale, updates, params, adapt, stack), state

  return optax.GradientTransformation(lambda _: _EmptyState(), update_fn)


def clip_by_global_norm(max_norm: float) -> optax.GradientTransformation:
  """optax.clip_by_global_norm as one scalar factor, min(1, max_norm / norm), times every gradient: XLA fuses the
  product into the moments' updates. optax's per-element select between g and g / norm * max_norm made XLA:CPU
  write the divided gradient out and read both copies in each moment's pass (BENCHMARKS.md, "KerasHub on CPU,
  profiled"). Unclipped, the gradients pass unchanged; clipped, they differ from optax's by rounding."""

  def update_fn(updates, state, params=None):
    del params
    norm = optax.tree.norm(updates)
    scale = max_norm / jnp.maximum(norm, max_norm)
    return jax.tree.map(lambda g: g * scale.astype(g.dtype), updates), state

  return optax.GradientTransformation(optax.init_empty_state, update_fn)


def lamb(learning_rate: optax.ScalarOrSchedule, *, b1: float = 0.9, b2: float = 0.999,
         eps: float = 1e-6, weight_decay: float = 0.01, clip_norm: float = 1.0,
         stacked: Any = None) -> optax.GradientTransformation:
  """LAMB: clip by global norm, Adam moments (bias-corrected), decoupled decay, per-layer trust ratio."""
  return optax.chain(
      clip_by_global_norm(clip_norm) if clip_norm > 0 else optax.identity(),
      optax.scale_by_adam(b1=b1, b2=b2, eps=eps),
      optax.add_decayed_weights(weight_decay, mask=decay_mask),
      scale_by_layerwise_trust_ratio(decay_mask, stacked),
      optax.scale_by_learning_rate(learning_rate),
  )


def adamw(learning_rate: optax.ScalarOrSchedule, *, b1: float = 0.9, b2: float = 0.999,
          eps: float = 1e-6, weight_decay: float = 0.01, clip_norm: float = 1.0
          ) -> optax.GradientTransformation:
  return optax.chain(
      clip_by_global_norm(clip_norm) if clip_norm > 0 else optax.identity(),
      optax.adamw(learning_rate, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay, mask=decay_mask),
  )


class StableAdamState(NamedTuple):
  inner: optax.OptState  # the wrapped AdamW's (scale_by_adam first)


def scale_by_stable_adamw(b1: float, b2: float, eps: float, weight_decay: float, stacked: Any = None
                          ) -> optax.GradientTransformation:
  """Adam's step plus decoupled weight decay (not on LayerNorm and biases), each tensor's (each layer's,
  for `stacked` arrays) divided by max(1, RMS(g / max(sqrt(v_hat), eps))); the learning rate comes after."""
  inner = optax.chain(optax.scale_by_adam(b1=b1, b2=b2, eps=eps),
                      optax.add_decayed_weights(weight_decay, mask=decay_mask))

  def update_fn(grads, state, params=None):
    updates, inner_state = inner.update(grads, state.inner, params)
    adam = inner_state[0]
    bias = 1.0 - jnp.asarray(b2, jnp.float32) ** adam.count.astype(jnp.float32)
    stack = stacked if stacked is not None else jax.tree.map(lambda _: False, grads)

    def clip(u, g, nu, is_stacked):
      ratio = jnp.square(g.astype(jnp.float32)) / jnp.maximum(nu.astype(jnp.float32) / bias, eps * eps)
      axes = tuple(range(1, g.ndim)) if is_stacked else None
      rms = jnp.sqrt(jnp.mean(ratio, axis=axes, keepdims=is_stacked))
      return (u / jnp.maximum(1.0, rms)).astype(u.dtype)

    return jax.tree.map(clip, updates, grads, adam.nu, stack), StableAdamState(inner_state)

  return optax.GradientTransformation(lambda params: StableAdamState(inner.init(params)), update_fn)


def stable_adamw(learning_rate: optax.ScalarOrSchedule, *, b1: float = 0.9, b2: float = 0.98, eps: float = 1e-6,
                 weight_decay: float = 0.01, clip_norm: float = 0.0, stacked: Any = None
                 ) -> optax.GradientTransformation:
  """StableAdamW (module docstring); clip_norm > 0 adds global-norm clipping before it (ModernBERT: none)."""
  return optax.chain(
      clip_by_global_norm(clip_norm) if clip_norm > 0 else optax.identity(),
      scale_by_stable_adamw(b1, b2, eps, weight_decay, stacked),
      optax.scale_by_learning_rate(learning_rate),
  )


def adafactor(learning_rate: optax.ScalarOrSchedule, *, clip_norm: float = 0.0) -> optax.GradientTransformation:
  """T5's Adafactor (optax's: factored second moments, decay 0.8, update clipping at 1, scaled by each
  parameter's RMS, no momentum, no weight decay); clip_norm > 0 adds global-norm clipping before it."""
  inner = optax.adafactor(learning_rate, decay_rate=0.8, clipping_threshold=1.0, multiply_by_parameter_scale=True)
  # Its factored moments (a row and a column per matrix) do not have their parameter's shape, so they cannot
  # take its logical axes: they start from the unboxed parameters and are replicated (they are small).
  unboxed = optax.GradientTransformation(lambda params: inner.init(nn.meta.unbox(params)), inner.update)
  return optax.chain(clip_by_global_norm(clip_norm) if clip_norm > 0 else optax.identity(), unboxed)


# optimizer.name -> (config section, schedule, stacked) -> the optimizer: the registry of optimizers by name.
_BUILDERS: dict[str, Callable[[ml_collections.ConfigDict, optax.Schedule, Any], optax.GradientTransformation]] = {
    "lamb": lambda cfg, schedule, stacked: lamb(schedule, stacked=stacked, **_common(cfg)),
    "adamw": lambda cfg, schedule, stacked: adamw(schedule, **_common(cfg)),
    "stable_adamw": lambda cfg, schedule, stacked: stable_adamw(schedule, stacked=stacked, **_common(cfg)),
    "adafactor": lambda cfg, schedule, stacked: adafactor(schedule, clip_norm=cfg.clip_norm),
}
OPTIMIZERS = tuple(_BUILDERS)


def _common(cfg: ml_collections.ConfigDict) -> dict:
  return dict(b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay, clip_norm=cfg.clip_norm)


def make_optimizer(cfg: ml_collections.ConfigDict, num_steps: int, stacked: Any = None
                   ) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """The optimizer and its schedule from the `optimizer` config section."""
  if cfg.name not in _BUILDERS:
    raise UserError(f"optimizer.name={cfg.name!r} is not one of {OPTIMIZERS}")
  schedule = learning_rate_schedule(cfg, num_steps)
  return _BUILDERS[cfg.name](cfg, schedule, stacked), schedule
