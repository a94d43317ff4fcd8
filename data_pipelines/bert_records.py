"""`data.format=bert_tfrecord`: the records of google-research/bert's create_pretraining_data.py (MLPerf's BERT
data), as a tf.data pipeline with no Python per example.

A record holds `input_ids`, `input_mask`, `segment_ids` (int64[L]), `masked_lm_positions`,
`masked_lm_ids` (int64[Lp]), `masked_lm_weights` (float[Lp]) and `next_sentence_labels` (int64[1]).
Records shorter than data.max_seq_length (or with fewer prediction slots) are padded; longer ones are
an error. `data.masking_mode=static` trains on the records' own masks; dynamic masking puts
`masked_lm_ids` back at their positions and masks afresh (masking.py), keyed by (seeds, shard, epoch,
record index in the epoch), so MLPerf's data gets fresh masks every epoch.

Shards: with at least `data.num_shards` files, shard s reads files s::num_shards; otherwise every shard
reads all files and keeps records i % num_shards == s. Each epoch reads a shard's files in an order
drawn from (seeds, shard, epoch) (the records are shuffled when written). A shard's position is
(epoch, records taken in the epoch); resuming skips that many records without parsing them.
"""
from __future__ import annotations

import numpy as np

from bert_jax.data_pipelines import corpora
from bert_jax.data_pipelines.errors import DataError
from bert_jax.data_pipelines.masking import mask_batch, row_keys
from bert_jax.data_pipelines.shards import COUNTER_EPOCH_SHIFT, read_states, write_state
from bert_jax.data_pipelines.tftools import tf

RECORD_FEATURES = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids",
                   "masked_lm_weights", "next_sentence_labels")


def _parse_spec():
  t = tf()
  spec = {name: t.io.VarLenFeature(t.int64) for name in RECORD_FEATURES}
  spec["masked_lm_weights"] = t.io.VarLenFeature(t.float32)
  return spec


def check_files(files: list[str], max_seq_length: int, max_predictions: int, vocab_size: int) -> None:
  """The first record of every file: all features there, lengths within the config, ids within the vocab."""
  t = tf()
  for path in files:
    try:
      payload = next(iter(t.data.TFRecordDataset(path).take(1)), None)
    except (t.errors.DataLossError, t.errors.InvalidArgumentError) as e:
      raise DataError(f"{path}: not a readable TFRecord file ({e.message.splitlines()[0]})") from None
    if payload is None:
      raise DataError(f"{path}: no records; remove it from data.corpus")
    features = t.train.Example.FromString(payload.numpy()).features.feature
    missing = [name for name in RECORD_FEATURES if name not in features]
    if missing:
      raise DataError(f"{path}: records lack {', '.join(missing)}; data.format=bert_tfrecord reads the "
                      "records of create_pretraining_data.py")
    length, slots = len(features["input_ids"].int64_list.value), len(features["masked_lm_ids"].int64_list.value)
    if length > max_seq_length or slots > max_predictions:
      raise DataError(f"{path}: records of length {length} with {slots} predictions exceed "
                      f"data.max_seq_length={max_seq_length} / max_predictions_per_seq={max_predictions}; "
                      "raise them to the records' values")
    top = max(features["input_ids"].int64_list.value, default=0)
    if top >= vocab_size:
      raise DataError(f"{path}: token id {top} is outside the vocabulary ({vocab_size} entries); "
                      "set data.vocab to the vocab.txt the records were made with")


