"""`bert-jax data prepare --config C --format bert_tfrecord`: a config's rows, built once, as the records of
google-research/bert's create_pretraining_data.py, so training reads them with no Python per example.

The rows are exactly the ones `data.format=text` would build in its first `--epochs` epochs (the same
shard streams, shards.py), masked by the config's masking as a static mask (the records' format has
one). Training on them with `data.format=bert_tfrecord` and dynamic masking puts the original tokens
back and masks afresh every epoch (bert_records.py); the rows themselves repeat every `--epochs`
epochs, as RoBERTa's dynamic masking over fixed rows. One file per virtual shard
(`part-SSSSS-of-NNNNN.tfrecord`); each is written beside as `.tmp` and renamed when complete, and
`metadata.json` (rows per file, the vocabulary's hash) is written last. With data.packing the records
carry one more feature, `document_ids` (int64[L]), that the original format lacks. `data prepare` writes
the hold-out's rows too, in `eval/` beside the training rows (`held_out_output`), where training looks
for its evaluation records.
"""
from __future__ import annotations

import itertools
import os

from ml_collections import ConfigDict

from bert_jax.data_pipelines import bert_records, embedded, prepare
from bert_jax.data_pipelines.errors import DataError
from bert_jax.data_pipelines.features import FEATURES, PACKING_FEATURES, Featurizer
from bert_jax.data_pipelines.shards import COUNTER_EPOCH_SHIFT, ShardStream, _stack, make_context
from bert_jax.data_pipelines.masking import predictions_per_seq
from bert_jax.data_pipelines.tftools import tf

_CHUNK = 256  # rows masked per TensorFlow call


def _example(t, row: dict) -> bytes:
  ints = lambda v: t.train.Feature(int64_list=t.train.Int64List(value=[int(x) for x in v]))  # noqa: E731
  feature = {name: ints(row[name]) for name in ("input_ids", "input_mask", "segment_ids", "masked_lm_positions",
                                                "masked_lm_ids", "document_ids") if name in row}
  feature["masked_lm_weights"] = t.train.Feature(float_list=t.train.FloatList(value=row["masked_lm_weights"]))
  feature["next_sentence_labels"] = ints([row["next_sentence_labels"]])
  # deterministic: the feature map in key order, the same bytes in every process (the default order is not)
  return t.train.Example(features=t.train.Features(feature=feature)).SerializeToString(deterministic=True)


def _shard_records(ctx, shard: int, epochs: int):
  """Shard `shard`'s rows of epochs 0..epochs-1, masked _CHUNK at a time, as serialized records."""
  spec = {**FEATURES, **(PACKING_FEATURES if "document_ids" in ctx.spec else {})}
  featurize, t = Featurizer(ctx.masking, ctx.seeds, spec, ctx.max_seq_length), tf()
  stream = itertools.takewhile(lambda row: row[1] >> COUNTER_EPOCH_SHIFT < epochs, ShardStream(ctx, shard))
  while pending := list(itertools.islice(stream, _CHUNK)):
    rows, counters = zip(*pending)
    batch = featurize(_stack(rows, counters, [shard] * len(rows), ctx.max_seq_length))
    for i in range(len(rows)):
      yield _example(t, {name: batch[name][i] for name in spec})


def write_shard(ctx, shard: int, epochs: int, out_path: str) -> int:
  """Writes shard `shard`'s rows of epochs 0..epochs-1 (through `out_path`.tmp); returns how many."""
  return prepare.write_records(out_path, _shard_records(ctx, shard, epochs))


def _write_shard(job) -> int:
  data_cfg, split, shard, epochs, out_path = job
  return write_shard(make_context(ConfigDict(data_cfg), split, None, None), shard, epochs, out_path)


def check_request(data_cfg, epochs: int) -> None:
  """What the records cannot hold, or a config that does not build rows from text, as one line."""
  if data_cfg.format != "text":
    raise DataError(f"data.format={data_cfg.format!r}: rows are prepared from text (data.corpus, prepared or "
                    "tfds_name), with data.format=text")
  if data_cfg.trigram_shuffle_rate > 0:
    raise DataError("the records have no place for StructBERT's shuffled trigrams (they are drawn at train time "
                    "from the rows of data.format=text); prepare rows without data.trigram_shuffle_rate")
  if data_cfg.masking_mode != "dynamic":
    raise DataError("prepare rows with data.masking_mode=dynamic: each epoch's rows get their own mask, as "
                    "create_pretraining_data.py's dupe_factor copies do; train with static or dynamic masking")
  if epochs < 1:
    raise DataError(f"--epochs={epochs}; write at least one epoch of rows")


def held_out_output(data_cfg, output_dir: str, split: str) -> str | None:
  """Where the hold-out's rows go beside a train split's (output_dir/eval): the eval records
  data.format=bert_tfrecord reads when data.eval_corpus is unset (bert_records.records_glob). None when
  the config holds nothing out (no data.eval_corpus, data.eval_fraction 0) or the split is eval already."""
  if split != "train" or not (data_cfg.eval_corpus or data_cfg.eval_fraction > 0):
    return None
  return os.path.join(output_dir, bert_records.EVAL_DIR)


def rows_metadata(data_cfg, split: str, epochs: int, counts: dict) -> dict:
  """metadata.json of the rows format; `counts`: rows per file name."""
  vocab_path = embedded.default_vocab(data_cfg)
  return {"format": "bert_tfrecord", "vocab": vocab_path, "vocab_sha256": prepare.vocab_fingerprint(vocab_path),
          "lower_case": data_cfg.lower_case, "split": split, "epochs": epochs, "rows": sum(counts.values()),
          "max_seq_length": data_cfg.max_seq_length, "max_predictions_per_seq": predictions_per_seq(data_cfg),
          "example_builder": data_cfg.example_builder, "masking": data_cfg.masking, "seed": data_cfg.seed,
          "rows_per_file": dict(sorted(counts.items()))}


def prepare_rows(config, output_dir: str, epochs: int = 1, split: str = "train", num_workers: int = 0,
                 overwrite: bool = False) -> dict:
  """Writes the config's rows of `epochs` epochs as create_pretraining_data.py records; returns the metadata."""
  data_cfg = config.data
  check_request(data_cfg, epochs)
  make_context(data_cfg, split, None, None)  # bad vocabulary, corpus or builder: fail before the workers
  prepare.claim_output(output_dir, overwrite)
  shards = data_cfg.num_shards
  jobs = [(data_cfg.to_dict(), split, s, epochs, os.path.join(output_dir, prepare.shard_name(s, shards)))
          for s in range(shards)]
  with prepare.discarding_on_failure(output_dir):
    results = prepare.run_jobs(_write_shard, jobs, num_workers, "shard", "prepare rows")
    counts = {os.path.basename(job[-1]): count for job, count in zip(jobs, results)}
  metadata = rows_metadata(data_cfg, split, epochs, counts)
  prepare.write_metadata(output_dir, metadata)
  return metadata
