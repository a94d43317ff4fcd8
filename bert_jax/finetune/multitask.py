"""Multi-task fine-tuning (MT-DNN, Liu et al. 2019; job `mtdnn`, `bert-jax finetune --config configs/mtdnn.py:...`):
one encoder shared by the tasks of `mtdnn.tasks`, each task with its own head from the task registry.

Each task is built as a single-task run builds it (finetune/task_registry.py), from a copy of the config
whose `task` block is that task's. The parameters are one tree: the encoder's keys as in any checkpoint
(embeddings, encoder, pooler) and the heads under `task_heads/<task>`.

Each step trains on a batch of ONE task:
  - task t is drawn with probability n_t / sum n (mtdnn.sampling=proportional) or n_t ** (1/T) / sum n ** (1/T)
    (temperature, T = mtdnn.temperature), n_t its training rows, from a NumPy generator seeded with
    (data seed, step): the draw of a step is a function of the step, so a resumed run draws as an
    uninterrupted one did, and the k-th batch of a task is its k-th in finetune/batching.py's order;
  - every task has its own jitted step (the task is static), so each task's shapes compile once; its loss
    is the head's loss times mtdnn.loss_weights.<task>;
  - only the encoder and the drawn task's head move: the other heads keep their values and optimizer
    moments (as PyTorch's optimizers skip the parameters without a gradient, which MT-DNN relies on; Adam's
    bias correction here counts the run's steps, PyTorch's each parameter's own).
An epoch is sum_t n_t // batch_size steps. Evaluation scores every task's dev set with its official metric;
the run's score (for keeping the best parameters and early stopping) is the mean of the tasks' scores.

The workdir is a fine-tuning workdir: config.json (the run config, the resolved model, the tokenizer, and
task.heads: each head's kind, size and labels), params/ (the encoder and task_heads), the tokenizer,
state/ (a paused or interrupted run: the same command resumes it exactly), metrics.jsonl, eval_results.json
({task: its dev metrics, ..., "score": the mean}), finished.json, predictions/<task>/. It is an init_from for
single-task fine-tuning (MT-DNN's second stage): finetune/init.py takes the encoder, and the task's head
from task_heads when its shapes fit; `predict --task` and `convert --to hf --task` read one task of it
(params_checkpoint.one_task).
A task block may train its task with another head: `head: ranking` (configs/mtdnn.py:glue's QNLI) is MT-DNN's
pairwise ranking (finetune/ranking.py): its batches are train.batch_size groups of one question's candidates.
Not (yet) here: SMART, train.mode adapters/feature, int8 training, eval_only and test-split predictions.
"""
from __future__ import annotations

import functools
import math
import os
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from bert_jax import config_schema, workdir as workdir_lib
from bert_jax.data_pipelines import tokenizer_kinds
from bert_jax.errors import UserError
from bert_jax.finetune import batching, heads, init, modes, optim
from bert_jax.finetune.objective import FinetuneObjective, predict_step
from bert_jax.finetune.task_registry import build_task
from bert_jax.finetune.tasks import Task, merge_metrics, score
from bert_jax.finetune.trainer import evaluate, seeds
from bert_jax.models import attention
from bert_jax.training import checkpoint, driver, partitioning, step as step_lib
from bert_jax.training.step import TrainSetup, sharded_setup

HEADS = init.MULTITASK_HEADS
SAMPLINGS = ("proportional", "temperature")


def probabilities(sizes: list[int], sampling: str, temperature: float) -> np.ndarray:
  """Each task's chance of being drawn: n_t / sum n, or n_t ** (1 / T) / sum n ** (1 / T)."""
  n = np.asarray(sizes, np.float64)
  weights = n if sampling == "proportional" else n ** (1.0 / temperature)
  return weights / weights.sum()


def task_at(step: int, seed: int, p: np.ndarray) -> int:
  """The index of the task that trains at step `step` (0-based): a function of (seed, step) alone."""
  return int(np.random.default_rng([seed, step]).choice(len(p), p=p))


class TaskStream:
  """The batches of steps [start, end): each step's task by `task_at`, then that task's next batch in its
  own order (finetune/batching.py, seed data seed + 1 + its index). `task` is the last batch's task,
  which the step that takes it reads."""

  def __init__(self, features: list[dict[str, np.ndarray]], batch_size: int, seed: int, p: np.ndarray,
               start: int, end: int, lengths: tuple[int, ...] = ()):
    self.seed, self.p, self.step, self.task = seed, p, start, -1
    done = np.bincount([task_at(s, seed, p) for s in range(start)], minlength=len(p))
    self.streams = [batching.train_batches(f, batch_size, seed + 1 + i, int(done[i]), int(done[i]) + end - start,
                                           lengths) for i, f in enumerate(features)]

  def __iter__(self) -> "TaskStream":
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    self.task = task_at(self.step, self.seed, self.p)
    self.step += 1
    return next(self.streams[self.task])


