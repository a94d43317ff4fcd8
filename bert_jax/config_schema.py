"""The one schema of the config blocks every job shares (train, optimizer, checkpoint, data): each
field's meaning and allowed values, the same in every job, the rules between fields, and the one
validator that checks a config at the start of a job.

Two kinds of job read them. Jobs on a corpus (pretraining, general distillation) stream their input,
so their length is counted in steps; jobs on a dataset (fine-tuning, task distillation) know its size,
so their length, evaluation cadence and warmup may also be given in epochs or as a share. For a
quantity given in two units (train.num_steps or train.epochs, train.eval_every_steps or
train.eval_every_epochs, optimizer.warmup_steps or optimizer.warmup_ratio) one rule holds: the steps
field, when > 0, wins over its twin (as in Hugging Face's Trainer, whose max_steps and warmup_steps
override num_train_epochs and warmup_ratio). The functions `run_steps`, `eval_every` and
`warmup_steps` apply it, in one place.

A job's own fields (fine-tuning's train.mode, pretraining's optimizer.name, ...) are checked where they
are read. docs/reference/configuration.md's config reference table is `markdown_table()`'s output, kept in step by
tests/test_config_schema.py; rewrite it with `python3 -m bert_jax.config_schema docs/reference/configuration.md`.
"""
from __future__ import annotations

import dataclasses
import math
import re
import sys
from typing import Any, Callable

import ml_collections

from bert_jax import workdir
from bert_jax.errors import UserError

CORPUS, DATASET = "corpus", "dataset"  # the two kinds of job (see the module docstring)
BOTH = (CORPUS, DATASET)
_JOBS = {BOTH: "all", (CORPUS,): "pretrain, general_distill", (DATASET,): "finetune, distill"}


@dataclasses.dataclass(frozen=True)
class Field:
  key: str  # "block.name"
  allowed: str  # the allowed values, as the error and the configuration reference say them
  check: Callable[[Any], bool]
  meaning: str
  kinds: tuple[str, ...] = BOTH

  @property
  def block(self) -> str:
    return self.key.split(".")[0]


def _int(low: int) -> Callable[[Any], bool]:
  return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= low


def _finite(v: Any) -> bool:
  """A real number (not a bool), neither infinite nor NaN: every float field's first check (1e309 parses as inf)."""
  return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _number(low: float, high: float = math.inf, high_open: bool = False) -> Callable[[Any], bool]:
  return lambda v: _finite(v) and low <= v and (v < high if high_open else v <= high)


def _positive(v: Any) -> bool:
  return _finite(v) and v > 0


def _bool(v: Any) -> bool:
  return isinstance(v, bool)


def _str(v: Any) -> bool:
  return isinstance(v, str)


def _one_of(*choices: str) -> tuple[str, Callable[[Any], bool]]:
  return "one of " + ", ".join(choices), lambda v: v in choices


