"""Small corpora and vocabularies shared by the tests/test_data_*.py files (real English from the embedded corpus)."""
import functools
import itertools
import os

from bert_jax.data_pipelines import embedded

UNICODE_LINES = [
    "Café déjà vu: naïve façade, résumé — Ångström, Øresund, Straße, İstanbul.",
    "北京大学的学生在学习自然语言处理。日本語のテキストも少し。",
    "Привет, мир! Это тест токенизатора BERT.",
    "Mixed 中文 and English, with “smart quotes” and ‘apostrophes’… and emoji 🙂 too.",
    "Tabs\tand\u00a0non-breaking\u2003spaces, soft\u00adhyphens and zero\u200bwidth joiners.",
    "Ελληνικά γράμματα: αβγ ΔΕΖ, and العربية text, and עברית.",
    "Accents in caps: ÉCOLE, ÀÉÎÕÜ, and ligatures ﬁ ﬂ, fullwidth ＡＢＣ１２３.",
]


@functools.cache
def embedded_paths():
  return embedded.ensure_embedded()


@functools.cache
def real_sentences(n: int) -> tuple:
  with open(embedded_paths()[0], encoding="utf-8") as f:
    return tuple(itertools.islice((l.strip() for l in f if l.strip()), n))


def write_corpus(directory, num_docs=60, sentences_per_doc=6, num_files=4, offset=0):
  """Sentence-per-line files of multi-sentence documents; returns the glob."""
  sentences = real_sentences(offset + num_docs * sentences_per_doc)[offset:]
  os.makedirs(directory, exist_ok=True)
  files = [open(os.path.join(directory, f"part{i}.txt"), "w", encoding="utf-8") for i in range(num_files)]
  for d in range(num_docs):
    doc = sentences[d * sentences_per_doc:(d + 1) * sentences_per_doc]
    files[d % num_files].write("\n".join(doc) + "\n\n")
  for f in files:
    f.close()
  return os.path.join(directory, "*.txt")


def write_first_word_sst2(directory, n_train=256, n_dev=48, random_train_labels=False):
  """sst2-format train.tsv/dev.tsv of real sentences whose label is written in their first word ("true ..." /
  "false ..."); the dev labels are always right, the training labels optionally coin flips."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  os.makedirs(directory, exist_ok=True)
  sentences = real_sentences(n_train + n_dev)
  rng = np.random.default_rng(0)
  for split, chunk in (("train", sentences[:n_train]), ("dev", sentences[n_train:])):
    with open(os.path.join(directory, f"{split}.tsv"), "w", encoding="utf-8") as f:
      f.write("sentence\tlabel\n")
      for sentence in chunk:
        y = int(rng.integers(2))
        label = int(rng.integers(2)) if random_train_labels and split == "train" else y
        f.write(f"{('false', 'true')[y]} {sentence}\t{label}\n")
  return str(directory)


def predict_accuracy(model_dir, data_dir, output) -> float:
  """`bert-jax predict` of a sst2-format model on DATA_DIR/dev.tsv into OUTPUT: the share of its labels
  equal to the file's."""
  import json  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from bert_jax import cli  # pylint: disable=import-outside-toplevel
  assert cli.main(["predict", "--model", str(model_dir), "--input", os.path.join(data_dir, "dev.tsv"),
                   "--output", str(output)]) == 0
  with open(os.path.join(data_dir, "dev.tsv"), encoding="utf-8") as f:
    truth = [line.rsplit("\t", 1)[1].strip() for line in f.read().splitlines()[1:]]
  with open(output, encoding="utf-8") as f:
    labels = [json.loads(line)["label"] for line in f]
  return float(np.mean(np.array(labels) == np.array(truth)))
