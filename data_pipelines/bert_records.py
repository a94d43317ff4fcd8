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

import collections
import posixpath
import socket
import uuid

import numpy as np

from bert_jax.data_pipelines import corpora
from bert_jax.data_pipelines.errors import DataError
from bert_jax.data_pipelines.features import position_ids
from bert_jax.data_pipelines.masking import mask_batch, row_keys
from bert_jax.data_pipelines.shards import COUNTER_EPOCH_SHIFT, read_states, write_state
from bert_jax.data_pipelines.tftools import tf

EVAL_DIR = "eval"  # the hold-out's records, in a folder beside the training records (records_glob)
RECORD_FEATURES = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids",
                   "masked_lm_weights", "next_sentence_labels")


def _parse_spec(packed: bool):
  t = tf()
  spec = {name: t.io.VarLenFeature(t.int64) for name in RECORD_FEATURES + (("document_ids",) if packed else ())}
  spec["masked_lm_weights"] = t.io.VarLenFeature(t.float32)
  return spec


def check_files(files: list[str], max_seq_length: int, max_predictions: int, vocab_size: int,
                packed: bool = False) -> None:
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
    if packed and not missing and "document_ids" not in features:
      raise DataError(f"{path}: records lack document_ids, which data.packing needs; write packed rows with "
                      "`bert-jax data prepare --format bert_tfrecord --config C --config.data.packing=True`")
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


def check_shards(files: list[str], num_shards: int, shards: range) -> None:
  """Fewer files than shards: records are dealt to the shards one by one, so a shard is empty when there
  are no more records than its number (counted up to num_shards, cheap at any corpus size)."""
  if len(files) >= num_shards:
    return  # a shard per file at least, and check_files found a record in every file
  count = int(tf().data.TFRecordDataset(files).take(num_shards).reduce(0, lambda n, _: n + 1))
  if count <= shards[-1]:
    raise DataError(f"{files[0]}{' and others' if len(files) > 1 else ''}: {count} records for "
                    f"data.num_shards={num_shards}, so this host's shards {shards[0]}..{shards[-1]} get "
                    f"{'none' if count <= shards[0] else 'not all'}; lower data.num_shards to at most {count}")


