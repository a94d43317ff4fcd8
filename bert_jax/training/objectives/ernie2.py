"""ERNIE 2.0's continual multi-task pretraining (Sun et al. 2019, "ERNIE 2.0: A Continual Pre-training
Framework for Language Understanding"): one BERT encoder, a head per task, tasks that enter in stages.

Tasks (TASKS; their labels come from the text when the rows are built: data_pipelines/ernie.py):
- word-aware: `mlm` (knowledge masking, data.masking=knowledge, through the tied MLM layer), `capital`
  (per token: does its word start with a capital letter) and `token_doc` (per token: does it appear in
  its document outside the row), each a 2-way dense layer on the last hidden state;
- structure-aware: `reorder` (which of the 9 orders of 1..3 shuffled pieces) and `distance` (B next to
  A, elsewhere in A's document, or from another document), dense layers on the pooled output;
- semantic-aware: the paper's discourse relation and IR relevance need labelled data no public corpus
  has; `ernie.labelled` plugs in files of labelled sentences (pairs) as extra classification tasks
  (`LabelledTask`), each a dense layer on the pooled output.

The schedule (`Schedule`, `ernie.stages`): stages start at given steps; a stage trains on its tasks, which
include every task of the stages before it (continual: none is dropped), and draws one task per batch
with the stage's weights from a generator seeded by (train.seed, step). The task of each row reaches the
objective as `task_ids` (int32[B]; added by `TaskFeed` in front of the input, and read by the task
embeddings, model.num_tasks), so a resumed run draws the same tasks as an uninterrupted one, across stage
boundaries too. The training loss is the drawn task's mean loss over its rows. Every task is scored on every
batch (the heads are cheap next to the encoder): the drawn task's loss and accuracy over its rows, each other
task's over every row with its labels (read through another task's embedding). A held-out batch gives its rows
the last stage's corpus tasks in turn (`TaskFeed` on the eval split), so each task is scored on its own rows
and the loss is the sum of those tasks' mean losses.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from bert_jax.data_pipelines import ernie as ernie_data
from bert_jax.errors import UserError
from bert_jax.models.bert import ModelOutput, dense
from bert_jax.models.config import ModelConfig
from bert_jax.training.objectives.base import Batch, BatchFeed, model_inputs, token_nll_and_correct
from bert_jax.training.objectives.bert import BertPretraining
from bert_jax.training.objectives.registry import register

WORD_TASKS = ("mlm", "capital", "token_doc")
STRUCTURE_TASKS = ("reorder", "distance")
TASKS = WORD_TASKS + STRUCTURE_TASKS  # the corpus tasks; task id = index (labelled tasks follow)
_TOKEN_LABELS = {"capital": "capital_labels", "token_doc": "token_doc_labels"}
_ROW_LABELS = {"reorder": ("reorder_labels", len(ernie_data.REORDER_CLASSES)),
               "distance": ("distance_labels", ernie_data.DISTANCE_CLASSES)}
HEADS = "ernie_heads"  # the task heads' params, beside the encoder's


@dataclasses.dataclass(frozen=True)
class LabelledTask:
  """A classification task read from a labelled file (ernie.py:read_labelled): `name:classes:path`."""
  name: str
  num_classes: int
  path: str

  @classmethod
  def parse(cls, spec: str) -> "LabelledTask":
    parts = spec.split(":", 2)
    if len(parts) != 3 or not parts[0].isidentifier() or not parts[1].isdigit() or int(parts[1]) < 2:
      raise UserError(f"ernie.labelled entry {spec!r}: write `name:num_classes:path` (a name like 'discourse', "
                      "at least 2 classes, a TSV of text<TAB>label or text_a<TAB>text_b<TAB>label)")
    if parts[0] in TASKS:
      raise UserError(f"ernie.labelled entry {spec!r}: {parts[0]!r} is a corpus task's name; pick another")
    return cls(parts[0], int(parts[1]), parts[2])


@dataclasses.dataclass(frozen=True)
class Stage:
  start: int  # the first step (1-based steps start + 1 on) of the stage
  weights: dict  # task name -> sampling weight


class Schedule:
  """Stages of tasks (`ernie.stages`: "START:task=weight,task=weight", START the step the stage starts after)
  and the task drawn for each step."""

  def __init__(self, specs, names: tuple[str, ...], seed: int):
    self.names, self.seed = names, seed
    self.stages = [self._parse(s, names) for s in specs]
    if not self.stages or self.stages[0].start != 0:
      raise UserError(f"ernie.stages={tuple(specs)}: the first stage must start at step 0 (\"0:mlm=1\")")
    for before, after in zip(self.stages, self.stages[1:]):
      if after.start <= before.start:
        raise UserError(f"ernie.stages={tuple(specs)}: stages must start at increasing steps")
      dropped = set(before.weights) - set(after.weights)
      if dropped:
        raise UserError(f"ernie.stages: the stage at step {after.start} drops {sorted(dropped)}; each stage trains "
                        "on all the tasks of the stages before it (continual multi-task learning)")

  @staticmethod
  def _parse(spec: str, names) -> Stage:
    start, _, tasks = spec.partition(":")
    weights = {}
    try:
      for item in tasks.split(","):
        name, _, weight = item.partition("=")
        weights[name.strip()] = float(weight or 1.0)
      stage = Stage(int(start), weights)
    except ValueError:
      raise UserError(f"ernie.stages entry {spec!r}: write \"START:task=weight,task=weight\", e.g. "
                      "\"1000:mlm=2,capital=1\"") from None
    unknown = [n for n in weights if n not in names]
    if unknown or min(weights.values()) <= 0:
      raise UserError(f"ernie.stages entry {spec!r}: tasks must be among {names} with weights > 0")
    return stage

  def stage_at(self, step: int) -> Stage:
    """The stage of (1-based) step `step`."""
    return [s for s in self.stages if s.start < step or s.start == 0][-1]

  def task_at(self, step: int) -> int:
    """The id of the task drawn for step `step`: a function of (seed, step) and the stages only."""
    stage = self.stage_at(step)
    names = list(stage.weights)
    p = np.array([stage.weights[n] for n in names], np.float64)
    rng = np.random.default_rng([self.seed & 0xFFFFFFFF, step])
    return self.names.index(names[int(rng.choice(len(names), p=p / p.sum()))])

  def final_tasks(self) -> list[int]:
    return [self.names.index(n) for n in self.stages[-1].weights]


class TaskFeed(BatchFeed):
  """The pretraining input with `task_ids` added to each batch: the task `schedule` draws for each step (first
  batch: step `first_step + 1`), or on the eval split the last stage's corpus tasks row by row. A drawn labelled
  task's batch takes its rows from the task's file instead (`labelled_labels`: its labels, -1 on corpus rows)."""

  def __init__(self, inputs, schedule: Schedule, first_step: int, split: str, labelled: dict,
               process_index: int = 0, process_count: int = 1):
    super().__init__(inputs, first_step, split)
    self._schedule, self._labelled, self._process = schedule, labelled, (process_index, process_count)

  def added(self, batch: dict) -> dict:
    rows = batch["input_ids"].shape[0]
    if self.split == "eval":
      tasks = [t for t in self._schedule.final_tasks() if t < len(TASKS)]
      batch["task_ids"] = np.array([tasks[r % len(tasks)] for r in range(rows)], np.int32)
    else:
      batch["task_ids"] = np.full((rows,), self._schedule.task_at(self.step), np.int32)
    if self._labelled:
      batch["labelled_labels"] = np.full((rows,), -1, np.int32)
      name = self._schedule.names[int(batch["task_ids"][0])]
      if self.split != "eval" and name in self._labelled:
        batch.update(self._labelled_rows(batch, self._labelled[name], rows))
    return batch

  def _labelled_rows(self, batch: dict, data: dict, rows: int) -> dict:
    """The step's rows of a labelled file: window (step, host) of a fresh permutation per pass over it."""
    n = len(data["labels"])
    index, count = self._process
    first = (self.step * count + index) * rows
    order = {e: np.random.default_rng([self._schedule.seed & 0xFFFFFFFF, 1, e]).permutation(n)
             for e in range(first // n, (first + rows - 1) // n + 1)}
    take = np.array([order[i // n][i % n] for i in range(first, first + rows)])
    out = {k: v[take] for k, v in data.items() if k != "labels"}
    out["labelled_labels"] = data["labels"][take]
    for name, value in batch.items():  # corpus features the file has not: nothing to predict there
      if name not in out and name not in ("task_ids", "labelled_labels"):
        out[name] = np.zeros_like(value) if name.startswith(("masked_lm", "knowledge")) else np.full_like(value, -1)
    out["next_sentence_labels"] = np.zeros_like(batch["next_sentence_labels"])
    return out


def _gate(batch: Batch, task: int, rows: int) -> jax.Array:
  """f32[B]: 1 on the rows of `task` (every row when the batch has no task_ids)."""
  if "task_ids" not in batch:
    return jnp.ones((rows,), jnp.float32)
  return (batch["task_ids"] == task).astype(jnp.float32)


class Ernie2Pretraining(BertPretraining):
  """The encoder (with task embeddings when model.num_tasks) and one head per task; see the module docstring."""

  def __init__(self, model_config: ModelConfig, labelled: tuple[LabelledTask, ...] = ()):
    super().__init__(model_config)
    self.labelled = labelled
    self.names = TASKS + tuple(t.name for t in labelled)
    sizes = {"capital": 2, "token_doc": 2, **{k: n for k, (_, n) in _ROW_LABELS.items()},
             **{t.name: t.num_classes for t in labelled}}
    self.heads = {name: dense(model_config, n, ("embed", "classes"), name) for name, n in sizes.items()}

  def init(self, rng: jax.Array, batch: Batch) -> Any:
    bert_rng, head_rng = jax.random.split(rng)
    rows = batch["input_ids"].shape[0]
    params = super().init(bert_rng, {**batch, "task_ids": jnp.zeros((rows,), jnp.int32)})
    x = jnp.zeros((rows, self.config.hidden_size))
    heads = {name: head.init(r, x)["params"]
             for (name, head), r in zip(self.heads.items(), jax.random.split(head_rng, len(self.heads)))}
    return {**params, HEADS: heads}

  def apply(self, params: Any, batch: Batch, rng: jax.Array | None, deterministic: bool) -> ModelOutput:
    rngs = None if deterministic else {"dropout": rng}
    return self.model.apply({"params": params}, **model_inputs(batch), task_ids=batch.get("task_ids"),
                            deterministic=deterministic, rngs=rngs)

  def backbone(self, params: Any) -> Any:
    return super().backbone({k: v for k, v in params.items() if k != HEADS})

  def _targets(self, batch: Batch) -> dict[str, tuple[jax.Array, jax.Array]]:
    """task -> (labels, weights) with the labels' shape; weights 0 where a row or token has no label."""
    out = {"mlm": (batch["masked_lm_ids"], batch["masked_lm_weights"].astype(jnp.float32))}
    for task, name in {**_TOKEN_LABELS, **{k: v for k, (v, _) in _ROW_LABELS.items()}}.items():
      if name in batch:
        labels = batch[name]
        out[task] = (jnp.maximum(labels, 0), (labels >= 0).astype(jnp.float32))
    for t in self.labelled:
      if "labelled_labels" in batch and "task_ids" in batch:
        labels = batch["labelled_labels"]
        valid = (labels >= 0) & (batch["task_ids"] == self.names.index(t.name))
        out[t.name] = (jnp.maximum(labels, 0), valid.astype(jnp.float32))
    return out

  def counts(self, batch: Batch) -> dict[str, jax.Array]:
    rows = batch["input_ids"].shape[0]
    counts = {"rows": jnp.asarray(rows, jnp.float32)}
    for task, (_, weights) in self._targets(batch).items():
      gate = _gate(batch, self.names.index(task), rows).reshape((rows,) + (1,) * (weights.ndim - 1))
      counts[task] = jnp.sum(weights)
      counts[f"{task}_drawn"] = jnp.sum(weights * gate)
    return counts

  def sums(self, params: Any, batch: Batch, rng: jax.Array | None, deterministic: bool
           ) -> dict[str, jax.Array]:
    out = self.apply({k: v for k, v in params.items() if k != HEADS}, batch, rng, deterministic)
    rows = batch["input_ids"].shape[0]
    heads = params[HEADS]
    sums = {}
    for task, (labels, weights) in self._targets(batch).items():
      if task == "mlm":
        logits = out.mlm_logits
      else:
        x = out.last_hidden_state if task in _TOKEN_LABELS else out.pooled_output
        logits = self.heads[task].apply({"params": heads[task]}, x)
      nll, correct = token_nll_and_correct(logits, labels)
      gate = _gate(batch, self.names.index(task), rows).reshape((rows,) + (1,) * (weights.ndim - 1))
      sums.update({f"{task}_loss": jnp.sum(nll * weights), f"{task}_correct": jnp.sum(correct * weights),
                   f"{task}_drawn_loss": jnp.sum(nll * weights * gate),
                   f"{task}_drawn_correct": jnp.sum(correct * weights * gate)})
    return sums

  def _tasks(self, counts):
    return [t for t in self.names if t in counts]

  def loss(self, sums: dict[str, jax.Array], counts: dict[str, jax.Array]) -> jax.Array:
    """The drawn task's mean loss (with several tasks in one batch: the sum of their means)."""
    return sum(sums[f"{t}_drawn_loss"] / jnp.maximum(counts[f"{t}_drawn"], 1.0) for t in self._tasks(counts))

  def metrics(self, sums: dict[str, jax.Array], counts: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """Each task's loss and accuracy over the rows given its task (its embedding) when there are any (the drawn
    task; on held-out batches each task's share of the rows), else over every row with its labels."""
    metrics = {}
    for t in self._tasks(counts):
      drawn = counts[f"{t}_drawn"] > 0
      n = jnp.maximum(jnp.where(drawn, counts[f"{t}_drawn"], counts[t]), 1.0)
      for stat, name in (("loss", "loss"), ("correct", "accuracy")):
        metrics[f"{t}_{name}"] = jnp.where(drawn, sums[f"{t}_drawn_{stat}"], sums[f"{t}_{stat}"]) / n
    return metrics

  def feed(self, inputs, first_step: int, split: str, config: ml_collections.ConfigDict,
           process_index: int = 0, process_count: int = 1) -> TaskFeed:
    """`inputs` with each batch's task_ids (TaskFeed), for the run of `config` from step `first_step`."""
    schedule = Schedule(config.ernie.stages, self.names, config.train.seed)
    labelled = {}
    if split == "train":
      tokenizer, length = inputs.tokenizer, config.data.max_seq_length
      special = tokenizer.special_ids
      labelled = {t.name: ernie_data.read_labelled(t.path, tokenizer.encode, special["[CLS]"], special["[SEP]"],
                                                   length, t.num_classes) for t in self.labelled}
    elif self.labelled:
      labelled = {t.name: None for t in self.labelled}  # eval: corpus tasks only, labelled_labels all -1
    return TaskFeed(inputs, schedule, first_step, split, labelled, process_index, process_count)


@register("ernie2")
def from_config(config: ml_collections.ConfigDict, model_config: ModelConfig) -> Ernie2Pretraining:
  """ERNIE 2.0 from a run config (configs/ernie.py), after checking its data, heads and schedule."""
  if "ernie" not in config:
    raise UserError("objective='ernie2' needs an `ernie` block (stages, labelled): start from configs/ernie.py")
  if config.data.example_builder != "ernie":
    raise UserError(f"objective='ernie2' needs data.example_builder='ernie' (its tasks' labels), got "
                    f"{config.data.example_builder!r}")
  if not (model_config.mlm_head and model_config.use_pooler) or model_config.sentence_head != "none":
    raise UserError("objective='ernie2' needs model.mlm_head=True, model.use_pooler=True and "
                    "model.sentence_head='none' (it adds its own heads)")
  labelled = tuple(LabelledTask.parse(s) for s in config.ernie.labelled)
  objective = Ernie2Pretraining(model_config, labelled)
  if model_config.num_tasks not in (0, len(objective.names)):
    raise UserError(f"model.num_tasks={model_config.num_tasks}: the task embeddings need one row per task, "
                    f"{len(objective.names)} here ({', '.join(objective.names)}); or 0 for none")
  Schedule(config.ernie.stages, objective.names, config.train.seed)  # checked now, not at the first batch
  return objective
