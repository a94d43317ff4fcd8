"""SpanBERT's span boundary objective head (Joshi et al. 2020, section 3.2).

Each token x_i of a masked span (s..e) is predicted from the encoder states at the span's boundary,
x_{s-1} and x_{e+1}, and a relative position embedding p_{i-s+1}:
  h = LN(GeLU(W2 LN(GeLU(W1 [x_{s-1}; x_{e+1}; p])))),  logits = h E^T + b  (E: the tied word embeddings).
Sizes follow the released code (pair_bert.py): 200-wide position embeddings for the first 20 tokens of a
span; tokens further into a span are left to the MLM loss alone.

The head is applied next to a `BertModel` (its params sit beside the encoder's under "sbo_head"), so the
rest of the tree stays exactly a BertModel's.
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.models.bert import activation, dense, gather_positions, kernel_init, layer_norm, zeros_init
from bert_jax.models.config import ModelConfig

Array = jax.Array


class SpanBoundaryHead(nn.Module):
  """Boundary states + relative position -> two-layer MLP with LayerNorm -> tied vocabulary logits."""
  config: ModelConfig
  max_span_positions: int = 20
  position_size: int = 200

  @nn.compact
  def __call__(self, hidden: Array, left: Array, right: Array, offset: Array, word_embeddings: Array
               ) -> Array:
    """hidden: [B, T, H]; left, right, offset: int32[B, P] (offset < max_span_positions);
    word_embeddings: [V, E] -> f32[B, P, V]."""
    cfg = self.config
    positions = nn.Embed(self.max_span_positions, self.position_size, dtype=cfg.compute_dtype,
                         param_dtype=cfg.weight_dtype, name="position_embeddings",
                         embedding_init=kernel_init(cfg, ("positions", "norm")))  # tiny: replicated
    x = jnp.concatenate([gather_positions(hidden, left), gather_positions(hidden, right),
                         positions(offset).astype(hidden.dtype)], axis=-1)
    act = activation(cfg)
    x = layer_norm(cfg, "layer_norm_1")(act(dense(cfg, cfg.hidden_size, ("mlp", "embed"), "dense_1")(x)))
    x = layer_norm(cfg, "layer_norm_2")(act(dense(cfg, cfg.embed_dim, ("mlp", "embed"), "dense_2")(x)))
    bias = self.param("output_bias", zeros_init(("vocab",)), (cfg.vocab_size,), cfg.weight_dtype)
    logits = jnp.einsum("bpe,ve->bpv", x.astype(cfg.compute_dtype), word_embeddings.astype(cfg.compute_dtype))
    return logits.astype(jnp.float32) + bias.astype(jnp.float32)
