"""Rotary position embeddings (Su et al. 2021), as ModernBERT and Hugging Face write them.

Each head's vector is split in two halves (x1, x2); the pair (x1[i], x2[i]) is rotated by the angle
position * theta^(-2i / D). Position ids restart at 0 in every packed document, so a document's
queries and keys rotate as they would alone in a row. theta is per layer kind (ModernBERT: 10k for
local layers, 160k for global ones).

Shapes: B batch, T length, N heads, D head dim.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


def inverse_frequencies(head_dim: int, theta: float) -> np.ndarray:
  """float32[D / 2]: theta^(-2i / D), computed in float32 as Hugging Face does (the same roundings)."""
  exponents = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
  return (np.float32(1.0) / np.power(np.float32(theta), exponents)).astype(np.float32)


def rotate(x: Array, positions: Array, inv_freq: Array) -> Array:
  """x: [B, T, N, D] rotated by positions int[B, T] at the frequencies inv_freq float32[D / 2], in float32."""
  angles = positions.astype(jnp.float32)[..., None] * inv_freq.astype(jnp.float32)  # [B, T, D/2]
  angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]
  cos, sin = jnp.cos(angles), jnp.sin(angles)
  x32 = x.astype(jnp.float32)
  x1, x2 = jnp.split(x32, 2, axis=-1)
  rotated = jnp.concatenate([-x2, x1], axis=-1)
  return (x32 * cos + rotated * sin).astype(x.dtype)
