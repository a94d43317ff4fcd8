"""`bert-jax data prepare`: raw text -> tokenized document records, one output file per input file; and the
output folder's rules, which both formats and both executors (this module's processes, beam_prepare.py's
Beam pipeline) share.

Each record is a tf.train.Example per document: `ids` (int64, all sentences concatenated) and
`lengths` (int64, tokens per sentence). `metadata.json` beside them records the vocabulary's hash and
casing so a training run with another vocabulary fails at start instead of training on wrong ids.
Masking is not done here: it stays on the fly at train time.

The output folder: a non-empty one is refused unless `overwrite` (which deletes metadata.json first, then
the shards); every shard is written as `.tmp` and renamed when complete; metadata.json is written last,
so a folder without it is incomplete; a run that fails removes the shards it wrote.
"""
from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import multiprocessing
import os

from bert_jax import workdir
from bert_jax.data_pipelines import corpora, embedded, knowledge
from bert_jax.data_pipelines.errors import DataError
from bert_jax.data_pipelines.tftools import open_binary, tf
from bert_jax.data_pipelines.tokenizers import load_tokenizer

METADATA = "metadata.json"
SHARD_GLOB = "part-*-of-*"  # shards and their .tmp files


def vocab_fingerprint(path: str) -> str:
  with open_binary(path) as f:
    return hashlib.sha256(f.read()).hexdigest()


def shard_name(index: int, count: int) -> str:
  return f"part-{index:05d}-of-{count:05d}.tfrecord"


def document_record(tf_module, sentences: list[list[int]], tagged: bool = False) -> bytes:
  """A document's token ids (non-empty sentences) as the serialized tf.train.Example of this format; `tagged`:
  the ids carry knowledge tags (knowledge.py), written apart as `units`."""
  feature = tf_module.train.Feature
  int64s = lambda v: feature(int64_list=tf_module.train.Int64List(value=v))  # noqa: E731
  ids = [t for s in sentences for t in s]
  features = {"lengths": int64s([len(s) for s in sentences])}
  if tagged:
    ids, units = knowledge.split_ids(ids)
    features["units"] = int64s(units)
  features["ids"] = int64s(ids)
  # deterministic: the feature map in key order, the same bytes in every process (the default order is not)
  return tf_module.train.Example(features=tf_module.train.Features(feature=features)).SerializeToString(
      deterministic=True)


def document_ids(tokenized: list[list[int]]) -> list[list[int]]:
  """A tokenized document as the records keep it: its empty sentences dropped (an empty result: no record)."""
  return [s for s in tokenized if s]


def write_records(path: str, records) -> int:
  """Writes serialized records to `path`.tmp, renames it to `path`; returns how many."""
  count = 0
  with tf().io.TFRecordWriter(path + ".tmp") as writer:
    for record in records:
      writer.write(record)
      count += 1
  tf().io.gfile.rename(path + ".tmp", path, overwrite=True)
  return count


def claim_output(output_dir: str, overwrite: bool) -> None:
  """Makes `output_dir` ready for a new run: refuses a non-empty folder unless `overwrite`, which removes the
  previous run's metadata.json (first: the folder stops looking complete) and shards."""
  gfile = tf().io.gfile
  present = sorted(gfile.listdir(output_dir)) if gfile.isdir(output_dir) else []
  if present and not overwrite:
    raise DataError(f"--output {output_dir}: not empty ({len(present)} entries, e.g. {present[0]}); choose a new "
                    "folder, or add --overwrite to replace a previous run's shards")
  if present:
    metadata = os.path.join(output_dir, METADATA)
    if gfile.exists(metadata):
      gfile.remove(metadata)
    discard_shards(output_dir)
  gfile.makedirs(output_dir)


def discard_shards(output_dir: str) -> None:
  """Removes the shards (and .tmp files) in `output_dir`: after a failed run, or before an overwrite."""
  for path in tf().io.gfile.glob(os.path.join(output_dir, SHARD_GLOB)):
    tf().io.gfile.remove(path)


def discard_run(output_dir: str, held_out: str) -> None:
  """A rows run stopped while its hold-out's rows were written (Ctrl-C, SIGTERM): the training rows' metadata.json
  and shards go too, and the hold-out's folder, so the same command starts again."""
  gfile = tf().io.gfile
  for directory in (held_out, output_dir):
    if gfile.exists(os.path.join(directory, METADATA)):
      gfile.remove(os.path.join(directory, METADATA))
    discard_shards(directory)
  if gfile.isdir(held_out) and not gfile.listdir(held_out):
    gfile.rmtree(held_out)


@contextlib.contextmanager
def discarding_on_failure(output_dir: str):
  """A run that raises leaves no shards behind (and never wrote metadata.json)."""
  try:
    yield
  except BaseException:
    discard_shards(output_dir)
    raise


def write_metadata(output_dir: str, metadata: dict) -> None:
  """metadata.json, the last file of a run: through a temporary name, so it is either whole or absent."""
  workdir.write_text(workdir.path(os.path.join(output_dir, METADATA)), json.dumps(metadata, indent=1))


