"""The jobs by kind (a config's `job`): the schema of its config's blocks, what runs it, the
command that starts it, the line it ends with, and the step `bert-jax compile` and `bert-jax info`
build from its config.

  job              kind      command    runner                         its step (compile, info)
  pretrain         corpus    pretrain   training/trainer.py:pretrain   the objective's pretraining step
  finetune         dataset   finetune   finetune/trainer.py:finetune   - (it needs the task's data)
  distill          dataset   distill    compress/distill.py:distill    - (it needs the task's data)
  theseus          dataset   distill    compress/theseus.py:distill    - (it needs the task's data)
  general_distill  corpus    distill    compress/general.py:distill    the student's pretraining step
  sbert            dataset   finetune   sbert/train.py:train           - (it needs its sentence pairs)
  mtdnn            dataset   finetune   finetune/multitask.py:train    - (it needs its tasks' data)
  seq2seq          dataset   finetune   finetune/seq2seq.py:train      - (it needs its text pairs)

Every config names its job (configs/common.py: pretrain, configs/glue.py: finetune, configs/distill.py:
distill, theseus or general_distill, configs/sbert.py: sbert, configs/mtdnn.py: mtdnn, configs/t5_finetune.py: seq2seq), so the CLI, compile
and info read this table instead of guessing from the config's other keys. A new job is one `register` call
here, its module, and its kind and fields in config_schema.py.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import ml_collections
from jax.sharding import Mesh

from bert_jax import config_schema
from bert_jax.compress import distill, general, theseus
from bert_jax.errors import UserError
from bert_jax.finetune import multitask, seq2seq, trainer as finetune_trainer
from bert_jax.sbert import train as sbert_train
from bert_jax.training import step, trainer
from bert_jax.training.step import TrainSetup

Config = ml_collections.ConfigDict


@dataclasses.dataclass(frozen=True)
class Job:
  """name: the config's `job`; schema: the blocks it reads and their fields (bert_jax/config_schema.py's
  SCHEMAS; the runner checks them first); command: the `bert-jax` sub-command that runs it;
  run(config, workdir) -> result; summary(config, workdir, result) -> the lines it ends with; step(config, mesh) -> (the config the step
  is built from, its TrainSetup), or None for a job whose step needs its data; multihost: whether it
  runs on several processes (the --coordinator-address flags)."""
  name: str
  schema: config_schema.Schema
  command: str
  run: Callable[[Config, str], dict[str, Any]]
  summary: Callable[[Config, str, dict], str]
  step: Callable[[Config, Mesh | None], tuple[Config, TrainSetup]] | None = None
  multihost: bool = False


_JOBS: dict[str, Job] = {}


def register(job: Job) -> Job:
  if job.name in _JOBS:
    raise ValueError(f"job {job.name!r} is registered twice")
  if job.schema.job != job.name:
    raise ValueError(f"job {job.name!r} has the schema of {job.schema.job!r} (config_schema.SCHEMAS[{job.name!r}])")
  _JOBS[job.name] = job
  return job


def get(config: Config, spec: str = "the config") -> Job:
  """The job `config.job` names."""
  name = config.get("job")
  if name not in _JOBS:
    raise UserError(f"{spec}: job={name!r} is not one of {tuple(_JOBS)}; a config names its job "
                    "(configs/common.py: pretrain, configs/glue.py: finetune)")
  return _JOBS[name]


def for_command(config: Config, command: str, spec: str) -> Job:
  """The config's job, which `bert-jax <command>` must be the command of."""
  job = get(config, spec)
  if job.command != command:
    raise UserError(f"{spec} is a {job.name} config: run it with `bert-jax {job.command}`, not `bert-jax {command}`")
  return job


def with_step(config: Config, spec: str, command: str) -> Job:
  """The config's job, which must have a step to build without data (`compile`, `info`); the config is
  checked against the job's schema, as the job itself would at its start."""
  job = get(config, spec)
  if job.step is None:
    able = ", ".join(name for name, j in _JOBS.items() if j.step is not None)
    raise UserError(f"bert-jax {command} builds a pretraining step from the config alone: {spec} is a {job.name} "
                    f"config, whose step needs its task's data (jobs it takes: {able})")
  job.schema.check(config)
  return job


def _pretraining_step(config: Config, mesh: Mesh | None) -> tuple[Config, TrainSetup]:
  return config, step.build_train_setup(config, mesh)


def _student_step(config: Config, mesh: Mesh | None) -> tuple[Config, TrainSetup]:
  return _pretraining_step(general.student_config(config, None), mesh)


_SCHEMA = config_schema.SCHEMAS
register(Job("pretrain", _SCHEMA["pretrain"], "pretrain", trainer.pretrain, trainer.summary, _pretraining_step,
             multihost=True))
register(Job("finetune", _SCHEMA["finetune"], "finetune", finetune_trainer.finetune, finetune_trainer.summary))
register(Job("distill", _SCHEMA["distill"], "distill", distill.distill, finetune_trainer.summary))
register(Job("theseus", _SCHEMA["theseus"], "distill", theseus.distill, finetune_trainer.summary))
register(Job("general_distill", _SCHEMA["general_distill"], "distill", general.distill, trainer.summary,
             _student_step, multihost=True))
register(Job("sbert", _SCHEMA["sbert"], "finetune", sbert_train.train, sbert_train.summary))
register(Job("mtdnn", _SCHEMA["mtdnn"], "finetune", multitask.train, multitask.summary))
register(Job("seq2seq", _SCHEMA["seq2seq"], "finetune", seq2seq.train, seq2seq.summary))
