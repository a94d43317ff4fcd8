"""The fine-tuning job: build, (resume or init), train with periodic dev evaluation, keep the best
parameters, stop early, then evaluate and write predictions.

It runs on the same skeleton as pretraining: `training.step.sharded_setup` (mesh, shardings, donation,
micro-batches), the one loop `training.loop` (cadence, progress line, metrics.jsonl, TensorBoard,
SIGTERM and Ctrl-C), `training.checkpoint.Checkpointer` (a paused or interrupted run's state and
progress) and the workdir layout of bert_jax/workdir.py:
  config.json, params/, <vocab>   the kept (best, or last) parameters as a params checkpoint, so the
                                  workdir is itself a valid init_from (two-stage fine-tuning); with
                                  train.mode=adapters only the trained parameters, config.json naming
                                  the base checkpoint (a delta: bert_jax/params_checkpoint.py)
  run_config.json                 the config as given, written when the run starts
  state/<step>/                   the train state and progress of a paused run (sweeps stop runs and
                                  continue some) or of one stopped by SIGTERM or Ctrl-C
  metrics.jsonl, events.*         one JSON object per logged step and per evaluation; TensorBoard
  eval_results.json               the final dev metrics
  finished.json                   where the run ended: step, best dev score and its step, early stop
  predictions/                    GLUE leaderboard TSVs or SQuAD JSON
Start order: own paused state > init_from > fresh init. A finished workdir is not trained again: the
job says so, unless train.restart, which moves the finished run's files aside first (training/loop.py).
`Run` is the job's learner (training/driver.py owns the loop, keeping the best, early stopping, pausing
and the finish); what it trains is its model learner's: `FineTuning` here (the task's model; what trains
is train.mode's, finetune/modes.py; SMART's terms come from the objective, finetune/smart.py), or a
student and its teacher (compress/distill.py). Three seeds (head, data, dropout) default to train.seed, so
that a sweep may vary one of them
at a time (Dodge et al. 2020).
"""
from __future__ import annotations

import functools
import math
import os
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from bert_jax import config_schema, params_checkpoint, workdir as workdir_lib
from bert_jax.data_pipelines import tokenizer_kinds
from bert_jax.errors import UserError
from bert_jax.finetune import batching, heads, init, memory, modes, optim, smart
from bert_jax.finetune.batching import train_batches
from bert_jax.finetune.features import input_length
from bert_jax.finetune.objective import FinetuneObjective, predict_step
from bert_jax.finetune.task_registry import build_task
from bert_jax.finetune.tasks import Task, merge_metrics, score
from bert_jax.models import attention
from bert_jax.ops import int8
from bert_jax.training import checkpoint, driver, loop, partitioning
from bert_jax.training.step import TrainSetup, sharded_setup


def build_train_setup(config: ml_collections.ConfigDict, model_config, task: Task, num_train: int
                      ) -> tuple[TrainSetup, int]:
  """The task's model and optimizer through the shared sharded setup; also the steps per epoch."""
  model = heads.FinetuneModel(model_config, task.head, task.num_labels, config.head.pooling,
                              config.head.dropout, config.head.get("cls_norm", "none"))
  if config.train.qat:
    model = int8.int8_model(model)
  objective = FinetuneObjective(model, config.smart if config.smart.enabled else None)
  dummy = jnp.zeros((1, config.data.max_seq_length), jnp.int32)
  init_batch = {"input_ids": dummy, "attention_mask": dummy + 1, "token_type_ids": dummy}
  init_params = functools.partial(objective.init, batch=init_batch)
  num_steps, steps_per_epoch = run_length(config.train, num_train)
  trainable = modes.trainable_mask(nn.meta.unbox(jax.eval_shape(init_params, jax.random.key(0))),
                                   config.train.mode)
  learning_rate = (config.optimizer.learning_rate if config.train.mode == "finetune"
                   else config.optimizer.frozen_learning_rate)
  make_tx = lambda abstract: optim.make_optimizer(config.optimizer, num_steps,  # noqa: E731
                                                  nn.meta.unbox(abstract), model_config, trainable,
                                                  learning_rate)
  teacher = config.smart.enabled and config.smart.bregman_weight > 0
  setup = sharded_setup(config, objective, init_params, make_tx, num_steps, eval_fn=predict_step,
                        eval_out_sharding=partitioning.batch_sharding,
                        trainable=None if config.train.mode == "finetune" else trainable,
                        teacher_momentum=smart.momentum(config.smart, num_steps) if teacher else None)
  return setup, steps_per_epoch


