"""`bert-jax data prepare --config C --format bert_tfrecord`: a config's rows, built once, as the records of
google-research/bert's create_pretraining_data.py, so training reads them with no Python per example.

The rows are exactly the ones `data.format=text` would build in its first `--epochs` epochs (the same
shard streams, shards.py), masked by the config's masking as a static mask (the records' format has
one). Training on them with `data.format=bert_tfrecord` and dynamic masking puts the original tokens
back and masks afresh every epoch (bert_records.py); the rows themselves repeat every `--epochs`
epochs, as RoBERTa's dynamic masking over fixed rows. One file per virtual shard
(`part-SSSSS-of-NNNNN.tfrecord`); each is written beside as `.tmp` and renamed when complete, and
`metadata.json` (rows per file, the vocabulary's hash) is written last. With data.packing the records
carry one more feature, `document_ids` (int64[L]), that the original format lacks.
"""
from __future__ import annotations

import json
import os

from ml_collections import ConfigDict

from bert_jax.data_pipelines import embedded, prepare
from bert_jax.data_pipelines.errors import DataError
from bert_jax.data_pipelines.features import FEATURES, PACKING_FEATURES, Featurizer
from bert_jax.data_pipelines.shards import COUNTER_EPOCH_SHIFT, ShardStream, _stack, make_context
from bert_jax.data_pipelines.tftools import tf

_CHUNK = 256  # rows masked per TensorFlow call


def _example(t, row: dict) -> bytes:
  ints = lambda v: t.train.Feature(int64_list=t.train.Int64List(value=[int(x) for x in v]))  # noqa: E731
  feature = {name: ints(row[name]) for name in ("input_ids", "input_mask", "segment_ids", "masked_lm_positions",
                                                "masked_lm_ids", "document_ids") if name in row}
  feature["masked_lm_weights"] = t.train.Feature(float_list=t.train.FloatList(value=row["masked_lm_weights"]))
  feature["next_sentence_labels"] = ints([row["next_sentence_labels"]])
  return t.train.Example(features=t.train.Features(feature=feature)).SerializeToString()


def _write_shard(job) -> int:
  """Writes shard `shard`'s rows of epochs 0..epochs-1; returns how many."""
  data_cfg, split, shard, epochs, out_path = job
  t, data_cfg = tf(), ConfigDict(data_cfg)
  ctx = make_context(data_cfg, split, None, None)
  spec = {**FEATURES, **(PACKING_FEATURES if data_cfg.packing else {})}
  featurize = Featurizer(ctx.masking, ctx.seeds, spec, ctx.max_seq_length)
  count, pending = 0, []
  with t.io.TFRecordWriter(out_path + ".tmp") as writer:
    def flush():
      rows, counters = zip(*pending)
      batch = featurize(_stack(rows, counters, [shard] * len(rows), ctx.max_seq_length))
      for i in range(len(rows)):
        writer.write(_example(t, {name: batch[name][i] for name in spec}))
      pending.clear()

    for row, counter in ShardStream(ctx, shard):
      if counter >> COUNTER_EPOCH_SHIFT >= epochs:
        break
      pending.append((row, counter))
      count += 1
      if len(pending) == _CHUNK:
        flush()
    if pending:
      flush()
  t.io.gfile.rename(out_path + ".tmp", out_path, overwrite=True)
  return count


def prepare_rows(config, output_dir: str, epochs: int = 1, split: str = "train", num_workers: int = 0) -> dict:
  """Writes the config's rows of `epochs` epochs as create_pretraining_data.py records; returns the metadata."""
  data_cfg = config.data
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
  make_context(data_cfg, split, None, None)  # bad vocabulary, corpus or builder: fail before the workers
  tf().io.gfile.makedirs(output_dir)
  shards = data_cfg.num_shards
  jobs = [(data_cfg.to_dict(), split, s, epochs, os.path.join(output_dir, f"part-{s:05d}-of-{shards:05d}.tfrecord"))
          for s in range(shards)]
  results = prepare.run_jobs(_write_shard, jobs, num_workers, "shard", "prepare rows")
  counts = {os.path.basename(job[-1]): count for job, count in zip(jobs, results)}
  vocab_path = data_cfg.vocab or embedded.ensure_embedded()[1]
  metadata = {"format": "bert_tfrecord", "vocab": vocab_path, "vocab_sha256": prepare.vocab_fingerprint(vocab_path),
              "lower_case": data_cfg.lower_case, "split": split, "epochs": epochs, "rows": sum(counts.values()),
              "max_seq_length": data_cfg.max_seq_length,
              "max_predictions_per_seq": data_cfg.max_predictions_per_seq,
              "example_builder": data_cfg.example_builder, "masking": data_cfg.masking, "seed": data_cfg.seed,
              "rows_per_file": counts}
  with tf().io.gfile.GFile(os.path.join(output_dir, prepare.METADATA), "w") as f:
    f.write(json.dumps(metadata, indent=1))
  return metadata
