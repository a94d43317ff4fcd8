"""The teacher of a distillation, for both kinds (`bert-jax distill`): task-specific (compress/distill.py:
a fine-tuning workdir of the same task) and general (compress/general.py: a pretraining workdir or a
converted checkpoint with an MLM head).

`Teacher.fine_tuned` and `Teacher.pretrained` read and check the teacher's config.json, int8 first (an
int8 workdir is a model to serve, not to learn from); `check_intact` reads its parameters whole before a
job writes anything (a damaged teacher or one holding NaN is one line); `check_vocab` holds the student
to the teacher's vocabulary; `chosen_layers` and `take_layers` give DistilBERT's init, a student made of some of the
teacher's layers; `load_params_into` reads its parameters into the shardings a step wants.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from etils import epath

from bert_jax import params_checkpoint, workdir as workdir_lib
from bert_jax.errors import UserError
from bert_jax.models import families
from bert_jax.models.config import ModelConfig
from bert_jax.training.objectives import registry

# Saved objectives whose params hold a BertModel with its MLM head (extra heads are not read).


@dataclasses.dataclass(frozen=True)
class Teacher:
  location: str
  saved: dict  # its config.json
  model: families.Config  # ModelConfig, or a family's own (MobileBertConfig)

  @classmethod
  def _read(cls, location: str, wanted: str) -> "Teacher":
    if not location:
      raise UserError(f"distill.teacher is empty: give {wanted}")
    saved = workdir_lib.read_config(location)  # none there: a one-line UserError
    quantized = saved.get("quantization")
    if quantized:
      raise UserError(f"distill.teacher={location} holds {quantized.get('weights')} weights (bert-jax quantize); "
                      f"distil from the float model it came from: distill.teacher={quantized.get('source')}")
    return cls(location, saved, families.model_config(saved["model"]))

  @classmethod
  def fine_tuned(cls, location: str, task_name: str) -> "Teacher":
    """A fine-tuning workdir of task `task_name` (task-specific distillation)."""
    teacher = cls._read(location, "a fine-tuning workdir of this task")
    task = teacher.saved.get("task", {}).get("name")
    if task != task_name:
      raise UserError(f"the teacher {location} was fine-tuned on task {task!r}, not {task_name!r}; "
                      "distill with a teacher of the same task")
    return teacher

  @classmethod
  def pretrained(cls, location: str) -> "Teacher":
    """A pretraining workdir or converted checkpoint with a BERT MLM head (general distillation)."""
    teacher = cls._read(location, "a pretraining workdir or a converted checkpoint")
    if "task" in teacher.saved:
      raise UserError(f"distill.teacher={location} is a fine-tuning workdir: general distillation needs a "
                      "pretraining workdir or converted checkpoint (task distillation: configs/distill.py:embedded)")
    objective = teacher.saved.get("objective", "bert")
    if objective not in registry.with_bert_mlm() or not teacher.saved["model"].get("mlm_head", False):
      raise UserError(f"distill.teacher={location} (objective={objective!r}) has no BERT MLM head to take "
                      f"soft targets from; use a teacher of objective {registry.with_bert_mlm()}")
    return teacher

  @property
  def vocab(self) -> epath.Path | None:
    """The teacher's tokenizer file (its config's data.vocab, beside it)."""
    return workdir_lib.vocab_file(self.location, self.saved)

  def check_vocab(self, vocab: str, student_vocab_size: int | None = None) -> None:
    """data.vocab (when set) must be the teacher's file, and the student's embedding table its size."""
    own = self.vocab
    if vocab and (own is None or own.read_bytes() != workdir_lib.path(vocab).read_bytes()):
      raise UserError(f"data.vocab={vocab} is not the teacher's vocabulary; leave it empty to use the teacher's")
    if student_vocab_size is not None and student_vocab_size != self.model.vocab_size:
      raise UserError(f"the student's vocab_size {student_vocab_size} differs from the teacher's "
                      f"{self.model.vocab_size}: the student must use the teacher's vocabulary")

  def check_intact(self) -> "Teacher":
    """The teacher, once its parameters have been read whole and found finite (not damaged, no NaN): a job
    calls this before it writes anything."""
    params_checkpoint.check_intact(self.location, "distill.teacher")
    return self

  def load_params_into(self, abstract: Any) -> Any:
    """The teacher's params, restored into `abstract`'s shapes and shardings."""
    return params_checkpoint.load_params_into(self.location, abstract)

  def layers_of(self, params: Any, layers: tuple[int, ...]) -> Any:
    """The teacher's params (host arrays) with only `layers` of its encoder: DistilBERT's init."""
    return take_layers(jax.device_get(params), self.model, layers)


def chosen_layers(spec: str, teacher_layers: int) -> tuple[int, ...] | None:
  """distill.student_layers: "" (config.model), "every_other" (0, 2, 4, ...) or "0,2,5"."""
  if not spec:
    return None
  if spec == "every_other":
    return tuple(range(0, teacher_layers, 2))
  try:
    layers = tuple(int(x) for x in spec.split(","))
  except ValueError:
    raise UserError(f"distill.student_layers={spec!r} must be '', 'every_other' or teacher layer "
                    "indices like '0,2,4'") from None
  if not layers or sorted(set(layers)) != list(layers) or not 0 <= layers[0] <= layers[-1] < teacher_layers:
    raise UserError(f"distill.student_layers={spec!r} must be increasing teacher layer indices in "
                    f"[0, {teacher_layers})")
  return layers


def take_layers(teacher_params: dict, teacher: ModelConfig, layers: tuple[int, ...]) -> dict:
  """The teacher's params with only `layers` of its encoder (renumbered 0..k-1): DistilBERT's init."""
  encoder = teacher_params["encoder"]
  if teacher.scan_layers:
    new_encoder = {**encoder, "layers": jax.tree.map(lambda x: x[jnp.asarray(layers)], encoder["layers"])}
  else:
    new_encoder = {k: v for k, v in encoder.items() if not k.startswith("layer_")}
    new_encoder.update({f"layer_{j}": encoder[f"layer_{i}"] for j, i in enumerate(layers)})
  return {**teacher_params, "encoder": new_encoder}