FIELDS = (
    Field("train.batch_size", ">= 1", _int(1),
          "rows per step, over all hosts and micro-batches"),
    Field("train.grad_accum_steps", ">= 1", _int(1),
          "micro-batches per step (the update is the full batch's); train.batch_size divides by it"),
    Field("train.grad_reduce_dtype", *_one_of("float32", "bfloat16"),
          "the dtype gradients cross devices in, once per step (bfloat16: MLPerf's TPU BERT; halves the bytes)"),
    Field("train.num_steps", ">= 0", _int(0),
          "the run's length in steps; > 0 wins over train.epochs (a corpus job needs >= 1)"),
    Field("train.epochs", ">= 0", _number(0),
          "the run's length in passes over the training set (the remainder of each is dropped), when "
          "train.num_steps is 0", (DATASET,)),
    Field("train.seed", "an integer", _int(-2 ** 63),
          "the run's random seed: initialisation, dropout and, for a dataset, the order of its rows"),
    Field("train.log_every_steps", ">= 1", _int(1),
          "a row of metrics (the mean since the last) every N steps, and at the last step"),
    Field("train.eval_every_steps", ">= 0", _int(0),
          "evaluate every N steps and at the last step; > 0 wins over train.eval_every_epochs; with both 0, "
          "no evaluation while training (fine-tuning still scores its final parameters)"),
    Field("train.eval_every_epochs", ">= 0", _number(0),
          "evaluate every E epochs (rounded to steps) and at the last step, when train.eval_every_steps is 0",
          (DATASET,)),
    Field("train.eval_steps", ">= 0", _int(0),
          "held-out batches per evaluation (the same batches each time); 0: no evaluation", (CORPUS,)),
    Field("train.eval_at_start", "true or false", _bool,
          "with evaluation on, also evaluate the starting parameters, logged as step 0 (continued pretraining: "
          "the checkpoint's held-out loss before training); a resumed run does not repeat it", (CORPUS,)),
    Field("train.eval_batch_size", ">= 0", _int(0),
          "rows per evaluation batch; 0: train.batch_size"),
    Field("train.tensorboard", "true or false", _bool,
          "TensorBoard event files in the workdir (metrics.jsonl is always written)"),
    Field("train.wandb", "a project name or \"\"", _str,
          "also log scalars and the config to this Weights & Biases project (pip install 'bert_jax[wandb]'); "
          "\"\": none"),
    Field("train.skip_nonfinite_steps", ">= 0", _int(0),
          "skip up to N updates whose loss or gradient norm is not finite, then stop; 0: stop at the first"),
    Field("train.restart", "true or false", _bool,
          "a finished run in the workdir starts again, its files moved to WORKDIR/previous-N/ (an "
          "unfinished run always resumes)"),
    Field("train.batch_warmup_steps", ">= 0", _int(0),
          "batch-size warmup: the rows that count grow linearly from train.batch_warmup_start of the batch to "
          "all of it over N steps (masked-LM objectives without a sentence head); 0: off", (CORPUS,)),
    Field("train.batch_warmup_start", "in (0, 1]", lambda v: _positive(v) and v <= 1,
          "the share of train.batch_size that counts at step 0 of the batch-size warmup", (CORPUS,)),
    Field("optimizer.learning_rate", "> 0", _positive, "the peak learning rate, after warmup"),
    Field("optimizer.warmup_steps", ">= 0", _int(0),
          "linear warmup from 0 over N steps; > 0 wins over optimizer.warmup_ratio; both 0: no warmup"),
    Field("optimizer.warmup_ratio", "in [0, 1)", _number(0, 1, high_open=True),
          "linear warmup over this share of the run's steps, when optimizer.warmup_steps is 0"),
    Field("optimizer.decay", *_one_of("linear", "polynomial", "constant", "1-sqrt", "rsqrt"),
          "after warmup: linear or polynomial (decay_power) to end_learning_rate at the last step, constant, "
          "warmup-stable-decay (1-sqrt: the peak until decay_start, then 1 - sqrt down over decay_steps), or T5's "
          "inverse square root (rsqrt: the peak, no ramp, for warmup_steps, then peak * sqrt(warmup / step))"),
    Field("optimizer.decay_steps", ">= 0", _int(0),
          "the length of the 1-sqrt decay (optimizer.decay='1-sqrt' needs >= 1)"),
    Field("optimizer.decay_start", ">= -1", _int(-1),
          "the step where the 1-sqrt decay starts; -1: the run's last decay_steps steps"),
    Field("optimizer.decay_power", "> 0", _positive, "the power of optimizer.decay=polynomial"),
    Field("optimizer.end_learning_rate", ">= 0", _number(0), "the learning rate at the last step"),
    Field("optimizer.b1", "in [0, 1)", _number(0, 1, high_open=True), "Adam's first-moment decay"),
    Field("optimizer.b2", "in [0, 1)", _number(0, 1, high_open=True), "Adam's second-moment decay"),
    Field("optimizer.eps", "> 0", _positive, "Adam's epsilon"),
    Field("optimizer.weight_decay", ">= 0", _number(0),
          "decoupled weight decay, not on LayerNorm or biases"),
    Field("optimizer.clip_norm", ">= 0", _number(0), "clip the gradient's global norm to this; 0: off"),
    Field("checkpoint.every_steps", ">= 0", _int(0),
          "save the train state every N steps; 0: only when the run stops on SIGTERM or Ctrl-C, pauses "
          "(sweeps) or, for a corpus job, ends"),
    Field("checkpoint.keep", ">= 1", _int(1), "train-state checkpoints kept (the newest)"),
    Field("checkpoint.async_save", "true or false", _bool, "write checkpoints while training goes on"),
    Field("data.max_seq_length", ">= 1", _int(1),
          "tokens per row, [CLS] and [SEP] included (at most model.max_position_embeddings)"),
    Field("data.max_predictions_per_seq", ">= 0", _int(0),
          "masked positions a row has room for; 0: ceil(data.mask_rate * data.max_seq_length), the rate's count at "
          "any length (20 at 128 tokens and 15%); a number below that caps the rate (a preset's, with the length or "
          "rate overridden, may not cut it by more than 10%)", (CORPUS,)),
    Field("data.vocab", "a path or ''", _str,
          "the vocabulary (vocab.txt or a SentencePiece *.model); '': the embedded one, or init_from's"),
    Field("data.lower_case", "true or false", _bool, "lower-case and strip accents before tokenizing"),
    Field("data.general_eval_corpus", "globs or ''", _str,
          "a second held-out set (read as data.eval_corpus is) evaluated with the first at the same steps, its "
          "metrics named general_* (continued pretraining: general-domain text, to show forgetting); '': none",
          (CORPUS,)),
)

