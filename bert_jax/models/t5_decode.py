"""Generation with T5 (models/t5.py): greedy and beam search, jitted, over a fixed-length decoder buffer.

The encoder runs once; each step runs the decoder over the whole buffer (its causal mask makes position t's
logits depend on tokens 0..t only, so the unfilled tail does not matter) and reads position t. That is
O(length^2) decoder work with no key/value cache: simple and exact, for the short targets of fine-tuning
tasks. A sequence is finished at </s> (eos_token_id); after it, padding (pad_token_id). Transformers'
`generate(num_beams=1, do_sample=False)` gives the same tokens (tests/test_t5.py).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.models.t5 import T5Model


@functools.partial(jax.jit, static_argnames=("model", "max_length"))
def greedy(model: T5Model, params, input_ids: jax.Array, attention_mask: jax.Array, max_length: int) -> jax.Array:
  """int32 [B, max_length]: each row's tokens after the start token, </s> included, padding after it."""
  cfg = model.config
  variables = {"params": params}
  encoded = model.apply(variables, input_ids, attention_mask, method=T5Model.encode)
  batch = input_ids.shape[0]
  buffer = jnp.full((batch, max_length + 1), cfg.pad_token_id, jnp.int32).at[:, 0].set(cfg.decoder_start_token_id)

  def step(t, state):
    buffer, done = state
    logits = model.apply(variables, buffer[:, :-1], encoded, attention_mask, method=T5Model.decode)
    token = jnp.argmax(logits[:, t], axis=-1).astype(jnp.int32)
    token = jnp.where(done, cfg.pad_token_id, token)
    return buffer.at[:, t + 1].set(token), done | (token == cfg.eos_token_id)

  buffer, _ = jax.lax.fori_loop(0, max_length, step, (buffer, jnp.zeros((batch,), bool)))
  return buffer[:, 1:]


@functools.partial(jax.jit, static_argnames=("model", "max_length", "num_beams"))
def beam_search(model: T5Model, params, input_ids: jax.Array, attention_mask: jax.Array, max_length: int,
                num_beams: int = 4) -> jax.Array:
  """int32 [B, max_length]: the highest-scoring beam of each row (sum of log-probabilities; a finished beam
  keeps its score and extends with padding). No length penalty."""
  cfg = model.config
  variables = {"params": params}
  batch, k = input_ids.shape[0], num_beams
  ids = jnp.repeat(input_ids, k, axis=0)
  mask = jnp.repeat(attention_mask, k, axis=0)
  encoded = model.apply(variables, ids, mask, method=T5Model.encode)
  buffer = jnp.full((batch * k, max_length + 1), cfg.pad_token_id, jnp.int32).at[:, 0].set(
      cfg.decoder_start_token_id)
  # Only the first beam is live at the start, so the k beams do not repeat one hypothesis.
  scores = jnp.tile(jnp.asarray([0.0] + [-1e9] * (k - 1), jnp.float32), batch)
  done = jnp.zeros((batch * k,), bool)

  def step(t, state):
    buffer, scores, done = state
    logits = model.apply(variables, buffer[:, :-1], encoded, mask, method=T5Model.decode)[:, t]
    logp = jax.nn.log_softmax(logits, axis=-1)
    vocab = logp.shape[-1]
    # A finished beam continues with padding at no cost, and nothing else.
    pad_only = jnp.full((vocab,), -1e9, jnp.float32).at[cfg.pad_token_id].set(0.0)
    logp = jnp.where(done[:, None], pad_only[None], logp)
    total = (scores[:, None] + logp).reshape(batch, k * vocab)
    best, flat = jax.lax.top_k(total, k)
    parent = flat // vocab + jnp.arange(batch)[:, None] * k
    token = (flat % vocab).astype(jnp.int32)
    parent, token, best = parent.reshape(-1), token.reshape(-1), best.reshape(-1)
    buffer = buffer[parent].at[:, t + 1].set(token)
    return buffer, best, done[parent] | (token == cfg.eos_token_id)

  buffer, scores, _ = jax.lax.fori_loop(0, max_length, step, (buffer, scores, done))
  top = jnp.argmax(scores.reshape(batch, k), axis=-1) + jnp.arange(batch) * k
  return buffer[top, 1:]


def strip(tokens: np.ndarray, eos_token_id: int) -> list[list[int]]:
  """Each row's tokens up to (not including) its </s>."""
  out = []
  for row in np.asarray(tokens).tolist():
    out.append(row[:row.index(eos_token_id)] if eos_token_id in row else row)
  return out