def read_metadata(output_dir: str) -> dict:
  with tf().io.gfile.GFile(os.path.join(output_dir, METADATA)) as f:
    return json.loads(f.read())


def documents_metadata(corpus: str, vocab: str, lower_case: bool, documents: int, files: int, stats: dict) -> dict:
  """The documents format's metadata.json; a corpus that gave no document is an error instead."""
  if not documents:
    raise DataError(f"--corpus {corpus!r}: no documents found (skips: {dict(stats)}); "
                    "check the files are UTF-8 text")
  return {"vocab": vocab, "vocab_sha256": vocab_fingerprint(vocab), "lower_case": lower_case,
          "documents": documents, "files": files, "skipped": dict(sorted(stats.items()))}


def _tagged_documents(encoder, texts, block: int = 64):
  """Documents' tagged ids, `block` documents per annotator call (spaCy pipes their sentences together)."""
  for pending in iter(lambda: list(itertools.islice(texts, block)), []):
    yield from encoder.documents(pending)


def _prepare_file(job) -> tuple[int, dict]:
  """Tokenizes one text file into one record file; returns (documents written, skip counts)."""
  in_path, out_path, vocab, lower_case, corpus_format, annotator_args = job
  tf_module, stats = tf(), corpora.Stats()
  tokenizer = load_tokenizer(vocab, lower_case)
  source = corpora.TextSource([in_path], corpus_format, stats)
  texts = (sentences for sentences, _, _ in corpora.read_unit(source, in_path))
  if annotator_args is None:
    documents = ([tokenizer.encode(s) for s in sentences] for sentences in texts)
  else:
    encoder = knowledge.TaggedEncoder(tokenizer, knowledge.make_annotator(**annotator_args))
    documents = _tagged_documents(encoder, texts)
  tagged = annotator_args is not None
  count = write_records(out_path, (document_record(tf_module, ids, tagged)
                                   for ids in map(document_ids, documents) if ids))
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


def corpus_files(corpus: str) -> list[str]:
  return corpora.list_files(corpus, "--corpus") if corpus else [embedded.ensure_embedded()[0]]


def prepare(corpus: str, output_dir: str, vocab: str = "", lower_case: bool = True,
            corpus_format: str = corpora.SENTENCE_PER_LINE, num_workers: int = 0, overwrite: bool = False,
            knowledge_annotator: dict | None = None) -> dict:
  """Tokenizes every file of `corpus` (globs) in parallel; returns the metadata it writes. `knowledge_annotator`
  (knowledge.make_annotator's arguments, {} for the offline default): keep its spans with the documents, for
  data.masking=knowledge."""
  files = corpus_files(corpus)
  vocab = vocab or embedded.ensure_embedded()[1]
  tokenizer = load_tokenizer(vocab, lower_case)  # fail on a bad vocabulary before starting workers
  corpora.TextSource(files, corpus_format, corpora.Stats())  # and on a bad --corpus-format
  annotator = None
  if knowledge_annotator is not None:  # and on a missing annotator
    annotator = knowledge.make_annotator(**knowledge_annotator)
    knowledge.TaggedEncoder(tokenizer, annotator)
  claim_output(output_dir, overwrite)
  jobs = [(path, os.path.join(output_dir, shard_name(i, len(files))), vocab, lower_case, corpus_format,
           knowledge_annotator) for i, path in enumerate(files)]
  total, stats = 0, corpora.Stats()
  with discarding_on_failure(output_dir):
    for count, file_stats in run_jobs(_prepare_file, jobs, num_workers, "file", "prepare"):
      total += count
      stats.update(file_stats)
    metadata = documents_metadata(corpus, vocab, lower_case, total, len(jobs), stats)
  if annotator is not None:
    metadata["knowledge"] = annotator.name
  write_metadata(output_dir, metadata)
  return metadata


def check_prepared(files: list[str], data_cfg) -> None:
  """Fails when the records were tokenized with another vocabulary or casing than the config's."""
  path = os.path.join(os.path.dirname(files[0]), METADATA)
  if not tf().io.gfile.exists(path):
    raise DataError(f"data.prepared: {path} is missing; write the records with `bert-jax data prepare`")
  with tf().io.gfile.GFile(path) as f:
    metadata = json.loads(f.read())
  vocab = embedded.default_vocab(data_cfg)
  if metadata["vocab_sha256"] != vocab_fingerprint(vocab) or metadata["lower_case"] != data_cfg.lower_case:
    raise DataError(f"data.prepared records were tokenized with {metadata['vocab']} "
                    f"(lower_case={metadata['lower_case']}), not data.vocab={vocab!r} "
                    f"(lower_case={data_cfg.lower_case}); set data.vocab to match or prepare again")
  if data_cfg.masking == "knowledge" and "knowledge" not in metadata:
    raise DataError(f"data.masking=knowledge: the records in {os.path.dirname(files[0])} keep no phrase or entity "
                    "spans; prepare them with `bert-jax data prepare --knowledge` (or train on data.corpus)")
