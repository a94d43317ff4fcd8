"""Sentence pooling: one vector per row from the encoder's token vectors, as sentence-transformers
defines it (its `Pooling` and `Normalize` modules), and its record in a checkpoint's config.json.

Modes, each [B, T, H] token vectors and an int mask [B, T] -> [B, H]:
  cls                   the first token the mask keeps (row position 0 with right padding)
  max                   the element-wise max over kept tokens (masked ones at -inf)
  mean                  the sum over kept tokens / max(kept count, 1e-9)
  mean_sqrt_len_tokens  the same sum / sqrt(max(kept count, 1e-9))
Several modes concatenate in the order given ([B, len(modes) * H]), as sentence-transformers does.
With `normalize`, the result is divided by max(||x||_2, 1e-12) (torch's F.normalize). Sums and the
norm are taken in float32 whatever the compute dtype.

A sentence embedding model (bert_jax/sbert/) applies this to the encoder's last hidden state; a
sequence-level head may use it as its summary of a row.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from bert_jax.errors import UserError

Array = jax.Array
MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens")


def pool(hidden: Array, mask: Array, modes: tuple[str, ...]) -> Array:
  """hidden [B, T, H], mask [B, T] (1: a token, 0: padding) -> float32 [B, len(modes) * H]."""
  hidden = hidden.astype(jnp.float32)
  kept = mask.astype(jnp.float32)[..., None]
  outputs = []
  for mode in modes:
    if mode == "cls":
      first = jnp.argmax(mask, axis=1)
      outputs.append(jnp.take_along_axis(hidden, first[:, None, None], axis=1)[:, 0])
    elif mode == "max":
      outputs.append(jnp.max(jnp.where(kept > 0, hidden, -jnp.inf), axis=1))
    else:
      total = jnp.sum(hidden * kept, axis=1)
      count = jnp.maximum(jnp.sum(kept, axis=1), 1e-9)
      outputs.append(total / (count if mode == "mean" else jnp.sqrt(count)))
  return jnp.concatenate(outputs, axis=-1)


def pool_segments(hidden: Array, document_ids: Array, slots: int, modes: tuple[str, ...]) -> Array:
  """Packed rows: hidden [B, T, H], document_ids int [B, T] (1, 2, ... numbering each row's sentences,
  0 on padding) -> float32 [B, slots, len(modes) * H], slot s pooling sentence s + 1 of its row as `pool`
  pools a row of its own (slots past a row's last sentence hold no meaning)."""
  hidden = hidden.astype(jnp.float32)
  member = (document_ids[:, None, :] == jnp.arange(1, slots + 1)[None, :, None]).astype(jnp.float32)  # [B, S, T]
  outputs = []
  for mode in modes:
    if mode == "cls":
      first = jnp.argmax(member, axis=2)  # [B, S]
      outputs.append(jnp.take_along_axis(hidden[:, None], first[:, :, None, None], axis=2)[:, :, 0])
    elif mode == "max":
      outputs.append(jnp.max(jnp.where(member[..., None] > 0, hidden[:, None], -jnp.inf), axis=2))
    else:
      total = jnp.einsum("bst,bth->bsh", member, hidden, precision=jax.lax.Precision.HIGHEST)
      count = jnp.maximum(jnp.sum(member, axis=2), 1e-9)[..., None]
      outputs.append(total / (count if mode == "mean" else jnp.sqrt(count)))
  return jnp.concatenate(outputs, axis=-1)


def l2_normalize(x: Array, eps: float = 1e-12) -> Array:
  """x / max(||x||_2, eps) over the last axis."""
  norm = jnp.sqrt(jnp.sum(jnp.square(x.astype(jnp.float32)), axis=-1, keepdims=True))
  return x / jnp.maximum(norm, eps)


@dataclasses.dataclass(frozen=True)
class Pooling:
  """How a sentence embedding model turns token vectors into one vector: `modes` (MODES, concatenated
  in this order), `normalize` (L2) and `max_seq_length` (the tokens it reads, [CLS] and [SEP] included;
  longer inputs are cut)."""
  modes: tuple[str, ...] = ("mean",)
  normalize: bool = False
  max_seq_length: int = 128

  def __post_init__(self):
    modes = (self.modes,) if isinstance(self.modes, str) else tuple(self.modes)
    object.__setattr__(self, "modes", modes)
    bad = [m for m in modes if m not in MODES]
    if not modes or bad:
      raise UserError(f"pooling modes {list(modes)}: each must be one of {MODES}")
    if self.max_seq_length < 2:
      raise UserError(f"pooling max_seq_length={self.max_seq_length} must hold at least [CLS] and [SEP]")

  def __call__(self, hidden: Array, mask: Array) -> Array:
    """hidden [B, T, H], mask [B, T] -> float32 [B, len(modes) * H]."""
    pooled = pool(hidden, mask, self.modes)
    return l2_normalize(pooled) if self.normalize else pooled

  def packed(self, hidden: Array, document_ids: Array, slots: int) -> Array:
    """Several sentences per row (`pool_segments`): hidden [B, T, H], document_ids [B, T] ->
    float32 [B, slots, len(modes) * H]."""
    pooled = pool_segments(hidden, document_ids, slots, self.modes)
    return l2_normalize(pooled) if self.normalize else pooled

  def dimension(self, hidden_size: int) -> int:
    return len(self.modes) * hidden_size

  def to_dict(self) -> dict:
    return {"modes": list(self.modes), "normalize": self.normalize, "max_seq_length": self.max_seq_length}

  @classmethod
  def from_dict(cls, values: dict, source: str = "config.json") -> "Pooling":
    unknown = sorted(set(values) - {"modes", "normalize", "max_seq_length"})
    if unknown:
      raise UserError(f"{source}: unknown pooling keys {unknown}; known: modes, normalize, max_seq_length")
    return cls(tuple(values.get("modes", ("mean",))), bool(values.get("normalize", False)),
               int(values.get("max_seq_length", 128)))
