"""`bert-jax data prepare`: raw text -> tokenized document records, one output file per input file.

Each record is a tf.train.Example per document: `ids` (int64, all sentences concatenated) and
`lengths` (int64, tokens per sentence). `metadata.json` beside them records the vocabulary's hash and
casing so a training run with another vocabulary fails at start instead of training on wrong ids.
Masking is not done here: it stays on the fly at train time.
"""
from __future__ import annotations

import hashlib
import json
import multiprocessing
import os

from bert_jax.data_pipelines import corpora, embedded
from bert_jax.data_pipelines.errors import DataError
from bert_jax.data_pipelines.tftools import open_binary, tf
from bert_jax.data_pipelines.tokenizers import load_tokenizer

METADATA = "metadata.json"


def vocab_fingerprint(path: str) -> str:
  with open_binary(path) as f:
    return hashlib.sha256(f.read()).hexdigest()


def _record(tf_module, sentences) -> bytes:
  feature = tf_module.train.Feature
  int64s = lambda v: feature(int64_list=tf_module.train.Int64List(value=v))  # noqa: E731
  return tf_module.train.Example(features=tf_module.train.Features(feature={
      "ids": int64s([t for s in sentences for t in s]),
      "lengths": int64s([len(s) for s in sentences]),
  })).SerializeToString()


def _prepare_file(job) -> tuple[int, dict]:
  """Tokenizes one text file into one record file; returns (documents written, skip counts)."""
  in_path, out_path, vocab, lower_case, corpus_format = job
  tf_module, stats = tf(), corpora.Stats()
  tokenizer = load_tokenizer(vocab, lower_case)
  source = corpora.TextSource([in_path], corpus_format, stats)
  count = 0
  with tf_module.io.TFRecordWriter(out_path + ".tmp") as writer:
    for sentences, _, _ in source.read(in_path, 0, 0):
      ids = [s for s in map(tokenizer.encode, sentences) if s]
      if ids:
        writer.write(_record(tf_module, ids))
        count += 1
  tf_module.io.gfile.rename(out_path + ".tmp", out_path, overwrite=True)
  return count, dict(stats)


def run_jobs(fn, jobs: list, num_workers: int, unit: str, desc: str):
  """fn(job) for every job, in order, in `num_workers` processes (0: one per CPU), with a progress bar."""
  from tqdm import tqdm  # pylint: disable=import-outside-toplevel
  workers = min(num_workers or os.cpu_count() or 1, len(jobs))
  with tqdm(total=len(jobs), unit=unit, desc=desc) as bar:
    if workers == 1:
      for job in jobs:
        yield fn(job)
        bar.update()
      return
    # spawn: forking a process that already runs TensorFlow threads can deadlock
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
      for result in pool.imap(fn, jobs):
        yield result
        bar.update()


def prepare(corpus: str, output_dir: str, vocab: str = "", lower_case: bool = True,
            corpus_format: str = corpora.SENTENCE_PER_LINE, num_workers: int = 0) -> dict:
  """Tokenizes every file of `corpus` (globs) in parallel; returns the metadata it writes."""
  files = corpora.list_files(corpus, "--corpus") if corpus else [embedded.ensure_embedded()[0]]
  vocab = vocab or embedded.ensure_embedded()[1]
  load_tokenizer(vocab, lower_case)  # fail on a bad vocabulary before starting workers
  tf().io.gfile.makedirs(output_dir)
  jobs = [(path, os.path.join(output_dir, f"part-{i:05d}-of-{len(files):05d}.tfrecord"), vocab,
           lower_case, corpus_format) for i, path in enumerate(files)]
  total, stats = 0, corpora.Stats()
  for count, file_stats in run_jobs(_prepare_file, jobs, num_workers, "file", "prepare"):
    total += count
    stats.update(file_stats)
  if not total:
    raise DataError(f"--corpus {corpus!r}: no documents found (skips: {dict(stats)}); "
                    "check the files are UTF-8 text")
  metadata = {"vocab": vocab, "vocab_sha256": vocab_fingerprint(vocab), "lower_case": lower_case,
              "documents": total, "files": len(jobs), "skipped": dict(stats)}
  with tf().io.gfile.GFile(os.path.join(output_dir, METADATA), "w") as f:
    f.write(json.dumps(metadata, indent=1))
  return metadata


def check_prepared(files: list[str], data_cfg) -> None:
  """Fails when the records were tokenized with another vocabulary or casing than the config's."""
  path = os.path.join(os.path.dirname(files[0]), METADATA)
  if not tf().io.gfile.exists(path):
    raise DataError(f"data.prepared: {path} is missing; write the records with `bert-jax data prepare`")
  with tf().io.gfile.GFile(path) as f:
    metadata = json.loads(f.read())
  vocab = data_cfg.vocab or embedded.ensure_embedded()[1]
  if metadata["vocab_sha256"] != vocab_fingerprint(vocab) or metadata["lower_case"] != data_cfg.lower_case:
    raise DataError(f"data.prepared records were tokenized with {metadata['vocab']} "
                    f"(lower_case={metadata['lower_case']}), not data.vocab={vocab!r} "
                    f"(lower_case={data_cfg.lower_case}); set data.vocab to match or prepare again")
