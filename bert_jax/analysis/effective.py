"""Effective attention (Brunner et al. 2020, "On identifiability in transformers").

A head's output is A T with T = V W^O_h: V = E W^V_h + b^V_h the value vectors of the layer input E
(the value bias included, so that the statement below is exact) and W^O_h the head's rows of the
output kernel. Any part of A's rows in the left null space of T (x with x T = 0) changes nothing:
when the sequence is longer than the head dimension, that space is not empty and A is not
identifiable from the output. Effective attention removes that part:
    Ã = A - A P_null(T) = A P_col(T),    and Ã T = A T.
P_col(T) is U_r U_r^T over T's left singular vectors with singular value above max(s) max(n, H) eps
(numpy.linalg.matrix_rank's tolerance). T = V R_h^T Q_h^T with W^O_h^T = Q_h R_h (QR), and Q_h^T has
orthonormal rows, so T has the column space and singular values of the [n, D] matrix V R_h^T: one
small SVD per head instead of an [n, H] one. Padding rows of V are zeroed, so they fall in the null
space and Ã keeps the [n, n] block of real tokens.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp



@jax.jit
def effective_attention(attentions: jax.Array, inputs: jax.Array, attention_mask: jax.Array,
                        attention: dict) -> jax.Array:
  """Ã float32[B, n, T, T] for one layer: attentions [B, n, T, T] of its n (kept) heads, inputs [B, T, H]
  (the layer's input E), attention_mask int32[B, T], attention: that layer's attention params."""
  value, out = attention["value"], attention["out"]["kernel"].astype(jnp.float32)
  v = jnp.einsum("bth,hnd->bntd", inputs.astype(jnp.float32), value["kernel"].astype(jnp.float32))
  v = (v + value["bias"].astype(jnp.float32)[None, :, None]) * attention_mask[:, None, :, None]
  _, r = jnp.linalg.qr(jnp.swapaxes(out, 1, 2))  # W^O_h^T = Q R: [n, H, D] -> R [n, D, D]
  u, s, _ = jnp.linalg.svd(jnp.einsum("bntd,ned->bnte", v, r), full_matrices=False)
  tolerance = jnp.max(s, axis=-1, keepdims=True) * max(inputs.shape[1], inputs.shape[2]) * jnp.finfo(
      jnp.float32).eps
  u = u * (s > tolerance)[..., None, :]
  return jnp.einsum("bnte,bnse->bnts", jnp.einsum("bnts,bnse->bnte", attentions, u), u)


@jax.jit
def correlation(a: jax.Array, b: jax.Array, attention_mask: jax.Array) -> jax.Array:
  """Pearson correlation [B, n] of two maps [B, n, T, T] over their [n, n] blocks of real tokens."""
  w = (attention_mask[:, :, None] * attention_mask[:, None, :]).astype(jnp.float32)[:, None]
  count = jnp.sum(w, axis=(-2, -1), keepdims=True)
  da = a - jnp.sum(a * w, axis=(-2, -1), keepdims=True) / count
  db = b - jnp.sum(b * w, axis=(-2, -1), keepdims=True) / count
  cov = jnp.sum(w * da * db, axis=(-2, -1))
  var = jnp.sum(w * da * da, axis=(-2, -1)) * jnp.sum(w * db * db, axis=(-2, -1))
  return jnp.where(var > 0, cov / jnp.sqrt(jnp.where(var > 0, var, 1.0)), jnp.nan)