class RecordInput:
  """This host's rows of each global batch from bert_tfrecord files; the PretrainInput interface."""

  def __init__(self, files, ctx, shards: range, rows_per_shard: int, process_index: int, service: str = ""):
    self._files, self._ctx, self.tokenizer, self._service = files, ctx, ctx.tokenizer, service
    self._shards, self._rows_per_shard, self._process_index = shards, rows_per_shard, process_index
    self._states = {s: [0, 0] for s in shards}  # (epoch, records taken in the epoch)
    self._iterator = self._pending = None
    self._file_order_seeds = [int(k) for k in row_keys(ctx.seeds, list(shards), [0] * len(shards)).numpy()]

  @property
  def spec(self) -> dict:
    return self._ctx.spec

  @property
  def stats(self) -> dict:
    return {}

  def _shard_dataset(self, i):
    """Host shard number `i` (a tensor: the service's workers pick shards by it) from its saved position:
    its masked batches of rows_per_shard rows, each tagged with `i` and the rows' (epoch, index)."""
    t, ctx, shards = tf(), self._ctx, list(self._shards)
    by_file = len(self._files) >= ctx.num_shards
    files = t.ragged.constant([self._files[s::ctx.num_shards] if by_file else self._files for s in shards])[i]
    seed = t.constant(self._file_order_seeds, t.int64)[i]
    shard = t.constant(shards, t.int64)[i]
    epoch, taken = (t.constant([self._states[s][k] for s in shards], t.int64)[i] for k in (0, 1))

    def epoch_records(e):
      order = t.random.experimental.stateless_shuffle(files, seed=t.stack([seed, e]))
      records = t.data.Dataset.from_tensor_slices(order).flat_map(
          lambda f: t.data.TFRecordDataset(f).map(lambda r: (f, r)))
      if not by_file:
        records = records.shard(ctx.num_shards, shard)
      return records.enumerate().map(lambda j, fr: (e, j, fr[0], fr[1]))

    rows = t.data.Dataset.range(epoch, 2 ** 62).flat_map(epoch_records).skip(taken)
    plain = t.autograph.experimental.do_not_convert  # as features.py's featurize: Python branches only
    rows = rows.batch(self._rows_per_shard, drop_remainder=True).map(plain(self._rows),
                                                                     num_parallel_calls=t.data.AUTOTUNE)
    return rows.map(plain(lambda r: {**self._features(r, t.fill([self._rows_per_shard], shard)), "shard_pos": i}),
                    num_parallel_calls=t.data.AUTOTUNE)

  def _rows(self, epoch, index, path, payload):
    """A batch of records -> padded row fields (parsed together: one op per batch, not per record); asserts
    name the files."""
    t, ctx = tf(), self._ctx
    width, slots = ctx.max_seq_length, ctx.masking.max_predictions
    parsed = t.io.parse_example(payload, _parse_spec("document_ids" in ctx.spec))
    n = t.shape(payload, out_type=t.int64)[0]
    checks = [t.debugging.Assert(ok, [path, message], summarize=4) for ok, message in (
        (parsed["input_ids"].dense_shape[1] <= width, "a record is longer than data.max_seq_length"),
        (parsed["masked_lm_ids"].dense_shape[1] <= slots,
         "a record has more predictions than data.max_predictions_per_seq"),
        (t.reduce_max(parsed["input_ids"].values) < ctx.tokenizer.vocab_size, "a token id is outside the vocabulary"))]
    with t.control_dependencies(checks):
      size = lambda k: slots if k.startswith("masked_lm") else width  # noqa: E731
      dense = {k: t.ensure_shape(t.sparse.to_dense(t.sparse.reset_shape(v, [n, size(k)])), [None, size(k)])
               for k, v in parsed.items() if k != "next_sentence_labels"}
      ints = lambda k: t.cast(dense[k], t.int32)  # noqa: E731
      return {"input_ids": ints("input_ids"), "length": t.reduce_sum(ints("input_mask"), 1),
              "segment_ids": ints("segment_ids"),
              "label": t.cast(t.sparse.to_dense(parsed["next_sentence_labels"])[:, 0], t.int32),
              "masked_lm_positions": ints("masked_lm_positions"), "masked_lm_ids": ints("masked_lm_ids"),
              "masked_lm_weights": dense["masked_lm_weights"], "epoch": epoch, "index": index,
              **({"document_ids": ints("document_ids")} if "document_ids" in dense else {})}

  def _features(self, rows, shard_of_row):
    """A batch of record rows -> the contract's features (static: the records' masks), and the rows' positions."""
    t, ctx = tf(), self._ctx
    width = ctx.max_seq_length
    real = t.range(width)[None] < rows["length"][:, None]
    out = {"input_mask": t.cast(real, t.int32), "segment_ids": rows["segment_ids"],
           "next_sentence_labels": rows["label"]}
    if "document_ids" in rows:
      out.update(document_ids=rows["document_ids"], position_ids=position_ids(rows["document_ids"]))
    if ctx.dupe_factor:
      out.update({k: rows[k] for k in ("input_ids", "masked_lm_positions", "masked_lm_ids", "masked_lm_weights")})
    else:
      weights = rows["masked_lm_weights"] > 0
      batch = t.broadcast_to(t.range(t.shape(weights)[0])[:, None], t.shape(weights))
      where = t.stack([batch, rows["masked_lm_positions"]], -1)[weights]
      original = t.tensor_scatter_nd_update(rows["input_ids"], where, rows["masked_lm_ids"][weights])
      counter = t.bitwise.left_shift(rows["epoch"], COUNTER_EPOCH_SHIFT) + rows["index"]
      out.update(mask_batch(original, rows["length"], row_keys(ctx.seeds, shard_of_row, counter), ctx.masking))
    return {**{name: out[name] for name in ctx.spec}, "epoch": rows["epoch"], "index": rows["index"]}

  def _dataset(self):
    """In-process: the host's shards interleaved in order, one batch of each per host batch. With
    data.service_address the same per-shard batches come from the service's workers (each owns shards
    i::num_workers) and `__next__` puts them back in shard order."""
    t, k = tf(), len(self._shards)
    shards = t.data.Dataset.range(k)
    if self._service:
      shards = shards.shard(t.data.experimental.SHARD_HINT, t.data.experimental.SHARD_HINT)
    shard_dataset = t.autograph.experimental.do_not_convert(self._shard_dataset)
    batches = shards.interleave(shard_dataset, cycle_length=k, block_length=1,
                                num_parallel_calls=t.data.AUTOTUNE, deterministic=True)
    if self._service:
      return batches.apply(t.data.experimental.service.distribute(
          processing_mode=t.data.experimental.service.ShardingPolicy.HINT, service=self._service,
          job_name=f"bert_jax-{uuid.uuid4().hex}"))
    return batches.prefetch(2 * k)

  def _next_shard_batches(self) -> list[dict]:
    """One batch of every host shard, in shard order (numpy)."""
    while not all(self._pending):
      part = {name: value.numpy() for name, value in next(self._iterator).items()}
      self._pending[int(part.pop("shard_pos"))].append(part)
    return [queue.popleft() for queue in self._pending]

  def __iter__(self):
    return self

  def __next__(self) -> dict:
    t = tf()
    if self._iterator is None:
      if self._service:
        check_service(self._service)
      self._iterator = iter(self._dataset())
      self._pending = [collections.deque() for _ in self._shards]
    try:
      parts = self._next_shard_batches()
    except t.errors.DataLossError as e:
      raise self._data_loss(e) from None
    except t.errors.InvalidArgumentError as e:
      raise DataError(f"data.corpus ({self._ctx.source}): {e.message.splitlines()[0]}") from None
    for s, part in zip(self._shards, parts):
      self._states[s] = [int(part["epoch"][-1]), int(part["index"][-1]) + 1]
    return {name: np.concatenate([p[name] for p in parts]) for name in self._ctx.spec}

  def _data_loss(self, error) -> DataError:
    """TensorFlow names the byte, not the file: the file is found by walking the records' lengths."""
    cut = next(filter(None, map(corpora.find_truncation, self._files)), None)
    if cut is None:
      return DataError(f"data.corpus ({self._ctx.source}): {error.message.splitlines()[0]}")
    return DataError(f"{cut.describe()}; the run stops here (the checkpoints it saved are intact): write the file "
                     "again (`bert-jax data prepare --format bert_tfrecord`) or leave it out of data.corpus, and "
                     "rerun to resume")

  def close(self) -> None:
    self._iterator = self._pending = None

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


