"""General distillation (`bert-jax distill` with configs/distill.py:general-*): a pretraining run of
objective `distill_mlm` (training/objectives/distill_mlm.py) on the pretraining corpus, with a frozen
teacher (a pretraining workdir or a converted checkpoint).

This module only resolves the student's run config from the teacher (read and checked in
compress/teacher.py, as task distillation's is), then runs the pretraining job: the tokenizer is the
teacher's; with distill.student_layers the student is the teacher's architecture with those layers,
initialised from them (DistilBERT's every-other-layer init, written once to WORKDIR/student_init and
named by init_from), else config.model (fresh, or from init_from). The lock, the loop, checkpoints,
resume, signals and the output workdir are pretraining's: `bert-jax finetune --config.init_from=WORKDIR`
and `convert --to hf` take it.
"""
from __future__ import annotations

from typing import Any

import jax
import ml_collections
from jax.experimental import multihost_utils

from bert_jax import params_checkpoint, pretrained, workdir as workdir_lib
from bert_jax.compress.teacher import Teacher, chosen_layers
from bert_jax.errors import UserError
from bert_jax.training import loop, trainer

STUDENT_INIT = "student_init"


def _take_tokenizer(config: ml_collections.ConfigDict, teacher: Teacher) -> None:
  if teacher.vocab is None:
    raise UserError(f"distill.teacher={teacher.location}: its {workdir_lib.CONFIG} names no vocabulary (data.vocab)")
  teacher.check_vocab(config.data.vocab)
  data = teacher.saved.get("data", {})
  config.data.update(vocab=str(teacher.vocab), tokenizer=data.get("tokenizer", config.data.tokenizer),
                     lower_case=data.get("lower_case", config.data.lower_case))


def _write_student_init(directory, teacher: Teacher, layers: tuple[int, ...],
                        config: ml_collections.ConfigDict) -> None:
  params, _ = params_checkpoint.load_params(teacher.location)
  params_checkpoint.save_params(directory, teacher.layers_of(params, layers),
                                {"objective": "bert", "model": config.model.to_dict(), "data": config.data.to_dict(),
                                 "teacher": teacher.location, "teacher_layers": list(layers)})


def student_config(config: ml_collections.ConfigDict, workdir: str | None) -> ml_collections.ConfigDict:
  """The run config of the student: the teacher's tokenizer, and its layers when asked for. With a workdir,
  the student's initial params are written there (by every process together, as orbax saves); without
  one (`compile`, `info`), only the student's shape is resolved."""
  teacher = Teacher.pretrained(config.distill.teacher)
  layers = chosen_layers(config.distill.student_layers, teacher.model.num_layers)
  config = ml_collections.ConfigDict(config.to_dict())  # a copy; locked again below
  _take_tokenizer(config, teacher)
  if layers is not None:
    if config.init_from:
      raise UserError("set either distill.student_layers (init from the teacher) or init_from, not both")
    if teacher.model.share_layers != "none" or teacher.model.pruned_heads:
      raise UserError("distill.student_layers needs a teacher with unshared, unpruned layers")
    config.model.update({k: v for k, v in teacher.saved["model"].items()
                         if k in config.model and k != "pruned_heads"})
    config.model.update(num_layers=len(layers), scan_unroll=min(config.model.scan_unroll, len(layers)))
    if workdir is not None:
      init = workdir_lib.path(workdir) / STUDENT_INIT
      if not (init / workdir_lib.CONFIG).exists():  # every process: orbax saves collectively
        _write_student_init(init, teacher, layers, config)
      if jax.process_count() > 1:
        multihost_utils.sync_global_devices("bert_jax student_init written")
      config.init_from = str(init)
  config.lock()
  return config


def distill(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Distils (or resumes distilling) into `workdir`, which it holds locked before it writes the student's
  init; returns what the pretraining job returns (training/trainer.py:pretrain)."""
  trainer.check_run_config(config)
  Teacher.pretrained(config.distill.teacher).check_intact()  # before anything is written, as init_from's check
  pretrained.check_init_from(config)
  with loop.hold(workdir, restart=config.train.restart) as (run_dir, signals):
    return trainer.pretrain_in(student_config(config, run_dir), run_dir, signals)
