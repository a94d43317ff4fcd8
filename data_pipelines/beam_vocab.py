"""`bert-jax vocab --runner R --sample-sentences N`: the sentences a vocabulary is learned from, drawn
uniformly across a corpus of any size by an Apache Beam pipeline, for vocab.py's WordPiece and
SentencePiece trainers (which then run in this process, on the N sentences).

    files -> Reshuffle -> each file's reservoir: its N sentences of smallest draw (vocab.sentence_key)
      -> the N smallest of all reservoirs (Top.Smallest, combined per bundle) -> OUTPUT/vocab_sample.txt

A sentence's draw is a hash of (seed, file name, its place in the file), so the N smallest draws are a
uniform sample without replacement, the same one on any runner and worker count as vocab.sample_sentences
draws in one process. The sample file is written in corpus order and kept beside the vocabulary.
"""
from __future__ import annotations

import os

from bert_jax.data_pipelines import beam_runner, corpora, vocab
from bert_jax.data_pipelines.tftools import tf

beam = beam_runner.import_beam()
SAMPLE_FILE = "vocab_sample.txt"


class _Reservoir(beam.DoFn):
  """A file position -> that file's reservoir of candidates (draw, position, index, sentence)."""

  def __init__(self, files: tuple, corpus_format: str, size: int, seed: int):
    self._files, self._format, self._size, self._seed = files, corpus_format, size, seed

  def process(self, position: int):
    source = corpora.TextSource(list(self._files), self._format, corpora.Stats())
    yield from vocab.unit_sample(source, position, self._size, self._seed)


def _write_sample(candidates, path: str) -> None:
  gfile = tf().io.gfile
  with gfile.GFile(path + ".tmp", "w") as f:
    f.write("".join(sentence + "\n" for sentence in vocab.in_corpus_order(candidates)))
  gfile.rename(path + ".tmp", path, overwrite=True)


def sample_sentences(corpus: str, size: int, seed: int, corpus_format: str, output_dir: str,
                     args: list[str]) -> list[str]:
  """vocab.sample_sentences on Beam (runner and options in `args`): writes OUTPUT/vocab_sample.txt, returns it."""
  files = tuple(corpora.list_files(corpus, "--corpus"))
  corpora.TextSource(list(files), corpus_format, corpora.Stats())  # a bad --corpus-format: one line, before the job
  beam_runner.check_reachable(args, {"--corpus": list(files), "--output": [output_dir]})
  path = os.path.join(output_dir, SAMPLE_FILE)
  tf().io.gfile.makedirs(output_dir)

  def build(pipeline):
    _ = (pipeline | "files" >> beam.Create(list(range(len(files)))) | "spread files" >> beam.Reshuffle()
         | "reservoirs" >> beam.ParDo(_Reservoir(files, corpus_format, size, seed))
         | "smallest draws" >> beam.combiners.Top.Smallest(size)
         | "write" >> beam.Map(_write_sample, path))

  beam_runner.run(args, build, f"--corpus {corpus}")
  with tf().io.gfile.GFile(path) as f:
    return f.read().splitlines()
