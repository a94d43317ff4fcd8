"""A pair classification task trained as pairwise ranking (MT-DNN's QNLI, Liu et al. 2019 sec. 3 and 4; their
code's "Ranking" task type): `task.head=ranking` with `task.ranking.{group_size, scale, positive}`.

Groups: the rows whose first segment (the question's tokens, token_type_ids 0) is the same form one group,
numbered by first appearance (a question truncated differently beside a long candidate falls in a group of its
own). Rows of the positive label (task.ranking.positive; "": the task's first label, QNLI's entailment) are
the positives.
  training: each positive with up to group_size - 1 of its question's negatives, the negatives cut into
    chunks of group_size - 1 (and a question's positives and chunks paired round-robin until each is used);
    short groups are padded with masked copies of the positive (candidate_mask 0). Questions without a
    positive or without a negative teach ranking nothing and are left out (a count is logged). Features:
    input_ids, attention_mask, token_type_ids [G, K, T], label [G] (the positive's index: 0), candidate_mask
    float32[G, K], scale float32[G] (task.ranking.scale, gamma). train.batch_size counts groups, as MT-DNN's
    batches count samples (with group_size 2, MT-DNN's pairs: one positive, one negative); with
    data.length_buckets a group goes to the bucket of its longest row (finetune/batching.py).
  the loss (models/head_kinds.py `ranking`): -log(exp(g Rel(Q, A+)) / sum_{A' in the group} exp(g Rel(Q, A'))).
  evaluation and predict: every (question, candidate) row is scored alone, Rel = w^T x; within each question's
    whole group (all its rows, not cut to group_size) the top-scored row is predicted positive and the others
    negative, as MT-DNN's ranking task predicts (argmax within the group; the first row on ties), then the
    task's own metrics (GLUE's accuracy). The dev loss is the ranking loss over the questions with exactly one
    positive.
"""
from __future__ import annotations

import dataclasses
import logging

import ml_collections
import numpy as np

from bert_jax.errors import UserError
from bert_jax.finetune.features import MODEL_INPUTS
from bert_jax.finetune.tasks import EvalSet, Task

HEAD = "ranking"


@dataclasses.dataclass(frozen=True)
class Settings:
  group_size: int
  scale: float
  positive: int  # the label index of a positive row; the other of the two labels is the negative's
  negative: int


def settings(config: ml_collections.ConfigDict, task: Task) -> Settings:
  """task.ranking's values for this task, checked."""
  block = config.task.get("ranking") or ml_collections.ConfigDict()
  if task.head != "classification" or len(task.labels) != 2:
    raise UserError(f"task.head=ranking ranks the rows of a two-label pair classification task; task "
                    f"{task.name} has head {task.head!r} and labels {task.labels}")
  positive = block.get("positive", "") or task.labels[0]
  if positive not in task.labels:
    raise UserError(f"task.ranking.positive={positive!r} is not one of task {task.name}'s labels {task.labels}")
  group_size, scale = int(block.get("group_size", 2)), float(block.get("scale", 1.0))
  if group_size < 2:
    raise UserError(f"task.ranking.group_size={group_size} must be >= 2 (a positive and at least one negative)")
  if not scale > 0:
    raise UserError(f"task.ranking.scale={scale} must be > 0")
  index = task.labels.index(positive)
  return Settings(group_size, scale, index, 1 - index)


def group_ids(features: dict[str, np.ndarray]) -> np.ndarray:
  """int32[N]: one id per distinct first segment (the question), numbered by first appearance; rows with
  example_weight 0 (padding of the last eval batch) each get an id of their own, after the others."""
  ids, mask, types = (np.asarray(features[k]) for k in ("input_ids", "attention_mask", "token_type_ids"))
  weight = features.get("example_weight", np.ones(len(ids), np.float32))
  keys: dict[bytes, int] = {}
  out = np.empty(len(ids), np.int32)
  for i in np.flatnonzero(weight > 0):
    out[i] = keys.setdefault(ids[i][(types[i] == 0) & (mask[i] > 0)].tobytes(), len(keys))
  padding = np.flatnonzero(weight <= 0)
  out[padding] = len(keys) + np.arange(len(padding))
  return out


def to_labels(scores: np.ndarray, groups: np.ndarray, positive: int, negative: int) -> np.ndarray:
  """int32[N]: within each group the top-scored row (the first on ties) `positive`, every other row `negative`."""
  scores, groups = np.asarray(scores, np.float64), np.asarray(groups)
  order = np.lexsort((-scores, groups))  # by group, then score descending; stable, so ties keep row order
  first = np.r_[True, groups[order][1:] != groups[order][:-1]]
  labels = np.full(len(scores), negative, np.int32)
  labels[order[first]] = positive
  return labels