def run_length(train: ml_collections.ConfigDict, num_train: int) -> tuple[int, int]:
  """(the run's steps, steps per epoch) over `num_train` training rows (the remainder is dropped)."""
  steps_per_epoch = max(num_train // train.batch_size, 1)
  return config_schema.run_steps(train, steps_per_epoch), steps_per_epoch


def seeds(train: ml_collections.ConfigDict) -> dict[str, int]:
  """{head, data, dropout}: each its own setting, or train.seed where that is -1."""
  return {k: train.seed if train[f"{k}_seed"] < 0 else train[f"{k}_seed"] for k in ("head", "data", "dropout")}


def run_model(setup: TrainSetup, params: Any, features: dict[str, np.ndarray], batch_size: int
              ) -> dict[str, np.ndarray]:
  lengths = batching.buckets(setup.config.data.get("length_buckets", ()), features["input_ids"].shape[1])
  packing = batching.unpad_config(setup.config.data, _encoder_config(setup))
  return batching.run_model(setup.eval_step, params, setup.mesh, features, batch_size, lengths, packing)


def _encoder_config(setup: TrainSetup) -> Any:
  """The encoder config of a FinetuneModel's objective (whose batches unpad; not a quantized model's), or None."""
  model = getattr(setup.objective, "model", None)
  return model.config if isinstance(model, heads.FinetuneModel) else None


def _packing(setup: TrainSetup) -> Any:
  """`unpad_config` of the training step, where its objective `packs_rows` (plain fine-tuning's without SMART;
  not a distillation's or Theseus's)."""
  if not setup.objective.packs_rows:
    return None
  return batching.unpad_config(setup.config.data, _encoder_config(setup))


def evaluate(setup: TrainSetup, params: Any, task: Task, batch_size: int, eval_sets=None
             ) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, np.ndarray]]]:
  """Per eval set: its metrics and the raw model outputs."""
  per_set, outputs = {}, {}
  for eval_set in task.evals if eval_sets is None else eval_sets:
    outputs[eval_set.name] = run_model(setup, params, eval_set.features, batch_size)
    per_set[eval_set.name] = eval_set.evaluate(outputs[eval_set.name])
  return per_set, outputs


def _saved_config(config: ml_collections.ConfigDict, model_config, tokenizer, task: Task) -> dict:
  """The workdir's config.json: the run config with the resolved model, the tokenizer's copy and the
  head (kind, size, label names by id), so predict and export need no task data; an adapter run's (a
  delta) names the checkpoint with the other parameters."""
  saved = config.to_dict()
  saved["model"] = model_config.to_dict()
  saved["task"].update(head=task.head, num_labels=task.num_labels, labels=list(task.labels))
  saved["data"].update(vocab=workdir_lib.path(tokenizer.path).name, **tokenizer_kinds.saved_fields(tokenizer))
  if _saves_delta(config):
    saved[params_checkpoint.BASE] = str(workdir_lib.path(config.init_from))
  return saved


def _saves_delta(config: ml_collections.ConfigDict) -> bool:
  return config.train.mode == "adapters" and bool(config.init_from)


class FineTuning:
  """The learner of plain fine-tuning: the task's model on the encoder of init_from (or fresh), trained
  as train.mode says. compress/distill.py's Distillation is the other learner; `Run` asks a learner
  only these five things: its tokenizer, its model, its setup, where its parameters start and what
  params/ keeps of them."""

  def tokenizer(self, config: ml_collections.ConfigDict):
    # The encoder's sizes (data.max_seq_length against its positions) are checked before any data is read.
    init.model_config(config, workdir_lib.read_config(config.init_from) if config.init_from else None)
    return init.load_tokenizer(config)

  def model_config(self, config: ml_collections.ConfigDict, task: Task) -> Any:
    saved = workdir_lib.read_config(config.init_from) if config.init_from else None
    encoder = memory.model_config(config, init.model_config(config, saved), task.head)
    return modes.model_config(heads.encoder_config(encoder, task.head, config.head.pooling), config.train)

  def setup(self, config: ml_collections.ConfigDict, model_config, task: Task, num_train: int
            ) -> tuple[TrainSetup, int]:
    return build_train_setup(config, model_config, task, num_train)

  def initial_params(self, run: "Run") -> Any:
    """init_from's encoder (and its head, for the same task) over a fresh init; top layers reset."""
    config = run.config
    fresh = run.setup.init_params(jax.random.key(run.seeds["head"]))
    saved = workdir_lib.read_config(config.init_from) if config.init_from else None
    params = init.initial_params(config, fresh, saved, run.task.name)
    return init.reinit_top_layers(params, fresh, run.model_config, config.train.reinit_layers)

  def exported(self, params: Any) -> Any:
    """What params/ holds of the trained parameters: all of them."""
    return params


