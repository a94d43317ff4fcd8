"""T5's span-corruption input, streamed (data.example_builder="span_corruption"): the masked-LM pipeline's reader,
span_corruption.py's examples, packed rows.

Read: the documents come through the masked-LM pipeline's virtual shards (shards.ShardStream: data.num_shards
streams, each reading data.shuffle_buffer documents at a time from a saved byte offset, never a whole file).
The span-corruption builder (examples.py) lays a block's tokens end to end and cuts them into chunks of the raw
length random_spans_helper derives (568 for 512 inputs), which the stream shuffles within the block, as T5's
reduce_concat_tokens + split_tokens do over a batch of documents.
Corrupt: a shard's chunk k of epoch e gets its noise mask from span_corruption.example_rng(seeds, shard,
e << 40 | k), the stream's mask counter: re-drawn every epoch, and the same draw span_corruption.py's definition
makes from that key.
Pack: each shard lays its examples end to end into rows (span_corruption.pack) while the inputs and the targets
both fit; an example that does not fit opens the shard's next row.
Batch: as pipeline.py, host h builds shards [h S/H, (h+1) S/H), global_batch / S consecutive rows of each, in
shard order: a global batch depends on the config and the step only, whatever the host count.
Resume: a shard's position is its stream's state before the first example no row holds yet; `save` writes the
positions as the masked-LM input does (shards.write_state: the checkpoint's data item) and `restore` re-reads
one block per shard.
Where: on one prefetch thread in this process, or (data.num_workers, as the masked-LM input) in worker processes,
each building its contiguous group of shards' rows into shared-memory slots (workers.WorkerPool with
`worker_pieces`): a row depends on its shard's stream only, so the batches are the same for any number of workers.
"""
from __future__ import annotations

import dataclasses

import ml_collections
import numpy as np

from bert_jax.data_pipelines import shards as shards_lib
from bert_jax.data_pipelines.errors import DataError
from bert_jax.data_pipelines.span_corruption import (BUILDER, FEATURES, corrupt, example_rng, noise, pack,
                                                     random_spans_helper, random_spans_noise_mask)
from bert_jax.data_pipelines.workers import Prefetcher, WorkerPool, worker_count


@dataclasses.dataclass(frozen=True)
class Corruption:
  """What turns a chunk into an example: the lengths, the noise and the two special ids."""
  inputs_length: int
  targets_length: int
  density: float
  mean_span: float
  top_sentinel: int
  eos: int

  def example(self, chunk: np.ndarray, seeds: tuple, shard: int, counter: int) -> tuple[np.ndarray, np.ndarray]:
    mask = random_spans_noise_mask(len(chunk), self.density, self.mean_span, example_rng(seeds, shard, counter))
    return corrupt(chunk, mask, self.top_sentinel, self.eos)


class ShardRows:
  """One shard's packed rows; `state` is its stream's state before the first example no row holds yet."""

  def __init__(self, ctx: shards_lib.Context, shard: int, state: dict | None, corruption: Corruption):
    self.shard, self._ctx, self._corruption = shard, ctx, corruption
    self._stream = shards_lib.ShardStream(ctx, shard, state)
    self._items = iter(self._stream)
    self.state = self._stream.state
    self._pending = None  # an example read from the stream, not yet in a row

  def examples(self):
    """(inputs, targets) of the shard's examples in stream order (each consumed; for tests and `row`)."""
    while True:
      yield self._take()

  def _peek(self):
    if self._pending is None:
      row, counter = next(self._items)
      self._pending = self._corruption.example(row.ids, self._ctx.seeds, self.shard, counter)
    return self._pending

  def _take(self):
    example = self._peek()
    self._pending = None
    self.state = self._stream.state
    return example

  def row(self) -> dict:
    """The next packed row (FEATURES without the batch axis)."""
    c = self._corruption
    examples, used_in, used_tgt = [], 0, 0
    while True:
      inputs, targets = self._peek()
      if examples and (used_in + len(inputs) > c.inputs_length or used_tgt + len(targets) > c.targets_length):
        return pack(examples, c.inputs_length, c.targets_length)
      self._take()
      examples.append((inputs[:c.inputs_length], targets[:c.targets_length]))
      used_in, used_tgt = used_in + len(inputs), used_tgt + len(targets)


def _batches(ctx, shards, states: dict, rows_per_shard: int, corruption: Corruption):
  """(this host's rows of batch 0, 1, ... in shard order, the shards' states after them)."""
  streams = [ShardRows(ctx, s, states[s], corruption) for s in shards]
  while True:
    rows = [stream.row() for stream in streams for _ in range(rows_per_shard)]
    yield {k: np.stack([row[k] for row in rows]) for k in FEATURES}, {s.shard: s.state for s in streams}


