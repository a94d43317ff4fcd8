"""Fine-tuning optimizers: Adam with or without bias correction, per-parameter learning-rate multipliers
(a larger rate for the new head, layer-wise decay down the encoder), and every job's schedule (warmup,
then decay: training/optim.py:learning_rate_schedule).

Order of the chain: clip by global norm -> Adam moments -> decoupled weight decay (not on LayerNorm or
biases) -> per-parameter multiplier -> -learning rate. The multiplier scales the decay term too, as
parameter groups with their own learning rates do in the reference implementations. With a trainable
mask (train.mode adapters, feature) the chain runs on the trainable parameters only; the others get a
zero update and no optimizer state.
"""
from __future__ import annotations

import re
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from bert_jax.models import isobn
from bert_jax.models.config import ModelConfig
from bert_jax.training.optim import clip_by_global_norm, decay_mask, learning_rate_schedule


class BertAdamState(NamedTuple):
  mu: Any
  nu: Any


def scale_by_bert_adam(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-6) -> optax.GradientTransformation:
  """Adam as the original BERT code (AdamWeightDecayOptimizer) wrote it: m / (sqrt(v) + eps) without
  bias correction, so the first steps move by about (1 - b1) / sqrt(1 - b2) times less than Adam's."""

  def init_fn(params):
    return BertAdamState(mu=jax.tree.map(jnp.zeros_like, params), nu=jax.tree.map(jnp.zeros_like, params))

  def update_fn(updates, state, params=None):
    del params
    mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state.mu, updates)
    nu = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * jnp.square(g), state.nu, updates)
    updates = jax.tree.map(lambda m, v: m / (jnp.sqrt(v) + eps), mu, nu)
    return updates, BertAdamState(mu=mu, nu=nu)

  return optax.GradientTransformation(init_fn, update_fn)


def scale_by_multipliers(multipliers: Any) -> optax.GradientTransformation:
  """Multiplies each update by its multiplier: a scalar, or [L, 1, ...] for stacked layer weights."""

  def scale(u, m):  # frozen parameters reach here as MaskedNode (optax.multi_transform)
    return u if isinstance(u, optax.MaskedNode) else (u * m).astype(u.dtype)

  def update_fn(updates, state, params=None):
    del params
    return jax.tree.map(scale, updates, multipliers,
                        is_leaf=lambda x: isinstance(x, optax.MaskedNode)), state

  return optax.GradientTransformation(lambda _: optax.EmptyState(), update_fn)


def _path_names(path) -> list[str]:
  return [str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey)]


def layer_depth(names: list[str], num_layers: int) -> int | None:
  """0 for embeddings, i + 1 for encoder layer i, num_layers + 1 above the encoder (pooler);
  None for stacked (scanned) layer weights, whose depth runs along their leading axis."""
  if names[0] == "embeddings":
    return 0
  if names[0] != "encoder":
    return num_layers + 1
  match = re.fullmatch(r"layer_(\d+)", names[1])
  if match:
    return int(match.group(1)) + 1
  return None if names[1] == "layers" else num_layers  # shared layers count as the top one


def lr_multipliers(params: Any, model: ModelConfig, layer_decay: float, head_multiplier: float) -> Any:
  """Multiplier per parameter: head_multiplier on the head(s); layer_decay ** (L + 1 - depth) elsewhere
  (Clark et al. 2020; with layer_decay=1 the whole encoder trains at the base rate)."""
  num_layers = model.num_layers
  stacked_axis = model.scan_layers and model.share_layers != "all"

  def multiplier(path, leaf):
    names = _path_names(path)
    if names[0] in ("head", "task_heads"):  # a multi-task run's heads (finetune/multitask.py) too
      return np.float32(head_multiplier)
    depth = layer_depth(names, num_layers)
    if depth is None and stacked_axis:
      depths = np.arange(1, num_layers + 1, dtype=np.float32)
      return (layer_decay ** (num_layers + 1 - depths)).reshape((-1,) + (1,) * (leaf.ndim - 1))
    depth = num_layers if depth is None else depth
    return np.float32(layer_decay ** (num_layers + 1 - depth))

  return jax.tree_util.tree_map_with_path(multiplier, params)


def make_optimizer(cfg: ml_collections.ConfigDict, num_steps: int, params: Any, model: ModelConfig,
                   trainable: Any = None, learning_rate: float | None = None
                   ) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """From the `optimizer` section; `params` may be abstract (only paths and ranks are read).
  trainable: a tree of bools like params (None: all train); learning_rate: the base rate
  (default optimizer.learning_rate)."""
  learning_rate = learning_rate or cfg.learning_rate
  schedule = learning_rate_schedule(cfg, num_steps, learning_rate)
  head_multiplier = cfg.head_learning_rate / learning_rate if cfg.head_learning_rate else 1.0
  moments = (optax.scale_by_adam(cfg.b1, cfg.b2, cfg.eps) if cfg.bias_correction
             else scale_by_bert_adam(cfg.b1, cfg.b2, cfg.eps))
  tx = optax.chain(
      clip_by_global_norm(cfg.clip_norm) if cfg.clip_norm > 0 else optax.identity(),
      moments,
      optax.add_decayed_weights(cfg.weight_decay, mask=decay_mask),
      scale_by_multipliers(lr_multipliers(params, model, cfg.layer_decay, head_multiplier)),
      optax.scale_by_learning_rate(schedule))
  if trainable is None:
    trainable = jax.tree.map(lambda _: True, params)
  # head.cls_norm's running estimates (models/isobn.py) are assigned, not trained: their "gradient" is
  # (estimate - new value), so the update -gradient sets the new value.
  labels = jax.tree_util.tree_map_with_path(
      lambda path, t: "state" if getattr(path[-1], "key", None) in isobn.STATE_PARAMS else ("train" if t else "frozen"),
      trainable)
  if any(label != "train" for label in jax.tree.leaves(labels)):
    tx = optax.multi_transform({"train": tx, "frozen": optax.set_to_zero(), "state": optax.scale(-1.0)}, labels)
  return tx, schedule
