"""A fine-tuned workdir as head importance needs it: its model, dev set, per-example loss and dev score.

Everything task-specific comes from the fine-tuning code's public functions (the task registry, the
head model, its objective's loss, the score model selection maximises), so an analysis scores a model
exactly as `bert-jax finetune` does.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from bert_jax import params_checkpoint
from bert_jax.errors import UserError
from bert_jax.finetune import heads, task_registry, tasks
from bert_jax.finetune.objective import FinetuneObjective
from bert_jax.models.config import ModelConfig


@dataclasses.dataclass
class FineTuned:
  path: str
  config: ModelConfig
  objective: FinetuneObjective
  params: Any
  task: tasks.Task
  batch_size: int

  @property
  def dev(self) -> tasks.EvalSet:
    return self.task.evals[0]


def load(path: str, eval_limit: int = 0) -> FineTuned:
  """The workdir's model and task (dev set capped at `eval_limit` examples when > 0)."""
  import bert_jax  # pylint: disable=import-outside-toplevel
  params, saved = params_checkpoint.load_params(path)
  if "head" not in params or "task" not in saved:
    raise UserError(f"{path} has no fine-tuning head (task); head importance needs a workdir of "
                    "`bert-jax finetune` (a pretrained or converted checkpoint has no task loss)")
  config = ml_collections.ConfigDict(saved)
  if eval_limit:
    config.data.eval_limit = eval_limit
  task = task_registry.build_task(config, bert_jax.load_tokenizer(path), need_train=False)
  model_config = ModelConfig.from_dict(saved["model"]).replace(hidden_dropout=0.0, attention_dropout=0.0)
  model = heads.FinetuneModel(model_config, task.head, task.num_labels, config.head.pooling, 0.0,
                              config.head.get("cls_norm", "none"))
  return FineTuned(path, model_config, FinetuneObjective(model), params, task, config.train.eval_batch_size)


@functools.partial(jax.jit, static_argnums=0)
def _example_gradients(objective: FinetuneObjective, params: Any, batch: dict, head_mask: jax.Array
                       ) -> jax.Array:
  """d loss(x) / d head_mask for each example x of the batch: [B, L, N]."""

  def loss(mask, example):
    one = jax.tree.map(lambda x: x[None], example)
    return objective.loss(objective.sums(params, one, None, True, mask), objective.counts(one))

  return jax.vmap(jax.grad(loss), in_axes=(None, 0))(head_mask, batch)


@functools.partial(jax.jit, static_argnums=0)
def _predict(objective: FinetuneObjective, params: Any, batch: dict, head_mask: jax.Array) -> dict:
  return objective.apply(params, batch, head_mask=head_mask)


def dev_batches(ft: FineTuned):
  features = ft.dev.features
  for start in range(0, len(features["input_ids"]), ft.batch_size):
    yield {k: jnp.asarray(v[start:start + ft.batch_size]) for k, v in features.items()}


def mean_abs_gradient(ft: FineTuned, head_mask: np.ndarray) -> np.ndarray:
  """E_x |d loss(x) / d head_mask| over the dev set (padding rows left out): [L, N]."""
  total, count = 0.0, 0.0
  try:
    for batch in dev_batches(ft):
      weight = batch["example_weight"]
      grads = _example_gradients(ft.objective, ft.params, batch, jnp.asarray(head_mask, jnp.float32))
      total = total + np.asarray(jnp.einsum("bln,b->ln", jnp.abs(grads), weight))
      count += float(jnp.sum(weight))
  except KeyError as e:
    raise UserError(f"{ft.path}: the dev set of task {ft.task.name} has no {e} labels, which its loss "
                    "needs for head importance") from None
  return total / max(count, 1.0)


def dev_score(ft: FineTuned, head_mask: np.ndarray) -> float:
  """The dev score model selection uses (tasks.score), with `head_mask` applied."""
  mask = jnp.asarray(head_mask, jnp.float32)
  chunks = [jax.device_get(_predict(ft.objective, ft.params, batch, mask)) for batch in dev_batches(ft)]
  outputs = {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]}
  return tasks.score(ft.task, ft.dev.evaluate(outputs))