def group_rows(features: dict[str, np.ndarray], s: Settings) -> dict[str, np.ndarray]:
  """Training groups from pair rows (the module docstring): [G, K, T] inputs, label, candidate_mask, scale."""
  groups, labels = group_ids(features), np.asarray(features["label"])
  members: dict[int, list[int]] = {}
  for row, group in enumerate(groups):
    members.setdefault(int(group), []).append(row)
  chosen, masks, left_out = [], [], 0
  for rows in members.values():
    positives = [r for r in rows if labels[r] == s.positive]
    negatives = [r for r in rows if labels[r] != s.positive]
    if not positives or not negatives:
      left_out += 1
      continue
    chunks = [negatives[i:i + s.group_size - 1] for i in range(0, len(negatives), s.group_size - 1)]
    for j in range(max(len(positives), len(chunks))):
      p, chunk = positives[j % len(positives)], chunks[j % len(chunks)]
      pad = s.group_size - 1 - len(chunk)
      chosen.append([p, *chunk] + [p] * pad)
      masks.append([1.0] * (1 + len(chunk)) + [0.0] * pad)
  if left_out:
    logging.info("ranking: %d of %d questions have no positive or no negative row; left out of training",
                 left_out, len(members))
  if not chosen:
    raise UserError("task.head=ranking: no question has both a positive and a negative training row, so "
                    "there is nothing to rank (the rows of one question share their first segment)")
  index = np.asarray(chosen)
  out = {k: np.asarray(features[k])[index] for k in MODEL_INPUTS}
  out.update(label=np.zeros(len(index), np.int32), candidate_mask=np.asarray(masks, np.float32),
             scale=np.full(len(index), s.scale, np.float32))
  return out


def dev_loss(scores: np.ndarray, labels: np.ndarray, groups: np.ndarray, keep: np.ndarray, s: Settings) -> float:
  """The ranking loss, mean over the kept groups with exactly one positive row (nan if there are none)."""
  losses = []
  for group in np.unique(groups[keep]):
    rows = np.flatnonzero((groups == group) & keep)
    positives = rows[labels[rows] == s.positive]
    if len(positives) == 1 and len(rows) > 1:
      z = s.scale * scores[rows].astype(np.float64)
      losses.append(float(np.logaddexp.reduce(z) - s.scale * scores[positives[0]]))
  return float(np.mean(losses)) if losses else float("nan")


def ranked_eval_set(eval_set: EvalSet, s: Settings) -> EvalSet:
  """The eval set scored row by row and converted per group; its own metrics and prediction file then
  read the converted labels (as one-hot logits)."""
  features = eval_set.features
  groups = group_ids(features)
  keep = features.get("example_weight", np.ones(len(groups), np.float32)) > 0

  def converted(outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    predicted = to_labels(outputs["logits"], groups, s.positive, s.negative)
    return {"logits": np.eye(2, dtype=np.float32)[predicted]}

  def evaluate(outputs: dict[str, np.ndarray]) -> dict[str, float]:
    results = eval_set.evaluate(converted(outputs))
    if results:
      results["loss"] = dev_loss(np.asarray(outputs["logits"]), np.asarray(features["label"]), groups, keep, s)
    return results

  return EvalSet(name=eval_set.name, features=features, evaluate=evaluate,
                 write_predictions=lambda directory, outputs: eval_set.write_predictions(directory,
                                                                                         converted(outputs)))


def rank(config: ml_collections.ConfigDict, task: Task) -> Task:
  """The task (a two-label pair classification task as its module built it) as a ranking task."""
  s = settings(config, task)
  if config.get("smart") is not None and config.smart.enabled:
    raise UserError("task.head=ranking: SMART (smart.enabled) perturbs rows, not groups of rows; not available")
  for eval_set in task.evals:
    if not np.any(np.asarray(eval_set.features["token_type_ids"])):
      raise UserError(f"task.head=ranking ranks (question, candidate) pairs; task {task.name}'s rows are single "
                      "sentences")
  return dataclasses.replace(task, head=HEAD, num_labels=1,
                             train=None if task.train is None else group_rows(task.train, s),
                             evals=[ranked_eval_set(e, s) for e in task.evals],
                             tests=[ranked_eval_set(e, s) for e in task.tests])

