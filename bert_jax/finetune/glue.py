"""GLUE (Wang et al. 2019): the nine tasks from tfds `glue/*` or from the GLUE distribution's TSV files.

Labels are numbered as tfds numbers them; TSV label strings map onto those numbers, and leaderboard
prediction files write the TSV strings back (`index<TAB>prediction`, one file per task as the
gluebenchmark.com submission expects).
"""
from __future__ import annotations

import csv
import dataclasses
import math
import os
import sys
from typing import Callable

import ml_collections
import numpy as np
from etils import epath

from bert_jax import workdir
from bert_jax.data_pipelines.tftools import open_text
from bert_jax.errors import UserError
from bert_jax.finetune import features as feats
from bert_jax.finetune import metrics
from bert_jax.finetune.tasks import EvalSet, Task

_METRICS: dict[str, Callable] = {"mcc": metrics.matthews_corrcoef, "accuracy": metrics.accuracy,
                                 "f1": metrics.binary_f1, "pearson": metrics.pearson, "spearman": metrics.spearman}


@dataclasses.dataclass(frozen=True)
class GlueSpec:
  tfds_fields: tuple[str, str | None]
  tsv_columns: tuple[str, str | None, str]  # text a, text b, label (header names)
  labels: tuple[str, ...]  # TSV label strings in tfds order; () for regression
  metrics: tuple[str, ...]
  leaderboard: str
  splits: tuple[str, ...] = ("",)  # suffixes of dev/test (MNLI: matched, mismatched)


SPECS = {
    "cola": GlueSpec(("sentence", None), ("sentence", None, "label"), ("0", "1"), ("mcc",), "CoLA"),
    "sst2": GlueSpec(("sentence", None), ("sentence", None, "label"), ("0", "1"), ("accuracy",), "SST-2"),
    "mrpc": GlueSpec(("sentence1", "sentence2"), ("#1 String", "#2 String", "Quality"), ("0", "1"),
                     ("f1", "accuracy"), "MRPC"),
    "stsb": GlueSpec(("sentence1", "sentence2"), ("sentence1", "sentence2", "score"), (),
                     ("pearson", "spearman"), "STS-B"),
    "qqp": GlueSpec(("question1", "question2"), ("question1", "question2", "is_duplicate"), ("0", "1"),
                    ("f1", "accuracy"), "QQP"),
    "mnli": GlueSpec(("premise", "hypothesis"), ("sentence1", "sentence2", "gold_label"),
                     ("entailment", "neutral", "contradiction"), ("accuracy",), "MNLI",
                     ("_matched", "_mismatched")),
    "qnli": GlueSpec(("question", "sentence"), ("question", "sentence", "label"),
                     ("entailment", "not_entailment"), ("accuracy",), "QNLI"),
    "rte": GlueSpec(("sentence1", "sentence2"), ("sentence1", "sentence2", "label"),
                    ("entailment", "not_entailment"), ("accuracy",), "RTE"),
    "wnli": GlueSpec(("sentence1", "sentence2"), ("sentence1", "sentence2", "label"), ("0", "1"),
                     ("accuracy",), "WNLI"),
}
# CoLA's train/dev TSVs have no header: source, label, original label, sentence.
_COLA_POSITIONS = {"sentence": 3, "label": 1}


def _check_label(spec: GlueSpec, label: str, where: str) -> None:
  if spec.labels and label not in spec.labels:
    raise UserError(f"{where}: label {label!r} is not one of {spec.labels}")
  if not spec.labels:
    try:
      finite = math.isfinite(float(label))
    except ValueError:
      finite = False
    if not finite:
      raise UserError(f"{where}: score {label!r} is not a number")


def read_tsv(path: str, spec: GlueSpec, strict: bool = False,
             labelled: bool = False) -> list[tuple[str, str | None, str | None]]:
  """(text a, text b, label string or None) rows of a GLUE TSV file.

  Rows with too few fields are dropped and counted (an error with `strict`); a label outside the task's
  labels, or a score that is not a number, is an error naming the line. `labelled` (train and dev
  files): a file without the label column is an error naming it; test files go without.
  """
  csv.field_size_limit(sys.maxsize)
  try:
    with open_text(path, encoding="utf-8-sig", newline="") as f:  # MRPC's files start with a byte-order mark
      reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
      rows = [(reader.line_num, row) for row in reader if row]
  except UnicodeDecodeError as e:
    raise UserError(f"{path}: not UTF-8 text ({e})") from None
  if not rows:
    return []
  header = rows[0][1]
  if spec.tsv_columns[0] in header or header[0] in ("index", "id"):
    columns, rows = {name: i for i, name in enumerate(header)}, rows[1:]
  else:
    columns = _COLA_POSITIONS
  a, b, label = (columns.get(name) if name else None for name in spec.tsv_columns)
  if a is None:
    raise UserError(f"{path}: no column {spec.tsv_columns[0]!r} (header: {header})")
  if labelled and label is None:
    raise UserError(f"{path}: no label column {spec.tsv_columns[2]!r} (header: {header}); training and dev "
                    "files need one (only test files go without)")
  width = max(i for i in (a, b, label) if i is not None) + 1
  kept, short = [], []
  for line, row in rows:
    if len(row) < width:
      short.append(f"line {line}")
      continue
    if label is not None:
      _check_label(spec, row[label], f"{path}:{line}")
    kept.append((row[a], row[b] if b is not None else None, row[label] if label is not None else None))
  feats.report(path, len(short), f"rows with fewer than {width} tab-separated fields dropped", short, strict)
  return kept


