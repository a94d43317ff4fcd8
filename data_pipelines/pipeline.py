"""The pretraining input: corpus -> documents -> shuffle blocks -> rows -> masked, padded batches.

Output contract (one dict per `next()`; B = global_batch_size // process_count rows, this host's
contiguous share of the global batch; T = data.max_seq_length; P = data.max_predictions_per_seq):
`features.FEATURES`, plus PACKING_FEATURES when `data.packing`, SPAN_FEATURES when `data.masking == "span"`,
TRIGRAM_FEATURES when `data.trigram_shuffle_rate > 0`, KNOWLEDGE_FEATURES when `data.masking == "knowledge"` and
ERNIE_FEATURES when `data.example_builder == "ernie"` (`features.feature_spec`).

Host-count independence: every virtual shard (shards.py) is a deterministic stream that contributes
`global_batch // num_shards` consecutive rows to each global batch; host h builds shards
[h * S/H, (h+1) * S/H) and concatenates them. So the global batch depends on the config (data.seed
among it) and the step only. Every row's mask is drawn from a key of (seeds, shard, mask counter),
fresh for every row ever produced (features.py, masking.py).

Rows are built in Python and masked and padded by TensorFlow ops on a whole batch at once: in this
process, rows on a prefetch thread and masking (which releases the GIL) on a second one, about one
core in all; or, with `data.num_workers` (-1: one per core this process may use), both in each worker
process for its shards, which scales with the cores (workers.py). Resume: positions (shards.py) are
saved as JSON and restored by re-reading one block; see `PretrainInput.save`.
"""
from __future__ import annotations

from bert_jax.data_pipelines import corpora, span_stream, xlnet_stream
from bert_jax.data_pipelines.errors import DataError
from bert_jax.data_pipelines.features import Featurizer, feature_spec
from bert_jax.data_pipelines.shards import (Context, ShardedInput, check_layout, check_model_fit, make_context,
                                            make_tokenizer, masking_config, seeds, shard_batches)
from bert_jax.data_pipelines.workers import Prefetcher, WorkerPool, worker_count

def _masked(rows, featurize):
  """(masked batch, states) from a row stage's (key, rows, states) batches."""
  while True:
    _, batch, states = rows.next()
    yield featurize(batch), states


class _RowThread:
  """The in-process row stage: shard batches on a prefetch thread."""

  def __init__(self, ctx, shards, states, rows_per_shard, first):
    self._prefetcher = Prefetcher(lambda: shard_batches(ctx, shards, states, rows_per_shard, first))
    self.stats = []

  def next(self):
    return self._prefetcher.next()

  def close(self):
    self._prefetcher.close()


class _RowWorkers:
  """Rows and their masks in worker processes: `next()` gives (masked batch, states)."""

  def __init__(self, context_args, groups, states, rows_per_shard, first):
    self._pool = WorkerPool(context_args, groups, states, rows_per_shard, first)

  @property
  def stats(self):
    return self._pool.stats

  def next(self):
    return self._pool.next()

  def close(self):
    self._pool.close()


class PretrainInput(ShardedInput):
  """Iterable of this host's rows of each global batch; `save`/`restore` its position; `close` its threads."""

  def __init__(self, ctx: Context, shards: range, rows_per_shard: int, process_index: int,
               num_workers: int, context_args: dict):
    super().__init__(ctx, shards, rows_per_shard, process_index, num_workers, context_args)
    self._step = 0  # batches consumed: the run's step of the next one (data.mask_rate_schedule), saved with the states
    self._featurize = Featurizer(ctx.masking, ctx.seeds, ctx.spec, ctx.max_seq_length)
    self._masker = None  # the stage is the rows' (a thread, or worker processes that mask their own)

  @property
  def spec(self) -> dict:
    return self._ctx.spec

  def _source(self):
    if self._stage is None:
      if self._groups:
        self._stage = _RowWorkers(self._context_args, self._groups, self._states, self._rows_per_shard, self._step)
      else:
        self._stage = _RowThread(self._ctx, self._shards, self._states, self._rows_per_shard, self._step)
        self._masker = Prefetcher(lambda: _masked(self._stage, self._featurize))
    return self._masker or self._stage  # workers mask their own rows

  def __next__(self) -> dict:
    batch = super().__next__()
    self._step += 1
    return batch

  def close(self) -> None:
    if self._masker is not None:
      self._masker.close()
      self._masker = None
    super().close()

  def _position(self) -> dict:
    return {"num_shards": self._ctx.num_shards, "rows_per_shard": self._rows_per_shard, "step": self._step}

  def _check_position(self, path, state: dict) -> None:
    if (state["num_shards"], state["rows_per_shard"]) != (self._ctx.num_shards, self._rows_per_shard):
      raise DataError(f"{path}: saved with num_shards={state['num_shards']} and "
                      f"{state['rows_per_shard']} rows per shard; this run has {self._ctx.num_shards} "
                      f"and {self._rows_per_shard}; keep data.num_shards and the batch size to resume")

  def _missing(self, directory: str, missing: list[int]) -> str:
    return (f"{directory}: no saved input position for shards {missing}; "
            "was the checkpoint written by a run with the same data config?")

  def restore(self, directory: str) -> None:
    # every process's step is the same; a position saved before the field: 0
    self._step = super().restore(directory).get("step", 0)