class SpanCorruptionInput(shards_lib.ShardedInput):
  """Iterable of this host's packed rows of each global batch; `save`/`restore` its position; `close` its thread or
  worker processes."""

  def __init__(self, ctx: shards_lib.Context, shards: range, rows_per_shard: int, process_index: int,
               corruption: Corruption, num_workers: int = 0, context_args: dict | None = None):
    """context_args: what rebuilds ctx in a worker (picklable; see `worker_pieces`), with num_workers > 0."""
    super().__init__(ctx, shards, rows_per_shard, process_index, num_workers, context_args)
    self.corruption = corruption
    self.spec = FEATURES

  def shard_rows(self, shard: int) -> ShardRows:
    """A fresh reader of `shard` from this input's position (the tests read its examples one by one)."""
    return ShardRows(self._ctx, shard, self._states[shard], self.corruption)

  def _source(self):
    if self._stage is None and self._groups:
      self._stage = WorkerPool(self._context_args, self._groups, self._states, self._rows_per_shard,
                               make_pieces=worker_pieces)
    elif self._stage is None:
      states = dict(self._states)
      self._stage = Prefetcher(lambda: _batches(self._ctx, self._shards, states, self._rows_per_shard,
                                                self.corruption))
    return self._stage

  def _position(self) -> dict:
    return {"builder": BUILDER, "num_shards": self._ctx.num_shards, "rows_per_shard": self._rows_per_shard}

  def _check_position(self, path, state: dict) -> None:
    saved = (state.get("builder"), state.get("num_shards"), state.get("rows_per_shard"))
    if saved != (BUILDER, self._ctx.num_shards, self._rows_per_shard):
      raise DataError(f"{path}: not a {BUILDER} position of {self._ctx.num_shards} shards of "
                      f"{self._rows_per_shard} rows (it has {saved}); keep data.example_builder, "
                      "data.num_shards and the batch size to resume")

  def _missing(self, directory: str, missing: list[int]) -> str:
    return f"{directory}: no saved {BUILDER} position for shards {missing}"


def _context(data_cfg, split: str, tokens_length: int, max_position_embeddings, model_vocab_size):
  """The masked-LM pipeline's context, its builder cutting chunks of `tokens_length` tokens."""
  ctx = shards_lib.make_context(data_cfg, split, max_position_embeddings, model_vocab_size)
  if getattr(ctx.tokenizer, "kind", "") != "t5_spm":
    raise DataError(f"data.example_builder='{BUILDER}' needs T5's vocabulary with its sentinels: "
                    f"data.tokenizer='t5_spm' (it is {data_cfg.tokenizer!r})")
  if ctx.encoder is not None:
    raise DataError(f"data.example_builder='{BUILDER}' reads plain text: use data.masking other than 'knowledge'")
  ctx.builder = dataclasses.replace(ctx.builder, max_seq_length=tokens_length, packing=False)
  return ctx


def _setup(data_cfg, split: str, max_position_embeddings, model_vocab_size) -> tuple:
  """(context, Corruption) of `data_cfg`: built so in the main process and in every worker."""
  density, mean = noise(data_cfg)
  tokens_length, targets_length = random_spans_helper(data_cfg.max_seq_length, density, mean)
  ctx = _context(data_cfg, split, tokens_length, max_position_embeddings, model_vocab_size)
  return ctx, Corruption(data_cfg.max_seq_length, targets_length, density, mean, ctx.tokenizer.sentinel(0),
                         ctx.tokenizer.eos_id)


def worker_pieces(context_args: dict, shards: list, states: dict, rows_per_shard: int, first: int, slot_count: int):
  """A worker's pieces (workers.masked_pieces' contract): (key, rows of `shards`, their states, stats) per batch."""
  del first, slot_count  # no mask-rate schedule; rows are built one batch at a time
  data_cfg = ml_collections.ConfigDict(context_args["data_cfg"])
  ctx, corruption = _setup(data_cfg, **{k: v for k, v in context_args.items() if k != "data_cfg"})
  for key, (rows, shard_states) in enumerate(_batches(ctx, shards, states, rows_per_shard, corruption)):
    yield key, rows, shard_states, dict(ctx.stats)


def for_config(config, split: str, batch_size: int, process_index: int = 0, process_count: int = 1):
  """This host's share of the span-corruption stream of `config` (see the module docstring)."""
  data_cfg = config.data
  if data_cfg.format != "text":
    raise DataError(f"data.example_builder='{BUILDER}' reads text (data.corpus, prepared or tfds_name), not "
                    f"data.format={data_cfg.format!r}")
  workers = worker_count(data_cfg)
  shards_lib.check_layout(batch_size, process_index, process_count, data_cfg.num_shards)
  context_args = {"split": split, "max_position_embeddings": config.model.max_position_embeddings,
                  "model_vocab_size": config.model.vocab_size}
  ctx, corruption = _setup(data_cfg, **context_args)
  per_host = data_cfg.num_shards // process_count
  shards = range(process_index * per_host, (process_index + 1) * per_host)
  return SpanCorruptionInput(ctx, shards, batch_size // data_cfg.num_shards, process_index, corruption, workers,
                             {"data_cfg": data_cfg.to_dict(), **context_args})
