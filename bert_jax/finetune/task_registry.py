"""The fine-tuning tasks by family (a config's `task.family`): the module that builds each one; and the heads a
task may be trained with instead of its own (`task.head`): the module that re-shapes the task for each."""
from __future__ import annotations

import ml_collections

from bert_jax.errors import UserError
from bert_jax.finetune.tasks import HEADS, Task


def build_task(config: ml_collections.ConfigDict, tokenizer, *, need_train: bool) -> Task:
  # Imported here: each family pulls its own readers, and only the one asked for is needed.
  from bert_jax.finetune import embedded, glue, ner, ranking, squad  # pylint: disable=import-outside-toplevel
  builders = {"glue": glue.build, "squad": squad.build, "ner": ner.build, "embedded": embedded.build}
  # task.head: "" (or the task's own head) trains the task as its module builds it; these re-shape it
  reshapers = {ranking.HEAD: ranking.rank}
  family = config.task.family
  if family not in builders:
    raise UserError(f"task.family={family!r} is not one of {sorted(builders)}")
  task = builders[family](config, tokenizer, need_train=need_train)
  head = config.task.get("head", "") or task.head
  if head != task.head:
    if head not in reshapers:
      raise UserError(f"task.head={head!r}: task {task.name} trains with its own head ({task.head!r}) or one of "
                      f"{sorted(reshapers)}")
    task = reshapers[head](config, task)
  if task.head not in HEADS:
    raise UserError(f"task {task.name} asks for head {task.head!r}, not one of {HEADS}")
  return task
