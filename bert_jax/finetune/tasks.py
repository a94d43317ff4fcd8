"""What a fine-tuning task hands the trainer: training features, eval sets that score model outputs,
and the head it needs. Each family module (glue, squad, ner, embedded) builds one from the config;
task_registry.py picks the module."""
from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from bert_jax.models import head_kinds

HEADS = head_kinds.names()  # models/head_kinds.py registers each kind


@dataclasses.dataclass
class EvalSet:
  """Rows to run the model on, and what to do with its outputs (numpy, one row per feature row).

  evaluate(outputs) -> {metric: value}; write_predictions(directory, outputs) writes the submission
  file(s). Sets built from unlabelled (test) splits evaluate to {}.
  """
  name: str
  features: dict[str, np.ndarray]
  evaluate: Callable[[dict[str, np.ndarray]], dict[str, float]]
  write_predictions: Callable[[str, dict[str, np.ndarray]], None]


@dataclasses.dataclass
class Task:
  name: str
  head: str
  num_labels: int
  train: dict[str, np.ndarray] | None
  evals: list[EvalSet]
  tests: list[EvalSet]
  selection: tuple[str, ...]
  labels: tuple[str, ...] = ()  # class names by id (classification, token); () for regression and spans


def score(task: Task, metrics: dict[str, float]) -> float:
  """The number model selection maximises, from the first eval set's metrics: the mean of the task's
  selection metrics (GLUE's rule: MRPC averages F1 and accuracy, STS-B Pearson and Spearman)."""
  return float(np.mean([metrics[k] for k in task.selection])) if metrics else float("nan")


def merge_metrics(per_set: dict[str, dict[str, float]]) -> dict[str, float]:
  """One eval set: its metrics as they are; several (MNLI): keys prefixed with the set name."""
  if len(per_set) == 1:
    return dict(next(iter(per_set.values())))
  return {f"{name}/{k}": v for name, metrics in per_set.items() for k, v in metrics.items()}
