"""The embedded demo task: is this sentence in its original word order, or shuffled?

Built from the embedded corpus (stdlib docstrings), so it runs offline right after
`bert-jax pretrain --config configs/bert.py:demo`. Half the sentences have their words permuted; a
model has to know English word order to tell them apart, which MLM pretraining teaches. Dev sentences
come from the start of the corpus, training sentences after them, so no sentence is in both.

task.name=first_word is a second, easier task on the same sentences (multi-task runs, finetune/multitask.py,
and their tests): the label is the sentence's first word, "true" or "false", written in front of it.
"""
from __future__ import annotations

import itertools
import random
from typing import Callable

import ml_collections

from bert_jax.finetune import glue
from bert_jax.finetune.features import input_length
from bert_jax.finetune.tasks import Task

SPEC = glue.GlueSpec(("sentence", None), ("sentence", None, "label"), ("original", "shuffled"),
                     ("accuracy",), "EMBEDDED")
FIRST_WORD = glue.GlueSpec(("sentence", None), ("sentence", None, "label"), ("false", "true"), ("accuracy",),
                           "FIRST_WORD")
_MIN_WORDS, _MAX_WORDS = 6, 40


def make_rows(sentences, seed: int) -> list[tuple[str, None, str]]:
  """About half the sentences (chosen at random) shuffled until their word order differs.

  The final punctuation mark stays last, so that a stray mid-sentence full stop gives nothing away.
  """
  rng = random.Random(seed)
  rows = []
  for sentence in sentences:
    words, end = sentence[:-1].split(), sentence[-1]
    if rng.random() < 0.5:
      shuffled = words[:]
      while shuffled == words:
        rng.shuffle(shuffled)
      rows.append((" ".join(shuffled) + end, None, "shuffled"))
    else:
      rows.append((sentence, None, "original"))
  return rows


def first_word_rows(sentences, seed: int) -> list[tuple[str, None, str]]:
  """Each sentence behind "true" or "false" (chosen at random), labelled with that word."""
  rng = random.Random(seed)
  labels = [FIRST_WORD.labels[rng.random() < 0.5] for _ in sentences]
  return [(f"{label} {sentence}", None, label) for sentence, label in zip(sentences, labels)]


def corpus_sentences(limit: int) -> list[str]:
  from bert_jax.data_pipelines import embedded  # pylint: disable=import-outside-toplevel
  corpus, _ = embedded.ensure_embedded()
  with open(corpus, encoding="utf-8") as f:
    usable = (l.strip() for l in f
              if len(set(l.split())) >= _MIN_WORDS and len(l.split()) <= _MAX_WORDS)
    return list(itertools.islice(usable, limit))


# The embedded tasks by task.name: their spec and rows (any other name: "embedded"); `variant` picks one.
_VARIANTS = {"embedded": (SPEC, make_rows), "first_word": (FIRST_WORD, first_word_rows)}


def variant(config: ml_collections.ConfigDict) -> tuple[str, glue.GlueSpec, Callable]:
  """(name, spec, rows(sentences, seed)) of the embedded task config.task.name names."""
  name = config.task.name if config.task.name in _VARIANTS else "embedded"
  return (name, *_VARIANTS[name])


def build(config: ml_collections.ConfigDict, tokenizer, *, need_train: bool) -> Task:
  num_dev, num_train = config.task.num_dev, config.task.num_train
  name, spec, rows = variant(config)
  sentences = corpus_sentences(num_dev + num_train)
  dev = glue.eval_set(config, spec, tokenizer, rows(sentences[:num_dev], seed=1), "dev",
                      f"{spec.leaderboard}.dev.tsv")
  train = None
  if need_train:
    train = glue.featurize(rows(sentences[num_dev:], seed=2), spec, tokenizer,
                           input_length(config), config.data.train_limit)
  return Task(name=name, head="classification", num_labels=2, train=train, evals=[dev], tests=[],
              selection=spec.metrics, labels=spec.labels)