class TaskObjective:
  """One task's objective on the multi-task tree: its FinetuneObjective on the encoder and its head, the
  loss times its weight (training/step.py's objective interface)."""

  def __init__(self, inner: FinetuneObjective, name: str, weight: float):
    self.inner, self.name, self.weight = inner, name, weight

  def own(self, params: Any) -> dict:
    """The single-task tree: the encoder's keys and this task's head as `head`."""
    return {**{k: v for k, v in params.items() if k != HEADS}, "head": params[HEADS][self.name]}

  def apply(self, params: Any, batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
    return self.inner.apply(self.own(params), batch)

  def sums(self, params: Any, batch: dict[str, jax.Array], rng: jax.Array | None, deterministic: bool
           ) -> dict[str, jax.Array]:
    sums = self.inner.sums(self.own(params), batch, rng, deterministic)
    return {**sums, "loss": self.weight * sums["loss"]}

  def counts(self, batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
    return self.inner.counts(batch)

  def loss(self, sums: dict[str, jax.Array], counts: dict[str, jax.Array]) -> jax.Array:
    return self.inner.loss(sums, counts)

  def metrics(self, sums: dict[str, jax.Array], counts: dict[str, jax.Array]) -> dict[str, jax.Array]:
    return self.inner.metrics(sums, counts)


def keep_other_heads(old: Any, new: Any, task: str) -> Any:
  """`new` with every leaf under task_heads/<another task> (parameters, optimizer moments) taken from `old`."""
  def pick(path, o, n):
    names = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
    i = names.index(HEADS) if HEADS in names else -1
    return o if 0 <= i < len(names) - 1 and names[i + 1] != task else n
  return jax.tree_util.tree_map_with_path(pick, old, new)


def task_step(state: step_lib.TrainState, batch: dict[str, jax.Array], rng: jax.Array, *, task: str,
              **step_args) -> tuple[step_lib.TrainState, dict[str, jax.Array]]:
  """The shared train step on one task's batch; the other tasks' heads stay as they were."""
  new, metrics = step_lib.train_step(state, batch, rng, **step_args)
  return new.replace(params=keep_other_heads(state.params, new.params, task),
                     opt_state=keep_other_heads(state.opt_state, new.opt_state, task)), metrics


def task_config(config: ml_collections.ConfigDict, name: str) -> ml_collections.ConfigDict:
  """The config a single-task run of mtdnn.tasks.<name> would have: its task block, its data_dir."""
  from bert_jax.finetune import glue  # pylint: disable=import-outside-toplevel
  block = config.mtdnn.tasks[name].to_dict()
  data_dir = block.pop("data_dir", "")
  if not data_dir and config.data.data_dir and block["family"] == "glue" and block["name"] in glue.SPECS:
    data_dir = os.path.join(config.data.data_dir, glue.SPECS[block["name"]].leaderboard)
  out = config.to_dict()
  out.pop("mtdnn")
  out["task"] = block
  out["data"]["data_dir"] = data_dir or config.data.data_dir
  return ml_collections.ConfigDict(out)


def task_names(config: ml_collections.ConfigDict) -> list[str]:
  """The tasks the run trains, sorted: mtdnn.select's, or every one of mtdnn.tasks."""
  chosen = [name.strip() for name in config.mtdnn.get("select", "").split(",") if name.strip()]
  return sorted(chosen or config.mtdnn.tasks.keys())


def validate(config: ml_collections.ConfigDict) -> None:
  """The shared blocks, then the multi-task fields and what this job does not (yet) do."""
  config_schema.of(config, config_schema.DATASET).check(config)
  attention.check(config.model, config.data.max_seq_length)
  names, m = task_names(config), config.mtdnn
  if not names:
    raise UserError("mtdnn.tasks is empty: name at least one task")
  unknown = sorted(set(names) - set(m.tasks.keys()))
  if unknown:
    raise UserError(f"mtdnn.select names {unknown}, which are not in mtdnn.tasks ({sorted(m.tasks.keys())})")
  if m.sampling not in SAMPLINGS:
    raise UserError(f"mtdnn.sampling={m.sampling!r} is not one of {SAMPLINGS}")
  unknown = sorted(set(m.loss_weights.keys()) - set(m.tasks.keys()))
  if unknown:
    raise UserError(f"mtdnn.loss_weights names {unknown}, which are not in mtdnn.tasks ({sorted(m.tasks.keys())})")
  bad = {k: v for k, v in m.loss_weights.items() if not v >= 0}
  if bad:
    raise UserError(f"mtdnn.loss_weights {bad}: each weight must be >= 0")
  for name in names:
    if "family" not in m.tasks[name] or "name" not in m.tasks[name]:
      raise UserError(f"mtdnn.tasks.{name} needs a family and a name (a fine-tuning task block)")
  if config.predict_split not in ("", "dev"):
    raise UserError(f"predict_split={config.predict_split!r}: a multi-task run writes '' or dev predictions")
  refused = {"train.mode": config.train.mode != "finetune", "smart.enabled": config.smart.enabled,
             "train.qat": config.train.qat, "eval_only": config.eval_only}
  if any(refused.values()):
    raise UserError(f"{[k for k, v in refused.items() if v]}: not available in a multi-task run (job mtdnn)")
  if config.head.pooling not in heads.POOLINGS:
    raise UserError(f"head.pooling={config.head.pooling!r} is not one of {heads.POOLINGS}")
  batching.buckets(config.data.get("length_buckets", ()), config.data.max_seq_length)


class MultiTaskRun:
  """The multi-task job's learner (training/driver.py): the tasks' batches, each task's step, and the mean of
  the tasks' dev scores."""

  evaluates_start = False
  score_name = "mean of the tasks' scores"

  def __init__(self, config: ml_collections.ConfigDict, workdir):
    self.config, self.workdir = config, workdir_lib.path(workdir)
    self.names = task_names(config)
    self.configs = [task_config(config, name) for name in self.names]
    saved = workdir_lib.read_config(config.init_from) if config.init_from else None
    self.tokenizer = init.load_tokenizer(config)
    self.tasks: list[Task] = [build_task(c, self.tokenizer, need_train=True) for c in self.configs]
    for name, task in zip(self.names, self.tasks):
      if task.name != name:
        raise UserError(f"mtdnn.tasks.{name} builds task {task.name!r}: name each task block by its task's name")
      if len(task.train["input_ids"]) < config.train.batch_size:
        raise UserError(f"task {name}: {len(task.train['input_ids'])} training examples are fewer than "
                        f"train.batch_size={config.train.batch_size}")
    encoder = init.model_config(config, saved)
    kinds = {modes.model_config(heads.encoder_config(encoder, t.head, config.head.pooling), config.train)
             for t in self.tasks}
    if len(kinds) > 1:
      raise UserError(f"the tasks' heads ({[t.head for t in self.tasks]}) need different encoders (a pooler or "
                      "not): a multi-task run takes heads that read the encoder the same way")
    self.model_config = kinds.pop()
    self.sizes = [len(t.train["input_ids"]) for t in self.tasks]
    self.p = probabilities(self.sizes, config.mtdnn.sampling, config.mtdnn.temperature)
    self.seeds = seeds(config.train)
    self.setups, self.steps_per_epoch = self._setups()
    self.trainable_parameters = modes.trainable_parameters(self.setup.abstract_state.params, config.train.mode)
    self.tokens_per_step = config.train.batch_size * config.data.max_seq_length
    self._rng = jax.random.key(self.seeds["dropout"])
    self._stream: TaskStream | None = None

  def _setups(self) -> tuple[list[TrainSetup], int]:
    """One sharded setup per task over the same tree, mesh and optimizer: its own jitted steps."""
    config = self.config
    models = [heads.FinetuneModel(self.model_config, t.head, t.num_labels, config.head.pooling, config.head.dropout,
                                  config.head.get("cls_norm", "none"))
              for t in self.tasks]
    inner = [FinetuneObjective(m) for m in models]
    dummy = jnp.zeros((1, config.data.max_seq_length), jnp.int32)
    batch = {"input_ids": dummy, "attention_mask": dummy + 1, "token_type_ids": dummy}

    def init_params(rng):
      trees = [o.init(jax.random.fold_in(rng, i), batch) for i, o in enumerate(inner)]
      return {**{k: v for k, v in trees[0].items() if k != "head"},
              HEADS: {name: tree["head"] for name, tree in zip(self.names, trees)}}

    steps_per_epoch = max(sum(n // config.train.batch_size for n in self.sizes), 1)
    num_steps = config_schema.run_steps(config.train, steps_per_epoch)
    make_tx = lambda abstract: optim.make_optimizer(config.optimizer, num_steps,  # noqa: E731
                                                    nn.meta.unbox(abstract), self.model_config)
    mesh = partitioning.make_mesh(config.mesh)
    weights = config.mtdnn.loss_weights
    setups = [sharded_setup(c, TaskObjective(o, name, float(weights.get(name, 1.0))), init_params, make_tx,
                            num_steps, mesh=mesh, step_fn=functools.partial(task_step, task=name),
                            eval_fn=predict_step, eval_out_sharding=partitioning.batch_sharding)
              for c, o, name in zip(self.configs, inner, self.names)]
    return setups, steps_per_epoch

  @property
  def setup(self) -> TrainSetup:
    return self.setups[0]

  def initial_params(self) -> Any:
    """init_from's encoder over a fresh init, or a fresh init."""
    params = self.setup.init_params(jax.random.key(self.seeds["head"]))
    if self.config.init_from:
      keep = [k for k in init.ENCODER_KEYS if k in params]
      params = checkpoint.load_params_into(self.config.init_from, params, keep=keep)
      print(f"initialised the shared encoder from {self.config.init_from}", flush=True)
    return params

  def batches(self, start: int, end: int) -> TaskStream:
    lengths = batching.buckets(self.config.data.get("length_buckets", ()), self.config.data.max_seq_length)
    self._stream = TaskStream([t.train for t in self.tasks], self.config.train.batch_size, self.seeds["data"],
                              self.p, start, end, lengths)
    return self._stream

  def step(self, state: Any, batch: dict) -> tuple[Any, dict]:
    """The step of the task whose batch the stream gave last."""
    return self.setups[self._stream.task].train_step(state, batch, self._rng)

  def evaluate_tasks(self, params: Any) -> tuple[dict[str, dict[str, dict[str, float]]], dict, float]:
    """(per task: its eval sets' metrics; per task: the model outputs; the mean of the tasks' scores)."""
    per_task, outputs = {}, {}
    for name, setup, task in zip(self.names, self.setups, self.tasks):
      per_task[name], outputs[name] = evaluate(setup, params, task, self.config.train.eval_batch_size)
    scores = [score(task, per_task[name][task.evals[0].name]) for name, task in zip(self.names, self.tasks)]
    return per_task, outputs, float(np.mean(scores))

  def evaluate(self, params: Any) -> driver.Scored:
    per_task, outputs, current = self.evaluate_tasks(params)
    scalars = {f"{name}/{k}": v for name, sets in per_task.items() for k, v in merge_metrics(sets).items()
               if isinstance(v, (int, float))}
    results = {**{name: merge_metrics(sets) for name, sets in per_task.items()}, "score": current}
    return driver.Scored(current, {"score": current, **scalars}, results, outputs=outputs)

  def saved_config(self) -> dict:
    """config.json: the run config, the resolved model, the tokenizer and each task's head."""
    saved = self.config.to_dict()
    saved["model"] = self.model_config.to_dict()
    saved["task"]["heads"] = {name: {"head": t.head, "num_labels": t.num_labels, "labels": list(t.labels)}
                              for name, t in zip(self.names, self.tasks)}
    saved["trainable_parameters"] = self.trainable_parameters
    saved["data"].update(vocab=workdir_lib.path(self.tokenizer.path).name,
                         **tokenizer_kinds.saved_fields(self.tokenizer))
    return saved

  def exported(self, params: Any) -> Any:
    return params

  def save_params(self, params: Any) -> None:
    checkpoint.save_params(self.workdir, params, self.saved_config(), self.tokenizer.files)

  def write_outputs(self, params: Any, scored: driver.Scored) -> None:
    """Each task's dev predictions (predict_split=dev) in predictions/<task>/."""
    del params
    if self.config.predict_split == "dev":
      for name, task in zip(self.names, self.tasks):
        for eval_set in task.evals:
          eval_set.write_predictions(os.fspath(self.workdir / workdir_lib.PREDICTIONS / name),
                                     scored.outputs[name][eval_set.name])


def train(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Multi-task fine-tuning in `workdir` (held locked). Returns {"dev": {task: metrics, ..., "score"}, "step",
  "num_steps", "best_step", "best_score", "stopped_by", "finished_before"}: a finished workdir is not trained
  again (finished_before, with its record), unless train.restart."""
  return driver.run_job(config, workdir, validate=validate, learner=MultiTaskRun)


def summary(config: ml_collections.ConfigDict, workdir: str, result: dict) -> str:
  """The lines a multi-task run ends with: each task's dev score and the mean, or where it stopped."""
  if result["stopped_by"]:
    return driver.stopped_line(workdir, result)
  dev = result["dev"]
  before = driver.finished_before(workdir, result)
  shown = " | ".join(f"{name}: " + ", ".join(f"{k} {v:.4g}" for k, v in metrics.items()
                                            if isinstance(v, (int, float)) and k != "loss")
                     for name, metrics in dev.items() if isinstance(metrics, dict))
  some = next(iter(task_names(config)))
  return (f"{before}done: {shown} | mean score {dev.get('score', math.nan):.4g} | params in {workdir} | "
          f"next: bert-jax finetune --config configs/glue.py:<task> --config.init_from={workdir} (stage 2, "
          f"e.g. task {some})")

