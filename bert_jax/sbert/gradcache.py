"""GradCache (Gao et al. 2021): the ranking loss's gradient over a global batch too large to back-propagate
at once, exactly (sentence-transformers' Cached* losses, on a mesh).

A ranking loss is not a sum of per-micro-batch terms (every row is a negative of every other), so
training/accumulate.py's micro-batches would change it. With train.grad_accum_steps=K the step instead
runs in three passes, inside the data-parallel shard_map of training/accumulate.py (each device on its own
rows, the `tensor` axis left to XLA):

  1. each device embeds its rows in K consecutive chunks, no gradients kept: [rows, columns, D];
  2. the embeddings are all-gathered over the data axes, and each chunk of the device's rows takes its loss
     against the whole global batch (losses.ranking_rows) and the gradient with respect to its own rows and
     to the whole batch; the latter is summed back to the devices that own those rows (one reduce-scatter);
  3. each chunk is embedded again under jax.vjp and the cached embedding gradients are pulled back to
     the parameters; the devices' parameter gradients are reduced once (training/accumulate.py).

Peak memory is one chunk's activations plus a chunk's [chunk rows, global batch] scores, not the batch's.
Dropout draws the same masks in both passes and as the uncached step: both passes run under the same key,
and `batch_rows.chunk` numbers a chunk's rows as the whole batch numbers them (models/dropout.py). So the
step is the uncached step's, up to the order of float additions (tests/test_sbert_gradcache.py).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

from bert_jax.models import batch_rows
from bert_jax.training import accumulate, step as step_lib


def _chunks(x: jax.Array, count: int) -> jax.Array:
  """[R, ...] -> [count, R / count, ...]: consecutive rows."""
  return x.reshape((count, x.shape[0] // count) + x.shape[1:])


# embed(params, batch [rows, columns, T], rng) -> float32[rows, columns, D]
Embed = Callable[[Any, dict, jax.Array], jax.Array]


@dataclasses.dataclass(frozen=True)
class RowChunks:
  """`count` chunks of consecutive rows, each under the step's key, its rows numbered as the batch's
  (batch_rows.chunk): the one-pass step's dropout masks."""
  count: int

  def embed(self, embed: Embed, params: Any, batch: dict, rng: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(float32[rows, columns, D], the number of chunks)."""
    def body(_, xs):
      part, i = xs
      with batch_rows.chunk(i, self.count):
        return None, embed(params, part, rng)
    _, emb = jax.lax.scan(body, None, ({k: _chunks(v, self.count) for k, v in batch.items()},
                                       jnp.arange(self.count)))
    return emb.reshape((-1,) + emb.shape[2:]), jnp.asarray(self.count, jnp.float32)

  def pull(self, embed: Embed, params: Any, batch: dict, rng: jax.Array, cotangents: jax.Array) -> Any:
    def body(acc, xs):
      part, i, cotangent = xs
      with batch_rows.chunk(i, self.count):
        _, pull = jax.vjp(lambda p: embed(p, part, rng), params)
      return jax.tree.map(jnp.add, acc, pull(cotangent)[0]), None
    grads, _ = jax.lax.scan(body, jax.tree.map(jnp.zeros_like, params),
                            ({k: _chunks(v, self.count) for k, v in batch.items()}, jnp.arange(self.count),
                             _chunks(cotangents, self.count)))
    return grads


@dataclasses.dataclass(frozen=True)
class TokenChunks:
  """Chunks of at most `budget` tokens (sentence-transformers' mini_batch_num_tokens, counted padded): the
  device's sentences in length order, each chunk as many as fit at the smallest length bucket that holds
  its longest (budget // bucket rows; the last bucket is max_seq_length). So a chunk of short sentences
  holds many, one of long ones few. Each bucket's chunk shape is one branch of a lax.switch, compiled once;
  the chunks run in a while loop (no gradient flows through it: pass 3 pulls back inside each iteration).
  Chunk c runs under fold_in(key, c) in both passes, so dropout draws the same masks twice."""
  budget: int
  buckets: tuple[int, ...]

  def _sorted(self, batch: dict):
    ids, mask = batch["input_ids"], batch["attention_mask"]
    rows, columns, length = ids.shape
    ids, mask = ids.reshape(-1, length), mask.reshape(-1, length)
    lengths = jnp.sum(mask, axis=-1)
    order = jnp.argsort(lengths, stable=True)
    pad = max(self.budget // b for b in self.buckets)  # rows a last chunk may run past the end
    tail = jnp.zeros((pad, length), ids.dtype).at[:, 0].set(1)  # one token each: never an empty pooling
    return (order, jnp.concatenate([ids[order], tail * 0]), jnp.concatenate([mask[order], tail]),
            jnp.concatenate([lengths[order], jnp.zeros(pad, lengths.dtype)]), ids.shape[0])

  def _loop(self, batch: dict, rng: jax.Array, init: Any, step: Callable) -> tuple[Any, jax.Array]:
    """Runs step(carry, ids [n, L], mask, start, key) -> carry over the chunks; (carry, chunk count)."""
    _, ids, mask, lengths, total = self._sorted(batch)

    def branch(bucket):
      rows = self.budget // bucket
      def run(start, index, carry):
        part = [jax.lax.dynamic_slice_in_dim(x, start, rows)[:, :bucket] for x in (ids, mask)]
        return start + rows, step(carry, *part, start, jax.random.fold_in(rng, index))
      return run

    def body(state):
      start, index, carry = state
      longest = [lengths[jnp.minimum(start + self.budget // b - 1, total - 1)] for b in self.buckets]
      fits = jnp.stack([n <= b for n, b in zip(longest, self.buckets)])
      start, carry = jax.lax.switch(jnp.argmax(fits), [branch(b) for b in self.buckets], start, index, carry)
      return start, index + 1, carry

    _, count, carry = jax.lax.while_loop(lambda state: state[0] < total, body,
                                          (jnp.int32(0), jnp.int32(0), init))
    return carry, count.astype(jnp.float32)

  def embed(self, embed: Embed, params: Any, batch: dict, rng: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(float32[rows, columns, D], the number of chunks)."""
    order, ids, *_ = self._sorted(batch)
    rows, columns = batch["input_ids"].shape[:2]

    def step(out, part_ids, part_mask, start, key):
      e = embed(params, {"input_ids": part_ids[:, None], "attention_mask": part_mask[:, None]}, key)[:, 0]
      return jax.lax.dynamic_update_slice_in_dim(out, e.astype(out.dtype), start, 0)

    dimension = jax.eval_shape(lambda: embed(params, jax.tree.map(lambda x: x[:1, :1], batch), rng)).shape[-1]
    sorted_emb, count = self._loop(batch, rng, jnp.zeros((ids.shape[0], dimension), jnp.float32), step)
    emb = jnp.zeros((rows * columns, dimension), jnp.float32).at[order].set(sorted_emb[:rows * columns])
    return emb.reshape(rows, columns, dimension), count

  def pull(self, embed: Embed, params: Any, batch: dict, rng: jax.Array, cotangents: jax.Array) -> Any:
    order, ids, *_ = self._sorted(batch)
    flat = cotangents.reshape(-1, cotangents.shape[-1])[order]
    flat = jnp.concatenate([flat, jnp.zeros((ids.shape[0] - flat.shape[0], flat.shape[1]), flat.dtype)])

    def step(acc, part_ids, part_mask, start, key):
      cotangent = jax.lax.dynamic_slice_in_dim(flat, start, part_ids.shape[0])
      chunk = {"input_ids": part_ids[:, None], "attention_mask": part_mask[:, None]}
      _, pull = jax.vjp(lambda p: embed(p, chunk, key)[:, 0], params)
      return jax.tree.map(jnp.add, acc, pull(cotangent)[0])

    return self._loop(batch, rng, jax.tree.map(jnp.zeros_like, params), step)[0]


def cached_gradients(params: Any, batch: dict[str, jax.Array], rng: jax.Array, *, embed: Embed,
                     rows_loss: Callable, chunking: RowChunks | TokenChunks, loss_chunks: int,
                     weight: jax.Array) -> tuple[tuple[jax.Array, dict], Any]:
  """accumulate.GradFn of one device's rows: ((weight x its loss sum, {"loss": the sum, "chunks": its
  embedding chunks}), its unreduced gradient of weight x the global batch's loss sum).

  rows_loss(rows, whole, first) -> [rows]: rows first .. of the global batch `whole` [B, columns, D]
  against it, taken in `loss_chunks` chunks of the device's rows.
  """
  axes = batch_rows.axes()
  local, count = chunking.embed(embed, params, batch, rng)  # [rows, columns, D]
  whole = jax.lax.all_gather(local, axes, axis=0, tiled=True) if axes else local
  first = jax.lax.axis_index(axes) * local.shape[0] if axes else 0

  def chunk_loss(carry, xs):
    rows, i = xs
    total, pull = jax.vjp(lambda r, w: jnp.sum(rows_loss(r, w, first + i * rows.shape[0])), rows, whole)
    d_rows, d_whole = pull(jnp.ones_like(total))
    return (carry[0] + total, carry[1] + d_whole), d_rows

  (total, d_whole), d_rows = jax.lax.scan(chunk_loss, (jnp.zeros((), jnp.float32), jnp.zeros_like(whole)),
                                          (_chunks(local, loss_chunks), jnp.arange(loss_chunks)))
  if axes:  # the gradient each device's loss sends to every row, summed on the row's own device
    d_whole = jax.lax.psum_scatter(d_whole, axes, scatter_dimension=0, tiled=True)
  cotangents = (d_rows.reshape(local.shape) + d_whole) * weight
  grads = chunking.pull(embed, params, batch, rng, cotangents)
  return (total * weight, {"loss": total, "chunks": count}), grads


def train_step(state: step_lib.TrainState, batch: dict[str, jax.Array], rng: jax.Array, *, objective,
               tx: optax.GradientTransformation, schedule: optax.Schedule, grad_accum_steps: int,
               param_specs: Any, axis_rules: tuple, grad_reduce_dtype: str = "float32", trainable: Any = None,
               chunk_tokens: int = 0, buckets: tuple[int, ...] = ()
               ) -> tuple[step_lib.TrainState, dict[str, jax.Array]]:
  """training/step.py's train_step (a `sharded_setup` step_fn) with GradCache's gradients: the objective's
  `embed(params, batch, rng, deterministic)` in grad_accum_steps chunks of rows per device (or, with
  chunk_tokens, TokenChunks over `buckets`) and its `rows_loss(rows, whole, first)` in grad_accum_steps
  chunks; its loss is sums["loss"] / counts (so d loss / d sum is the same for every row). Metrics add
  `chunks`, the embedding chunks of all devices."""
  rng = jax.random.fold_in(rng, state.step)
  counts = objective.counts(batch)
  weight = jax.grad(lambda s: objective.loss({"loss": s}, counts))(jnp.zeros((), jnp.float32))
  chunking = TokenChunks(chunk_tokens, buckets) if chunk_tokens else RowChunks(grad_accum_steps)
  grad_fn = functools.partial(
      cached_gradients, embed=lambda p, b, r: objective.embed(step_lib.freeze(p, trainable), b, r, deterministic=False),
      rows_loss=objective.rows_loss, chunking=chunking, loss_chunks=grad_accum_steps, weight=weight)
  grads, sums = accumulate.gradients(grad_fn, state.params, batch, rng, param_specs=param_specs, num_micro=1,
                                     axis_rules=axis_rules, reduce_dtype=grad_reduce_dtype, trainable=trainable)
  sums = dict(sums)
  chunks = sums.pop("chunks")
  state, metrics = step_lib.apply_gradients(state, grads, sums, counts, objective=objective, tx=tx,
                                            schedule=schedule)
  return state, {**metrics, "chunks": chunks}