class Run:
  """The fine-tuning job's learner (training/driver.py: its batches, step, evaluation and saved parameters):
  one task's model, built by a model learner (`FineTuning` by default; compress/distill.py's `Distillation`,
  compress/theseus.py's `Theseus`) that it asks only five things: its tokenizer, its model, its setup, where
  its parameters start and what params/ keeps of them. `start` runs it under the driver."""

  evaluates_start = False

  def __init__(self, config: ml_collections.ConfigDict, workdir, learner: Any = None):
    self.config, self.workdir = config, workdir_lib.path(workdir)
    self.learner = learner or FineTuning()
    self.tokenizer = self.learner.tokenizer(config)
    self.task = build_task(config, self.tokenizer, need_train=not config.eval_only)
    if config.predict_split == "test" and not self.task.tests:
      raise UserError(f"task {self.task.name} has no test split to predict: set --config.predict_split=dev "
                      "(or '' for no prediction files)")
    self.model_config = self.learner.model_config(config, self.task)  # checks the model before any compile
    if self.task.train is not None and len(self.task.train["input_ids"]) < config.train.batch_size:
      raise UserError(f"{len(self.task.train['input_ids'])} training examples are fewer than "
                      f"train.batch_size={config.train.batch_size}")
    num_train = 0 if self.task.train is None else len(self.task.train["input_ids"])
    self.setup, self.steps_per_epoch = self.learner.setup(config, self.model_config, self.task, num_train)
    self.seeds = seeds(config.train)
    self.trainable = modes.trainable_mask(self.setup.abstract_state.params, config.train.mode)
    self.saved_config = _saved_config(config, self.model_config, self.tokenizer, self.task)
    count, total = modes.trainable_count(self.setup.abstract_state.params, self.trainable)
    self.saved_config["trainable_parameters"] = {"count": count, "total": total, "share": count / total}
    if config.eval_only:
      print(f"eval_only: evaluating the {total:,} parameters of {config.init_from}", flush=True)
    else:
      print(f"train.mode={config.train.mode}: {count:,} of {total:,} parameters train "
            f"({100 * count / total:.2f}%)", flush=True)
    # A ranking group ([G, K, T] features) is K rows: tokens/s counts them all (train.batch_size counts groups).
    train = self.task.train
    rows = train["input_ids"].shape[1] if train is not None and train["input_ids"].ndim == 3 else 1
    self.tokens_per_step = config.train.batch_size * rows * input_length(config)
    self._rng = jax.random.key(self.seeds["dropout"])

  def initial_params(self) -> Any:
    return jax.device_put(self.learner.initial_params(self), self.setup.state_shardings.params)

  def batches(self, start: int, end: int):
    lengths = batching.buckets(self.config.data.get("length_buckets", ()), self.config.data.max_seq_length)
    batches = train_batches(self.task.train, self.config.train.batch_size, self.seeds["data"], start, end, lengths)
    packer = batching.train_packer(_packing(self.setup), self.config.train, self.setup.mesh)
    return batches if packer is None else map(packer, batches)

  def step(self, state: Any, batch: dict) -> tuple[Any, dict]:
    return self.setup.train_step(state, batch, self._rng)

  def evaluate(self, params: Any) -> driver.Scored:
    """The dev sets' metrics; the score is the first set's (the task's selection metric)."""
    per_set, outputs = evaluate(self.setup, params, self.task, self.config.train.eval_batch_size)
    first = per_set[self.task.evals[0].name]
    current = score(self.task, first)
    results = merge_metrics(per_set)
    return driver.Scored(current, {"score": current, **results}, results, float(first.get("loss", math.nan)),
                         outputs)

  @property
  def score_name(self) -> str:
    """What `score` is: the task's selection metric, or the mean of several."""
    return " and ".join(self.task.selection) if len(self.task.selection) > 1 else self.task.selection[0]

  def exported(self, params: Any) -> Any:
    return self.learner.exported(params)

  def save_params(self, params: Any) -> None:
    """The params checkpoint of the workdir: every parameter, or with adapters the trained ones."""
    params = self.learner.exported(params)
    if _saves_delta(self.config):
      params = modes.trainable_subtree(params, self.learner.exported(self.trainable))
    checkpoint.save_params(self.workdir, params, self.saved_config, self.tokenizer.files)

  def write_outputs(self, params: Any, scored: driver.Scored) -> None:
    """Predictions: GLUE leaderboard TSVs or SQuAD JSON of predict_split."""
    directory = os.fspath(self.workdir / workdir_lib.PREDICTIONS)
    if self.config.predict_split == "dev":
      for eval_set in self.task.evals:
        eval_set.write_predictions(directory, scored.outputs[eval_set.name])
    elif self.config.predict_split == "test":
      _, outputs = evaluate(self.setup, params, self.task, self.config.train.eval_batch_size, self.task.tests)
      for eval_set in self.task.tests:
        eval_set.write_predictions(directory, outputs[eval_set.name])


