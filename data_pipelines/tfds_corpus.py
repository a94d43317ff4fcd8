"""A tfds builder for text corpora, `bert_jax_corpus`: `tfds build` runs `bert-jax data prepare`'s steps (read
and tokenize, beam_prepare.read_documents, on Beam) and `tfds.load` reads the tokenized documents.

    tfds build bert_jax_corpus --imports bert_jax.data_pipelines.tfds_corpus --manual_dir DIR --data_dir OUT \
      [--config cased] --beam_pipeline_options="runner=DirectRunner,direct_num_workers=2"
    import bert_jax.data_pipelines.tfds_corpus  # registers the builder
    tfds.load("bert_jax_corpus", data_dir=OUT, split="train")

The corpus is every `*.txt` file in DIR but `vocab.txt` (one sentence per line, a blank line between
documents); the vocabulary is DIR/vocab.txt (WordPiece) or DIR/spm.model (SentencePiece) when there,
else the embedded one. Configs: `uncased` (the default) and `cased`. One example per document with at
least one token, holding what its record from `bert-jax data prepare` holds, `ids` int64[N] (its
non-empty sentences' ids, concatenated) and `lengths` int64[S] (tokens per sentence), and where it comes
from: `source` (the file name) and `index` (its place among the file's documents, from 0). The dataset's
metadata records the vocabulary's sha256 and casing, as metadata.json does for prepared records.
"""
from __future__ import annotations

import os

from bert_jax.data_pipelines import beam_prepare, corpora, embedded, prepare
from bert_jax.data_pipelines.errors import DataError
from bert_jax.data_pipelines.tftools import tf, tf_module

tfds = tf_module("tensorflow_datasets")
beam = beam_prepare.beam
_VOCABS = ("vocab.txt", "spm.model")


class CorpusConfig(tfds.core.BuilderConfig):
  """A casing of the corpus' tokenization."""

  def __init__(self, *, lower_case: bool, **kwargs):
    super().__init__(**kwargs)
    self.lower_case = lower_case


def _example(document: tuple, files: tuple):
  """A tokenized document (beam_prepare's tuple) -> (key, example), or nothing for a document with no token."""
  position, index, _, _, sentences = document
  ids = prepare.document_ids(sentences)
  if ids:
    yield f"{position:05d}-{index:012d}", {"ids": [t for s in ids for t in s], "lengths": [len(s) for s in ids],
                                           "source": os.path.basename(files[position]), "index": index - 1}


@beam.ptransform_fn
def _Examples(root, text: beam_prepare.TextCorpus):  # pylint: disable=invalid-name  # a PTransform's name
  _, documents, _ = beam_prepare.read_documents(root, text, len(text.files))
  return documents | "examples" >> beam.FlatMap(_example, text.files)


class BertJaxCorpus(tfds.core.GeneratorBasedBuilder):
  """Tokenized documents of a text corpus, as `bert-jax data prepare` writes them."""

  VERSION = tfds.core.Version("1.0.0")
  BUILDER_CONFIGS = [CorpusConfig(name="uncased", lower_case=True, description="lower-cased, accents stripped"),
                     CorpusConfig(name="cased", lower_case=False, description="text as written")]
  MANUAL_DOWNLOAD_INSTRUCTIONS = ("Put the corpus' text files (*.txt, one sentence per line, a blank line between "
                                  "documents) in --manual_dir, with vocab.txt or spm.model to use that vocabulary.")

  def _info(self):
    sequence = tfds.features.Tensor(shape=(None,), dtype=tf().int64)
    return self.dataset_info_from_configs(
        features=tfds.features.FeaturesDict({"ids": sequence, "lengths": sequence, "source": tfds.features.Text(),
                                             "index": tf().int64}),
        metadata=tfds.core.MetadataDict(), homepage="https://github.com/google-research/bert")

  def _split_generators(self, dl_manager):
    directory = os.fspath(dl_manager.manual_dir)
    vocabs = [os.path.join(directory, v) for v in _VOCABS if tf().io.gfile.exists(os.path.join(directory, v))]
    files = [f for f in corpora.list_files(os.path.join(directory, "*.txt"), "--manual_dir")
             if os.path.basename(f) != "vocab.txt"]
    if not files:
      raise DataError(f"--manual_dir {directory}: no corpus files (*.txt other than vocab.txt)")
    vocab = vocabs[0] if vocabs else embedded.ensure_embedded()[1]
    text = beam_prepare.TextCorpus(tuple(files), corpora.SENTENCE_PER_LINE, vocab, self.builder_config.lower_case)
    text.open()  # a bad vocabulary: one line before the job
    self.info.metadata.update(vocab=vocab, vocab_sha256=prepare.vocab_fingerprint(vocab),
                              lower_case=self.builder_config.lower_case)
    return {"train": self._generate_examples(text)}

  def _generate_examples(self, text: beam_prepare.TextCorpus):
    """The Beam transform yielding the split's (key, example) pairs: tfds runs it with --beam_pipeline_options."""
    return _Examples(text)  # pylint: disable=no-value-for-parameter  # ptransform_fn supplies the root