def make_pretrain_input(data_cfg, *, global_batch_size: int, process_index: int, process_count: int,
                        split: str = "train", max_position_embeddings: int | None = None,
                        model_vocab_size: int | None = None) -> PretrainInput:
  """This host's share of the pretraining (or held-out eval) stream; see the module docstring."""
  if split not in ("train", "eval"):
    raise DataError(f"split={split!r}; use 'train' or 'eval'")
  num_shards = data_cfg.num_shards
  check_layout(global_batch_size, process_index, process_count, num_shards)
  workers = worker_count(data_cfg)
  per_host = num_shards // process_count
  shards = range(process_index * per_host, (process_index + 1) * per_host)
  if data_cfg.format == "bert_tfrecord":
    return _record_input(data_cfg, split, shards, global_batch_size // num_shards, process_index,
                         max_position_embeddings, model_vocab_size)
  if data_cfg.service_address:
    raise DataError("data.service_address sends a tf.data graph to the service, and data.format=text builds rows "
                    "in Python: write the rows with `bert-jax data prepare --format bert_tfrecord --config C` and "
                    "train with data.format=bert_tfrecord")
  if data_cfg.format != "text":
    raise DataError(f"data.format={data_cfg.format!r}; use 'text' (data.corpus, prepared or tfds_name) or "
                    "'bert_tfrecord' (create_pretraining_data.py records in data.corpus)")
  context_args = {"split": split, "max_position_embeddings": max_position_embeddings,
                  "model_vocab_size": model_vocab_size}
  ctx = make_context(data_cfg, **context_args)
  return PretrainInput(ctx, shards, global_batch_size // num_shards, process_index, workers,
                       {"data_cfg": data_cfg.to_dict(), **context_args})


def _record_input(data_cfg, split, shards, rows_per_shard, process_index, max_position_embeddings,
                  model_vocab_size):
  """The bert_tfrecord input (bert_records.py), checked against the config before it starts."""
  from bert_jax.data_pipelines import bert_records  # pylint: disable=import-outside-toplevel
  tokenizer = make_tokenizer(data_cfg)
  check_model_fit(data_cfg, tokenizer, max_position_embeddings, model_vocab_size)
  static = data_cfg.masking_mode == "static"
  masking = masking_config(data_cfg, tokenizer)
  if data_cfg.masking == "knowledge":
    raise DataError("data.format=bert_tfrecord records keep no phrase or entity spans: train knowledge masking "
                    "with data.format=text (data.corpus, or data.prepared from `bert-jax data prepare --knowledge`); "
                    "records prepared with it train on their own masks with data.masking_mode=static and "
                    "data.masking=whole_word")
  if static and data_cfg.masking == "span":
    raise DataError("data.masking_mode=static trains on the records' masks, which have no spans; "
                    "use data.masking_mode=dynamic for span masking")
  if data_cfg.trigram_shuffle_rate > 0:
    raise DataError("data.format=bert_tfrecord reads the records' features, without shuffled trigrams; "
                    "use data.format=text for data.trigram_shuffle_rate > 0 (StructBERT)")
  files = bert_records.list_record_files(data_cfg, split)
  bert_records.check_files(files, data_cfg.max_seq_length, masking.max_predictions, tokenizer.vocab_size,
                           data_cfg.packing)
  bert_records.check_shards(files, data_cfg.num_shards, shards)
  ctx = Context(bert_records.records_glob(data_cfg, split), True, tokenizer, None, masking,
                feature_spec(data_cfg), seeds(data_cfg, split), data_cfg.num_shards, None, 0,
                data_cfg.max_seq_length, corpora.Stats(), data_cfg.dupe_factor if static else None)
  return bert_records.RecordInput(files, ctx, shards, rows_per_shard, process_index, data_cfg.service_address)


# Builders whose rows are not the masked-LM contract's, each with its own input: XLNet's parallel streams, T5's
# corrupted spans.
_OWN_INPUTS = {"xlnet_stream": xlnet_stream.for_config, span_stream.BUILDER: span_stream.for_config}


def for_config(config, split: str, batch_size: int, process_index: int = 0, process_count: int = 1):
  """The input a pretraining run of `config` reads: the trainer and `data preview` both build it here."""
  if config.data.example_builder in _OWN_INPUTS:
    return _OWN_INPUTS[config.data.example_builder](config, split, batch_size, process_index, process_count)
  return make_pretrain_input(config.data, global_batch_size=batch_size, process_index=process_index,
                             process_count=process_count, split=split,
                             max_position_embeddings=config.model.max_position_embeddings,
                             model_vocab_size=config.model.vocab_size)