def read_tfds(name: str, split: str, spec: GlueSpec, data_dir: str):
  field_a, field_b = spec.tfds_fields
  rows = []
  files = f"a folder with the GLUE {name} TSVs (train.tsv, dev{spec.splits[0]}.tsv)"
  for ex in feats.tfds_examples(f"glue/{name}", split, data_dir, files):
    if spec.labels:  # tfds marks unlabelled (test) rows with -1
      label = spec.labels[int(ex["label"])] if ex["label"] >= 0 else None
    else:
      label = None if split.startswith("test") else str(float(ex["label"]))
    rows.append((feats.text(ex[field_a]), feats.text(ex[field_b]) if field_b else None, label))
  return rows


def _read_split(config: ml_collections.ConfigDict, spec: GlueSpec, split: str):
  """split: train | dev | test (+ MNLI suffix); local TSVs when data.data_dir is set, else tfds."""
  name, data_dir = config.task.name, config.data.data_dir
  if data_dir:
    path = os.fspath(epath.Path(data_dir) / f"{split}.tsv")
    if not epath.Path(path).exists():
      raise UserError(f"{path} not found: data.data_dir must hold the GLUE {name} TSVs "
                      f"(train.tsv, dev{spec.splits[0]}.tsv, ...)")
    rows = read_tsv(path, spec, config.data.strict, labelled=not split.startswith("test"))
  else:
    path = f"tfds glue/{name} {split}"
    rows = read_tfds(name, split.replace("dev", "validation"), spec, config.data.tfds_data_dir)
  if not rows:
    raise UserError(f"{path}: no rows")
  return rows


def _label_value(spec: GlueSpec, label: str | None):
  if label is None:
    return None
  if not spec.labels:
    return float(label)
  if label not in spec.labels:
    raise UserError(f"label {label!r} is not one of {spec.labels}")
  return spec.labels.index(label)


def featurize(rows, spec: GlueSpec, tokenizer, max_len: int, limit: int = 0) -> dict[str, np.ndarray]:
  rows = rows[:limit] if limit else rows
  encoded = [feats.encode_pair(tokenizer, tokenizer.encode(a), tokenizer.encode(b) if b is not None else None,
                               max_len) for a, b, _ in rows]
  labels = [_label_value(spec, label) for *_, label in rows]
  dtype = np.float32 if not spec.labels else np.int32
  return feats.stack(encoded, label=np.array([0 if l is None else l for l in labels], dtype))


def predictions_from(outputs: dict[str, np.ndarray], spec: GlueSpec) -> np.ndarray:
  logits = outputs["logits"]
  return logits if not spec.labels else np.argmax(logits, axis=-1)


def evaluate(features, outputs, spec: GlueSpec) -> dict:
  """The task's metrics and the dev loss (as training computes it; successive halving breaks ties
  with it); a "note" says why a correlation reads 0.0 when it is undefined."""
  keep = features["example_weight"] > 0
  predictions, labels = predictions_from(outputs, spec)[keep], features["label"][keep]
  results = {name: _METRICS[name](labels, predictions) for name in spec.metrics}
  logits = outputs["logits"][keep]
  results["loss"] = (metrics.cross_entropy(labels, logits) if spec.labels
                     else metrics.squared_error(labels, logits))
  note = metrics.correlation_note(labels, predictions) if "pearson" in spec.metrics else None
  return {**results, "note": note} if note else results


def write_predictions(directory: str, file_name: str, features, outputs, spec: GlueSpec) -> None:
  """`index<TAB>prediction` rows in input order: label strings, or STS-B scores clipped to [0, 5]."""
  keep = features["example_weight"] > 0
  predictions = predictions_from(outputs, spec)[keep]
  rows = [f"{i}\t{spec.labels[int(p)] if spec.labels else f'{float(np.clip(p, 0, 5)):.3f}'}\n"
          for i, p in enumerate(predictions)]
  workdir.write_text(epath.Path(directory) / file_name, "index\tprediction\n" + "".join(rows))


def eval_set(config, spec: GlueSpec, tokenizer, rows, name: str, file_name: str) -> EvalSet:
  features = feats.pad_to_multiple(
      featurize(rows, spec, tokenizer, feats.input_length(config), config.data.eval_limit),
      config.train.eval_batch_size)
  labelled = all(label is not None for *_, label in rows)
  return EvalSet(
      name=name, features=features,
      evaluate=(lambda out: evaluate(features, out, spec)) if labelled else (lambda out: {}),
      write_predictions=lambda directory, out: write_predictions(directory, file_name, features, out, spec))


def _split_eval_set(config, spec: GlueSpec, tokenizer, split: str, suffix: str) -> EvalSet:
  board = spec.leaderboard + {"_matched": "-m", "_mismatched": "-mm"}.get(suffix, "")
  file_name = f"{board}.tsv" if split == "test" else f"{board}.{split}.tsv"
  return eval_set(config, spec, tokenizer, _read_split(config, spec, split + suffix), split + suffix,
                  file_name)


def build(config: ml_collections.ConfigDict, tokenizer, *, need_train: bool) -> Task:
  name = config.task.name
  if name not in SPECS:
    raise UserError(f"task.name={name!r} is not a GLUE task; choose one of {sorted(SPECS)}")
  spec = SPECS[name]
  train = None
  if need_train:
    train = featurize(_read_split(config, spec, "train"), spec, tokenizer, feats.input_length(config),
                      config.data.train_limit)
  evals = [_split_eval_set(config, spec, tokenizer, "dev", s) for s in spec.splits]
  tests = [_split_eval_set(config, spec, tokenizer, "test", s) for s in spec.splits] \
      if config.predict_split == "test" else []
  return Task(name=name, head="classification" if spec.labels else "regression",
              num_labels=max(len(spec.labels), 1), train=train, evals=evals, tests=tests,
              selection=spec.metrics, labels=spec.labels)
