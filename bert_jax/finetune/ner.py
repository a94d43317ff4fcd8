"""Named-entity recognition on CoNLL-2003, from tfds `conll2003` or the CoNLL files.

Files: one token per line with its NER tag in the last column, blank lines between sentences,
-DOCSTART- lines ignored (train: train.txt or eng.train; dev: valid.txt, dev.txt or eng.testa; test:
test.txt or eng.testb). Each word is labelled on its first sub-token (Devlin et al. 2019, 5.3); the
other sub-tokens carry no loss and no prediction. Words past max_seq_length are predicted "O".
Scored with entity-level F1 as seqeval computes it, so IOB1 (the original files) and IOB2 (tfds) both work.
"""
from __future__ import annotations

import os

import ml_collections
import numpy as np
from etils import epath

from bert_jax import workdir
from bert_jax.data_pipelines.tftools import open_text
from bert_jax.errors import UserError
from bert_jax.finetune import features as feats
from bert_jax.finetune import metrics
from bert_jax.finetune.tasks import EvalSet, Task

_FILES = {"train": ("train.txt", "eng.train"), "dev": ("valid.txt", "dev.txt", "eng.testa"),
          "test": ("test.txt", "eng.testb")}

Sentence = tuple[list[str], list[str]]  # words, tags


def read_conll(path: str, labels: tuple[str, ...] | None = None) -> list[Sentence]:
  """The sentences of a CoNLL file; with `labels`, a tag outside them is an error naming file and line."""
  sentences, words, tags = [], [], []
  with open_text(path) as f:
    for number, line in enumerate(_utf8_lines(f, path), 1):
      columns = line.split()
      if not columns or columns[0] == "-DOCSTART-":
        if words:
          sentences.append((words, tags))
        words, tags = [], []
        continue
      if labels is not None and columns[-1] not in labels:
        raise UserError(f"{path}:{number}: NER tag {columns[-1]!r} is not one of task.labels {tuple(labels)}; "
                        "fix the line, or add the tag to task.labels")
      words.append(columns[0])
      tags.append(columns[-1])
  if words:
    sentences.append((words, tags))
  return sentences


def _utf8_lines(f, path: str):
  try:
    yield from f
  except UnicodeDecodeError as e:
    raise UserError(f"{path}: not UTF-8 text ({e})") from None


def read_tfds(split: str, labels: tuple[str, ...], data_dir: str) -> list[Sentence]:
  sentences = []
  files = "a folder with the CoNLL files (train.txt, valid.txt, test.txt)"
  for ex in feats.tfds_examples("conll2003", split, data_dir, files):
    n = min(len(ex["tokens"]), len(ex["ner"]))
    sentences.append(([feats.text(w) for w in ex["tokens"][:n]], [labels[int(t)] for t in ex["ner"][:n]]))
  return sentences


def _read_split(config: ml_collections.ConfigDict, split: str) -> list[Sentence]:
  if config.data.data_dir:
    paths = [os.fspath(p) for p in (epath.Path(config.data.data_dir) / n for n in _FILES[split]) if p.exists()]
    if not paths:
      raise UserError(f"no {split} file in {config.data.data_dir}: expected one of {_FILES[split]}")
    source, sentences = paths[0], read_conll(paths[0], tuple(config.task.labels))
  else:
    source = f"tfds conll2003 {split}"
    sentences = read_tfds(split, tuple(config.task.labels), config.data.tfds_data_dir)
  if not sentences:
    raise UserError(f"{source}: no sentences (an empty file?)")
  return sentences


def _unknown_id(tokenizer) -> int:
  """For a word that tokenizes to nothing (a lone control character): it still needs a position."""
  unk = tokenizer.special_ids.get("[UNK]")
  return tokenizer.special_ids["[PAD]"] if unk is None else unk


def featurize(sentences: list[Sentence], labels: tuple[str, ...], tokenizer, max_len: int
              ) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
  """Rows plus, per sentence, the position of each kept word's first sub-token (the tokenizer's layout
  places the special tokens and the padding: XLNet's words sit before <sep> <cls>, after the padding)."""
  index = {label: i for i, label in enumerate(labels)}
  layout = feats.layout_of(tokenizer)
  rows, token_labels, weights, first_positions = [], [], [], []
  for words, tags in sentences:
    unknown = set(tags) - set(index)
    if unknown:
      raise UserError(f"NER tags {sorted(unknown)} are not in task.labels {labels}")
    ids, positions = [], []
    for word in words:
      pieces = tokenizer.encode(word) or [_unknown_id(tokenizer)]
      if len(ids) + len(pieces) > max_len - 2:
        break
      positions.append(len(ids))
      ids.extend(pieces)
    ids, types = layout.wrap(tokenizer.special_ids["[CLS]"], tokenizer.special_ids["[SEP]"], ids)
    row = feats.pad_row(tokenizer, ids, types, max_len)
    shift = layout.before_a + feats.pad_start(tokenizer, len(ids), max_len)
    positions = [p + shift for p in positions]
    target, weight = np.zeros(max_len, np.int32), np.zeros(max_len, np.float32)
    target[positions] = [index[t] for t in tags[:len(positions)]]
    weight[positions] = 1.0
    rows.append(row)
    token_labels.append(target)
    weights.append(weight)
    first_positions.append(np.asarray(positions, np.int32))
  return feats.stack(rows, token_labels=np.stack(token_labels), label_weights=np.stack(weights)), first_positions


def predicted_tags(outputs, sentences: list[Sentence], first_positions, labels) -> list[list[str]]:
  predicted = np.argmax(outputs["logits"], axis=-1)
  return [[labels[p] for p in predicted[i, positions]] + ["O"] * (len(words) - len(positions))
          for i, ((words, _), positions) in enumerate(zip(sentences, first_positions))]


def write_predictions(path: epath.PathLike, sentences: list[Sentence], tags: list[list[str]]) -> None:
  """CoNLL evaluation layout: word, gold tag, predicted tag; a blank line after each sentence."""
  workdir.write_text(path, "".join("".join(f"{w} {g} {p}\n" for w, g, p in zip(words, gold, predicted)) + "\n"
                                     for (words, gold), predicted in zip(sentences, tags)))


def _eval_set(config, tokenizer, split: str) -> EvalSet:
  labels = tuple(config.task.labels)
  sentences = _read_split(config, split)
  sentences = sentences[:config.data.eval_limit] if config.data.eval_limit else sentences
  rows, first_positions = featurize(sentences, labels, tokenizer, feats.input_length(config))
  features = feats.pad_to_multiple(rows, config.train.eval_batch_size)
  tags = lambda out: predicted_tags(out, sentences, first_positions, labels)  # noqa: E731
  return EvalSet(
      name=split, features=features,
      evaluate=lambda out: metrics.entity_f1([g for _, g in sentences], tags(out)),
      write_predictions=lambda d, out: write_predictions(epath.Path(d) / f"ner.{split}.txt", sentences,
                                                         tags(out)))


def build(config: ml_collections.ConfigDict, tokenizer, *, need_train: bool) -> Task:
  labels = tuple(config.task.labels)
  train = None
  if need_train:
    sentences = _read_split(config, "train")
    sentences = sentences[:config.data.train_limit] if config.data.train_limit else sentences
    train, _ = featurize(sentences, labels, tokenizer, feats.input_length(config))
  tests = [_eval_set(config, tokenizer, "test")] if config.predict_split == "test" else []
  return Task(name=config.task.name, head="token", num_labels=len(labels), train=train,
              evals=[_eval_set(config, tokenizer, "dev")], tests=tests, selection=("f1",), labels=labels)