def start(config: ml_collections.ConfigDict, workdir, learner: Any = None,
          signals: loop.StopRequests | None = None) -> driver.Driver:
  """A fine-tuning run in `workdir` under the driver (its paused state resumed): sweeps and tests step it."""
  return driver.Driver(config, workdir, Run(config, workdir, learner), signals)


def validate(config: ml_collections.ConfigDict) -> None:
  """The shared blocks (bert_jax/config_schema.py), then fine-tuning's own fields."""
  config_schema.of(config, config_schema.DATASET).check(config)
  attention.check(config.model, config.data.max_seq_length)
  if config.predict_split not in ("", "dev", "test"):
    raise UserError(f"predict_split={config.predict_split!r} is not one of ('', 'dev', 'test')")
  if config.head.pooling not in heads.POOLINGS:
    raise UserError(f"head.pooling={config.head.pooling!r} is not one of {heads.POOLINGS}")
  if config.head.get("cls_norm", "none") not in heads.CLS_NORMS:
    raise UserError(f"head.cls_norm={config.head.cls_norm!r} is not one of {heads.CLS_NORMS}")
  if config.head.get("cls_norm", "none") != "none" and config.job in ("distill", "theseus"):
    raise UserError(f"head.cls_norm={config.head.cls_norm!r} is for fine-tuning (and MT-DNN); a distilled "
                    "student's head reads its summary vector as it is")
  modes.validate(config.train)
  memory.validate(config)
  batching.buckets(config.data.get("length_buckets", ()), config.data.max_seq_length)
  batching.check_unpad(config)


def run_job(config: ml_collections.ConfigDict, workdir: str,
            make_learner: Callable[[ml_collections.ConfigDict], Any] = lambda config: FineTuning()) -> dict[str, Any]:
  """Fine-tunes (or, with eval_only, evaluates) in `workdir` through the driver (training/driver.py:run_job),
  with the model learner `make_learner(config)` builds before the workdir is touched (default: plain
  fine-tuning; a distillation reads and checks its teacher)."""
  learners = []

  def checked(config: ml_collections.ConfigDict) -> None:
    validate(config)
    learners.append(make_learner(config))  # before the workdir: a distillation's teacher is read and checked
  return driver.run_job(config, workdir, validate=checked,
                        learner=lambda config, run_dir: Run(config, run_dir, learners[0]))


def finetune(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """The fine-tuning job (`bert-jax finetune`): `run_job` with plain fine-tuning."""
  return run_job(config, workdir)


def summary(config, workdir: str, result: dict) -> str:
  """The lines a fine-tuning (or task distillation) run ends with: its final dev metrics, where its
  outputs are and the next command; or where it stopped and how to resume; or that it had finished."""
  if result["stopped_by"]:
    return driver.stopped_line(workdir, result)
  lines = []
  best = (f"best dev {result['score']} {result['best_score']:.4g} at step {result['best_step']}"
          if result.get("best_score") is not None else "no evaluation during training")
  if result["finished_before"]:
    lines.append(f"{workdir}: this run finished at step {result['step']} of {result['num_steps']} ({best}); "
                 "nothing to train. To train it again from the start: the same command with "
                 f"--config.train.restart=true (this run's files move to {workdir}/previous-N/)")
  shown = [f"dev {k} {v:.4g}" for k, v in result["dev"].items()]
  if result.get("stopped_early"):
    shown.insert(0, f"stopped early at step {result['step']} of {result['num_steps']} ({best})")
  if config.eval_only:
    if config.predict_split:
      shown.append(f"predictions in {workdir}/predictions")
    lines.append(f"done: {' | '.join(shown)} | next: bert-jax predict --model {config.init_from} --input FILE")
    return "\n".join(lines)
  shown.append(f"params in {workdir} ({'the best evaluation' if config.train.keep_best else 'the last step'})")
  if config.predict_split:
    shown.append(f"predictions in {workdir}/predictions")
  lines.append(f"done: {' | '.join(shown)} | next: bert-jax predict --model {workdir} --input FILE")
  return "\n".join(lines)