def _get(config: ml_collections.ConfigDict, key: str) -> Any:
  block, name = key.split(".")
  return config[block][name]


@dataclasses.dataclass(frozen=True)
class Schema:
  """The shared fields of one kind of job (CORPUS or DATASET) and the validator of a config for it."""
  kind: str

  @property
  def fields(self) -> tuple[Field, ...]:
    return tuple(f for f in FIELDS if self.kind in f.kinds)

  def check(self, config: ml_collections.ConfigDict) -> None:
    """UserError naming the first field that is missing or out of its allowed values, or a run with
    no length; then fills in what 0 stands for (train.eval_batch_size)."""
    for f in self.fields:
      if f.block not in config or f.key.split(".")[1] not in config[f.block]:
        raise UserError(f"the config has no {f.key} ({f.meaning}); every {self.kind} job's config has it: "
                        "start from a preset in configs/")
      value = _get(config, f.key)
      if not f.check(value):
        finite = "a finite number, " if isinstance(value, float) and not math.isfinite(value) else ""
        raise UserError(f"{f.key}={value!r} must be {finite}{f.allowed}: {f.meaning}")
    train = config.train
    if self.kind == CORPUS and train.num_steps < 1:
      raise UserError(f"train.num_steps={train.num_steps} must be >= 1: a job on a corpus counts its length in steps")
    if self.kind == DATASET and train.num_steps == 0 and train.epochs == 0:
      raise UserError("train.num_steps=0 and train.epochs=0: set the run's length in one of them")
    if config.train.eval_batch_size == 0:
      config.train.eval_batch_size = config.train.batch_size


CORPUS_JOBS, DATASET_JOBS = Schema(CORPUS), Schema(DATASET)


def run_steps(train: ml_collections.ConfigDict, steps_per_epoch: int) -> int:
  """train.num_steps, or train.epochs passes of `steps_per_epoch` steps (at least one step)."""
  if train.num_steps > 0:
    return train.num_steps
  return max(int(math.ceil(train.epochs * steps_per_epoch)), 1)


def eval_every(train: ml_collections.ConfigDict, steps_per_epoch: int | None = None) -> int:
  """Steps between evaluations (0: none while training): train.eval_every_steps, or eval_every_epochs
  epochs of `steps_per_epoch` steps (at least one step)."""
  epochs = train.get("eval_every_epochs", 0.0)
  if train.eval_every_steps > 0 or not epochs:
    return train.eval_every_steps
  return max(int(round(epochs * steps_per_epoch)), 1)


def warmup_steps(optimizer: ml_collections.ConfigDict, num_steps: int) -> int:
  """optimizer.warmup_steps, or warmup_ratio of the run's `num_steps`, rounded."""
  return optimizer.warmup_steps or int(round(optimizer.warmup_ratio * num_steps))


def markdown_table() -> str:
  """docs/reference/configuration.md's config reference: one row per shared field."""
  rows = ["| field | jobs | allowed | meaning |", "|---|---|---|---|"]
  rows += [f"| `{f.key}` | {_JOBS[f.kinds]} | {f.allowed} | {f.meaning} |" for f in FIELDS]
  return "\n".join(rows)


START = "<!-- config schema: start (python3 -m bert_jax.config_schema docs/reference/configuration.md) -->"
END = "<!-- config schema: end -->"


def with_table(readme: str) -> str:
  """`readme` with the text between START and END replaced by the current table."""
  pattern = re.compile(re.escape(START) + ".*?" + re.escape(END), re.S)
  if not pattern.search(readme):
    raise UserError(f"the page has no {START} ... {END} block to write the table into")
  return pattern.sub(lambda _: f"{START}\n{markdown_table()}\n{END}", readme)


if __name__ == "__main__":
  with open(sys.argv[1], encoding="utf-8") as f:
    workdir.write_text(sys.argv[1], with_table(f.read()))