class RecordInput:
  """This host's rows of each global batch from bert_tfrecord files; the PretrainInput interface."""

  def __init__(self, files, ctx, shards: range, rows_per_shard: int, process_index: int):
    self._files, self._ctx, self.tokenizer = files, ctx, ctx.tokenizer
    self._shards, self._rows_per_shard, self._process_index = shards, rows_per_shard, process_index
    self._states = {s: [0, 0] for s in shards}  # (epoch, records taken in the epoch)
    self._iterator = None

  @property
  def spec(self) -> dict:
    return self._ctx.spec

  @property
  def stats(self) -> dict:
    return {}

  def _shard_dataset(self, shard: int, epoch: int, taken: int):
    t, ctx = tf(), self._ctx
    by_file = len(self._files) >= ctx.num_shards
    files = t.constant(self._files[shard::ctx.num_shards] if by_file else self._files)
    seed = int(row_keys(ctx.seeds, [shard], [0]).numpy()[0])

    def epoch_records(e):
      order = t.random.experimental.stateless_shuffle(files, seed=t.stack([t.constant(seed, t.int64), e]))
      records = t.data.Dataset.from_tensor_slices(order).flat_map(
          lambda f: t.data.TFRecordDataset(f).map(lambda r: (f, r)))
      if not by_file:
        records = records.shard(ctx.num_shards, shard)
      return records.enumerate().map(lambda i, fr: (e, i, fr[0], fr[1]))

    return t.data.Dataset.range(epoch, 2 ** 62).flat_map(epoch_records).skip(taken)

  def _rows(self, epoch, index, path, payload):
    """One record -> padded row fields; asserts name the file."""
    t, ctx = tf(), self._ctx
    width, slots = ctx.max_seq_length, ctx.masking.max_predictions
    parsed = {k: t.sparse.to_dense(v) for k, v in t.io.parse_single_example(payload, _parse_spec()).items()}
    length = t.size(parsed["input_ids"])
    checks = [t.debugging.Assert(ok, [path, message]) for ok, message in (
        (length <= width, "a record is longer than data.max_seq_length"),
        (t.size(parsed["masked_lm_ids"]) <= slots, "a record has more predictions than data.max_predictions_per_seq"),
        (t.reduce_max(parsed["input_ids"]) < ctx.tokenizer.vocab_size, "a token id is outside the vocabulary"))]
    with t.control_dependencies(checks):
      pad = lambda v, n: t.ensure_shape(t.pad(t.cast(v, t.int32), [[0, n - t.size(v)]]), [n])  # noqa: E731
      return {"input_ids": pad(parsed["input_ids"], width), "length": t.cast(t.reduce_sum(parsed["input_mask"]), t.int32),
              "segment_ids": pad(parsed["segment_ids"], width),
              "label": t.cast(parsed["next_sentence_labels"][0], t.int32),
              "masked_lm_positions": pad(parsed["masked_lm_positions"], slots),
              "masked_lm_ids": pad(parsed["masked_lm_ids"], slots),
              "masked_lm_weights": t.ensure_shape(t.pad(parsed["masked_lm_weights"],
                                                         [[0, slots - t.size(parsed["masked_lm_weights"])]]), [slots]),
              "epoch": epoch, "index": index}

  def _features(self, rows, shard_of_row):
    """A host batch of record rows -> the contract's features (static: the records' masks)."""
    t, ctx = tf(), self._ctx
    width = ctx.max_seq_length
    real = t.range(width)[None] < rows["length"][:, None]
    out = {"input_mask": t.cast(real, t.int32), "segment_ids": rows["segment_ids"],
           "next_sentence_labels": rows["label"]}
    if ctx.dupe_factor:
      out.update({k: rows[k] for k in ("input_ids", "masked_lm_positions", "masked_lm_ids", "masked_lm_weights")})
    else:
      weights = rows["masked_lm_weights"] > 0
      batch = t.broadcast_to(t.range(t.shape(weights)[0])[:, None], t.shape(weights))
      where = t.stack([batch, rows["masked_lm_positions"]], -1)[weights]
      original = t.tensor_scatter_nd_update(rows["input_ids"], where, rows["masked_lm_ids"][weights])
      counter = t.bitwise.left_shift(rows["epoch"], COUNTER_EPOCH_SHIFT) + rows["index"]
      out.update(mask_batch(original, rows["length"], row_keys(ctx.seeds, shard_of_row, counter), ctx.masking))
    state = {"epoch": rows["epoch"], "index": rows["index"]}
    return {name: out[name] for name in ctx.spec}, state

  def _dataset(self):
    t = tf()
    per_shard = [self._shard_dataset(s, *self._states[s]).map(self._rows, num_parallel_calls=t.data.AUTOTUNE)
                 .batch(self._rows_per_shard) for s in self._shards]
    shard_of_row = t.constant(np.repeat(np.array(self._shards), self._rows_per_shard), t.int64)
    joined = t.data.Dataset.zip(tuple(per_shard)).map(
        lambda *parts: {k: t.concat([p[k] for p in parts], 0) for k in parts[0]})
    return joined.map(lambda rows: self._features(rows, shard_of_row),
                      num_parallel_calls=t.data.AUTOTUNE).prefetch(2)

  def __iter__(self):
    return self

  def __next__(self) -> dict:
    t = tf()
    if self._iterator is None:
      self._iterator = iter(self._dataset())
    try:
      batch, state = next(self._iterator)
    except (t.errors.InvalidArgumentError, t.errors.DataLossError) as e:
      raise DataError(f"data.corpus ({self._ctx.source}): {e.message.splitlines()[0]}") from None
    epochs, indices = state["epoch"].numpy(), state["index"].numpy()
    for i, s in enumerate(self._shards):
      last = (i + 1) * self._rows_per_shard - 1
      self._states[s] = [int(epochs[last]), int(indices[last]) + 1]
    return {k: v.numpy() for k, v in batch.items()}

  def close(self) -> None:
    self._iterator = None

  def save(self, directory: str) -> None:
    write_state(directory, self._process_index,
                {"num_shards": self._ctx.num_shards, "rows_per_shard": self._rows_per_shard,
                 "records": {str(s): self._states[s] for s in self._shards}})

  def restore(self, directory: str) -> None:
    found = {}
    for path, state in read_states(directory):
      if (state["num_shards"], state["rows_per_shard"]) != (self._ctx.num_shards, self._rows_per_shard) or \
          "records" not in state:
        raise DataError(f"{path}: saved by another data config (num_shards, batch size or data.format); "
                        "keep them to resume")
      found.update({int(k): v for k, v in state["records"].items()})
    missing = [s for s in self._shards if s not in found]
    if missing:
      raise DataError(f"{directory}: no saved input position for shards {missing}")
    self.close()
    self._states = {s: found[s] for s in self._shards}


def list_record_files(data_cfg, split: str) -> list[str]:
  if split == "eval":
    if not data_cfg.eval_corpus:
      raise DataError("data.format=bert_tfrecord has no hold-out: set data.eval_corpus to a glob of eval "
                      "records, or train.eval_every_steps=0")
    return corpora.list_files(data_cfg.eval_corpus, "data.eval_corpus")
  return corpora.list_files(data_cfg.corpus, "data.corpus")
