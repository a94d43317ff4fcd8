"""Text-to-text examples for T5 (the building blocks of a seq2seq fine-tuning task; the job itself is not built).

GLUE recast as T5 does (t5.data.preprocessors.glue): the task's name, then each text field as "key: text" in
sorted key order ("sst2 sentence: ...", "mnli hypothesis: ... premise: ..."), and the label's name as the
target ("positive", "not_entailment"); STS-B's score rounded to the nearest 0.2 and written with one decimal.
Source/target text files are read line by line. Targets and sources end with </s>; a target longer than the
decoder's length is refused in one line (it would be cut and its </s> lost). Metrics read the generated strings:
exact match (accuracy for a recast classification task).
"""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from bert_jax.errors import UserError

# T5's label names by GLUE task (the tfds label order); STS-B is a regression written as text.
LABEL_NAMES = {
    "cola": ("unacceptable", "acceptable"),
    "sst2": ("negative", "positive"),
    "mrpc": ("not_equivalent", "equivalent"),
    "qqp": ("not_duplicate", "duplicate"),
    "mnli": ("entailment", "neutral", "contradiction"),
    "qnli": ("entailment", "not_entailment"),
    "rte": ("entailment", "not_entailment"),
    "wnli": ("not_entailment", "entailment"),
}


def glue_example(task: str, example: dict) -> tuple[str, str]:
  """(source, target) of one GLUE example (tfds field names: sentence, premise, ..., label; idx ignored)."""
  if task not in LABEL_NAMES and task != "stsb":
    raise UserError(f"text-to-text GLUE task {task!r} is not one of {sorted([*LABEL_NAMES, 'stsb'])}")
  fields = sorted(k for k in example if k not in ("idx", "label"))
  source = " ".join([task, *(f"{k}: {example[k]}" for k in fields)])
  label = example["label"]
  if task == "stsb":
    return source, f"{round(float(label) * 5) / 5:.1f}"
  return source, "<unk>" if int(label) < 0 else LABEL_NAMES[task][int(label)]


def read_pairs(source_file: str, target_file: str) -> list[tuple[str, str]]:
  """(source, target) per line of two text files of the same number of lines."""
  with open(source_file, encoding="utf-8") as f:
    sources = [line.rstrip("\n") for line in f]
  with open(target_file, encoding="utf-8") as f:
    targets = [line.rstrip("\n") for line in f]
  if len(sources) != len(targets):
    raise UserError(f"{source_file} has {len(sources)} lines and {target_file} {len(targets)}: a seq2seq task "
                    "pairs line i of the sources with line i of the targets")
  return list(zip(sources, targets))


def encode_pairs(pairs: Iterable[tuple[str, str]], tokenizer, max_source_length: int, max_target_length: int
                 ) -> dict[str, np.ndarray]:
  """Padded int32 arrays: input_ids, attention_mask [N, max_source_length] (sources cut, </s> kept last),
  labels [N, max_target_length] (0 padding) and decoder_input_ids (labels shifted right, 0 first). A target
  (with its </s>) longer than max_target_length is a UserError naming it."""
  pairs = list(pairs)
  eos = tokenizer.eos_id
  inputs = np.zeros((len(pairs), max_source_length), np.int32)
  mask = np.zeros_like(inputs)
  labels = np.zeros((len(pairs), max_target_length), np.int32)
  for i, (source, target) in enumerate(pairs):
    src = tokenizer.encode(source)[:max_source_length - 1] + [eos]
    tgt = tokenizer.encode(target) + [eos]
    if len(tgt) > max_target_length:
      raise UserError(f"target {i + 1} ({target[:40]!r}) is {len(tgt)} tokens with its </s>, longer than the "
                      f"decoder's length {max_target_length}: raise the target length or shorten the target")
    inputs[i, :len(src)] = src
    mask[i, :len(src)] = 1
    labels[i, :len(tgt)] = tgt
  decoder_inputs = np.zeros_like(labels)
  decoder_inputs[:, 1:] = labels[:, :-1]
  return {"input_ids": inputs, "attention_mask": mask, "labels": labels, "decoder_input_ids": decoder_inputs}


def exact_match(predictions: Sequence[str], references: Sequence[str]) -> float:
  """The share of generated strings equal to their reference (surrounding spaces ignored): T5's accuracy for
  recast classification tasks, exact match for others."""
  if len(predictions) != len(references) or not references:
    raise ValueError(f"{len(predictions)} predictions for {len(references)} references")
  return float(np.mean([p.strip() == r.strip() for p, r in zip(predictions, references)]))
