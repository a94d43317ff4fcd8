"""The fine-tuning tasks by family (a config's `task.family`): the module that builds each one."""
from __future__ import annotations

import ml_collections

from bert_jax.errors import UserError
from bert_jax.finetune.tasks import HEADS, Task


def build_task(config: ml_collections.ConfigDict, tokenizer, *, need_train: bool) -> Task:
  # Imported here: each family pulls its own readers, and only the one asked for is needed.
  from bert_jax.finetune import embedded, glue, ner, squad  # pylint: disable=import-outside-toplevel
  builders = {"glue": glue.build, "squad": squad.build, "ner": ner.build, "embedded": embedded.build}
  family = config.task.family
  if family not in builders:
    raise UserError(f"task.family={family!r} is not one of {sorted(builders)}")
  task = builders[family](config, tokenizer, need_train=need_train)
  if task.head not in HEADS:
    raise UserError(f"task {task.name} asks for head {task.head!r}, not one of {HEADS}")
  return task
