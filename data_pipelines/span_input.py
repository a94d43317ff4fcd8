"""The span-corruption pretraining input (data.example_builder="span_corruption"): span_corruption.py's examples
of the split's text, packed into rows, as an iterable with a resumable position (see span_corruption.py)."""
from __future__ import annotations

import numpy as np

from bert_jax.data_pipelines import shards
from bert_jax.data_pipelines.errors import DataError
from bert_jax.data_pipelines.span_corruption import (BUILDER, FEATURES, corrupt, noise, pack, random_spans_helper,
                                                     random_spans_noise_mask)


def read_tokens(data_cfg, split: str, max_position_embeddings, model_vocab_size):
  """(tokenizer, every token of the split's documents in the pipeline's order, concatenated)."""
  one = data_cfg.copy_and_resolve_references()
  with one.unlocked():
    one.example_builder, one.num_shards, one.packing = "full_sentences", 1, False
  ctx = shards.make_context(one, split, max_position_embeddings, model_vocab_size)
  if getattr(ctx.tokenizer, "kind", "") != "t5_spm":
    raise DataError(f"data.example_builder='{BUILDER}' needs T5's vocabulary with its sentinels: "
                    f"data.tokenizer='t5_spm' (it is {data_cfg.tokenizer!r})")
  stream = shards.ShardStream(ctx, 0)
  cursor, pieces = [0, 0, 0, 0], []
  while cursor[0] == 0:
    docs, cursor = stream.read_block(cursor)
    for doc in docs:
      pieces += [np.asarray(s if ctx.tokenized else ctx.tokenizer.encode(s), np.int32) for s in doc]
  tokens = np.concatenate(pieces) if pieces else np.zeros(0, np.int32)
  return ctx.tokenizer, tokens


class SpanCorruptionInput:
  """Iterable of this host's packed rows of each global batch; `save`/`restore` the stream position."""

  def __init__(self, data_cfg, split: str, batch_size: int, process_index: int = 0, process_count: int = 1,
               max_position_embeddings=None, model_vocab_size=None):
    if batch_size % process_count:
      raise DataError(f"{BUILDER}: the batch of {batch_size} rows must split over {process_count} processes")
    self.inputs_length = data_cfg.max_seq_length
    self._density, self._mean = noise(data_cfg)
    self.tokens_length, self.targets_length = random_spans_helper(self.inputs_length, self._density, self._mean)
    self.tokenizer, tokens = read_tokens(data_cfg, split, max_position_embeddings, model_vocab_size)
    self._chunks = [tokens[i:i + self.tokens_length] for i in range(0, len(tokens), self.tokens_length)]
    if not self._chunks:
      raise DataError(f"{BUILDER}: the {split} split has no text")
    self._top, self._eos = self.tokenizer.sentinel(0), self.tokenizer.eos_id
    self._seeds = shards.seeds(data_cfg, split)
    per_host = batch_size // process_count
    self._rows = slice(process_index * per_host, (process_index + 1) * per_host)
    self._process_index, self._batch_size = process_index, batch_size
    self.position = 0  # the next example of the stream
    self._perms: dict[int, np.ndarray] = {}
    self.stats, self.spec = {}, FEATURES

  def example(self, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Example k of the stream: its epoch's k-th chunk, corrupted with k's own noise mask."""
    n = len(self._chunks)
    epoch = k // n
    if epoch not in self._perms:
      self._perms = {epoch: np.random.default_rng([*self._seeds, 0, epoch]).permutation(n)}
    chunk = self._chunks[self._perms[epoch][k % n]]
    mask = random_spans_noise_mask(len(chunk), self._density, self._mean,
                                   np.random.default_rng([*self._seeds, 1, k]))
    return corrupt(chunk, mask, self._top, self._eos)

  def _row(self) -> dict:
    examples, used_in, used_tgt = [], 0, 0
    while True:
      inputs, targets = self.example(self.position)
      if examples and (used_in + len(inputs) > self.inputs_length or used_tgt + len(targets) > self.targets_length):
        return pack(examples, self.inputs_length, self.targets_length)
      examples.append((inputs[:self.inputs_length], targets[:self.targets_length]))
      used_in, used_tgt = used_in + len(inputs), used_tgt + len(targets)
      self.position += 1

  def __iter__(self):
    return self

  def __next__(self) -> dict:
    rows = [self._row() for _ in range(self._batch_size)][self._rows]
    return {k: np.stack([row[k] for row in rows]) for k in FEATURES}

  def save(self, directory: str) -> None:
    shards.write_state(directory, self._process_index,
                       {"builder": BUILDER, "batch_size": self._batch_size, "position": self.position})

  def restore(self, directory: str) -> None:
    found = set()
    for path, state in shards.read_states(directory):
      if state.get("builder") != BUILDER or state["batch_size"] != self._batch_size:
        raise DataError(f"{path}: not a {BUILDER} position of a batch of {self._batch_size} rows; keep "
                        "data.example_builder and the batch size to resume")
      found.add(state["position"])
    if len(found) != 1:
      raise DataError(f"{directory}: no single saved {BUILDER} position (found {sorted(found)})")
    self.position = found.pop()

  def close(self) -> None:
    """Nothing runs in the background."""


def for_config(config, split: str, batch_size: int, process_index: int = 0, process_count: int = 1):
  if config.data.format != "text":
    raise DataError(f"data.example_builder='{BUILDER}' reads text (data.corpus, prepared or tfds_name), not "
                    f"data.format={config.data.format!r}")
  return SpanCorruptionInput(config.data, split, batch_size, process_index, process_count,
                             config.model.max_position_embeddings, config.model.vocab_size)