def records_glob(data_cfg, split: str) -> str:
  """The glob(s) of a split's records: data.corpus; for eval, data.eval_corpus, else the EVAL_DIR folder
  beside each data.corpus glob (where `bert-jax data prepare --format bert_tfrecord` writes the hold-out)."""
  if split != "eval":
    return data_cfg.corpus
  if data_cfg.eval_corpus:
    return data_cfg.eval_corpus
  return ",".join(posixpath.join(posixpath.dirname(p.strip()), EVAL_DIR, posixpath.basename(p.strip()))
                  for p in data_cfg.corpus.split(",") if p.strip())


def list_record_files(data_cfg, split: str) -> list[str]:
  """The split's record files; an eval split found beside data.corpus is announced (once per input)."""
  pattern = records_glob(data_cfg, split)
  if split != "eval" or data_cfg.eval_corpus:
    return corpora.list_files(pattern, "data.eval_corpus" if split == "eval" else "data.corpus")
  try:
    files = corpora.list_files(pattern, "data.eval_corpus")
  except DataError:
    raise DataError(f"data.format=bert_tfrecord has no hold-out: no records match {pattern!r}, where `bert-jax "
                    "data prepare --format bert_tfrecord` writes them; set data.eval_corpus to a glob of eval "
                    "records, or train.eval_every_steps=0") from None
  print(f"evaluating on the hold-out records beside data.corpus: {pattern} (data.eval_corpus is unset)", flush=True)
  return files


def check_service(address: str) -> None:
  """One line when no dispatcher answers at `address` (the service's client would retry for minutes)."""
  host, _, port = address.split("://", 1)[-1].rpartition(":")
  try:
    socket.create_connection((host or "localhost", int(port)), timeout=10).close()
  except (OSError, ValueError) as e:
    raise DataError(f"data.service_address={address!r}: no tf.data service dispatcher answers there ({e}); "
                    "start one with launch/tfdata_service.sh, or set data.service_address='' to build the "
                    "input in this process") from None
