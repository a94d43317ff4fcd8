"""The one schema of a config: each job's blocks (train, optimizer, checkpoint, data shared by all;
model, mesh, task, head, distill, mtdnn, sbert's pooling/ranking, seq2seq's decode, the pretraining
objectives' blocks: its own), each field's type and allowed values and its meaning, declared once
here and read by the validator (`Schema.check`, at the start of every job, by `bert-jax compile` and
`bert-jax info`), by `bert-jax config show --fields` and by docs/reference/configuration.md's table.

Two kinds of job read the shared blocks. Jobs on a corpus (pretraining, general distillation) stream
their input, so their length is counted in steps; jobs on a dataset (fine-tuning, task distillation)
know its size, so their length, evaluation cadence and warmup may also be given in epochs or as a
share. For a quantity given in two units (train.num_steps or train.epochs, train.eval_every_steps or
train.eval_every_epochs, optimizer.warmup_steps or optimizer.warmup_ratio) one rule holds: the steps
field, when > 0, wins over its twin (as in Hugging Face's Trainer, whose max_steps and warmup_steps
override num_train_epochs and warmup_ratio). The functions `run_steps`, `eval_every` and
`warmup_steps` apply it, in one place.

A field's `kinds` names the jobs that read it: a kind (CORPUS, DATASET: all its jobs, `JOB_KINDS`) or
job names. The shared blocks' fields are required; a job's own are checked when the config has them
(a preset sets those it uses). What needs the loaded data, the model or a registry's names (a task's
labels, a head kind, the teacher's layers) is checked where it is read. docs/reference/configuration.md's
config reference table is `markdown_table()`'s output, kept in step by tests/test_config_schema.py;
rewrite it with `python3 -m bert_jax.config_schema docs/reference/configuration.md`.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
import re
import sys
from typing import Any, Callable

import ml_collections
import numpy as np

from bert_jax import workdir
from bert_jax.errors import UserError

CORPUS, DATASET = "corpus", "dataset"  # the two kinds of job (see the module docstring)
BOTH = (CORPUS, DATASET)
# Each job (bert_jax/jobs.py registers its runner under the same name) and its kind.
JOB_KINDS = {"pretrain": CORPUS, "finetune": DATASET, "distill": DATASET, "theseus": DATASET,
             "general_distill": CORPUS, "sbert": DATASET, "mtdnn": DATASET, "seq2seq": DATASET}
FINETUNING = ("finetune", "distill", "theseus", "mtdnn")  # the jobs of finetune/trainer.py's Run and MT-DNN


@dataclasses.dataclass(frozen=True)
class Field:
  key: str  # "block.name"
  allowed: str  # the allowed values, as the error and the configuration reference say them
  check: Callable[[Any], bool]
  meaning: str
  kinds: tuple[str, ...] = BOTH  # the jobs that read it: kinds (CORPUS, DATASET) or job names
  required: bool = True  # a config of such a job must have it (the shared blocks); else checked when set

  def __post_init__(self):
    if not isinstance(self.kinds, tuple):
      raise TypeError(f"{self.key}: kinds={self.kinds!r} must be a tuple of kinds or job names")

  @property
  def block(self) -> str:
    """The block the field is in; "" for a top-level key (job, init_from, ...)."""
    return self.key.rpartition(".")[0]

  def read_by(self, job: str) -> bool:
    return job in self.kinds or JOB_KINDS.get(job) in self.kinds

  @property
  def jobs(self) -> str:
    """The jobs that read it, as the configuration reference says them."""
    if set(self.kinds) >= set(BOTH):
      return "all"
    return ", ".join(j for j in JOB_KINDS if self.read_by(j))


def _int(low: int) -> Callable[[Any], bool]:
  """A whole number (NumPy's too, as a model config built from arrays' shapes holds), not a bool, >= low."""
  return lambda v: isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_)) and v >= low


def _finite(v: Any) -> bool:
  """A real number (not a bool), neither infinite nor NaN: every float field's first check (1e309 parses as inf)."""
  return isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_)) and math.isfinite(v)


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
          "examples per step, over all hosts and micro-batches; an example is what the job's data counts: "
          "pretrain and general_distill a row of data.max_seq_length tokens; finetune, distill and theseus a "
          "task's example (one row; task.head=ranking: a group of task.ranking.group_size candidate rows; "
          "task.memory_segments=N: a row of N windows); mtdnn one example of the step's task, as finetune; "
          "sbert a sentence pair (or triplet); seq2seq a source and target pair. tokens/s counts every row's "
          "tokens"),
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
          "examples per evaluation batch (as train.batch_size counts them; ranking's evaluation scores rows); "
          "0: train.batch_size"),
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


def _any_int(v: Any) -> bool:
  return _int(-2 ** 63)(v)


def _size(v: Any) -> bool:
  """A mesh axis: a device count, or -1 for the devices the others leave."""
  return _int(1)(v) or v == -1


def _seq(v: Any) -> bool:
  return isinstance(v, (tuple, list))


def _mapping(v: Any) -> bool:
  return hasattr(v, "keys")


def _anything(v: Any) -> bool:
  del v
  return True


def _unit(v: Any) -> bool:
  return _number(0, 1)(v)


def _fraction(v: Any) -> bool:
  return _positive(v) and v <= 1


def _own(key: str, allowed: str, check: Callable[[Any], bool], meaning: str, kinds: tuple[str, ...] = BOTH) -> Field:
  """A field a job reads when its config sets it (not every preset of the job has it)."""
  return Field(key, allowed, check, meaning, kinds, required=False)


_INT, _NUM, _BOOL, _STR = ("an integer", _any_int), ("a number", _finite), ("true or false", _bool), ("a string", _str)
_SEQ, _MAP = ("a tuple", _seq), ("a block", _mapping)
_PRETRAIN, _SBERT, _SEQ2SEQ, _MTDNN = ("pretrain",), ("sbert",), ("seq2seq",), ("mtdnn",)
_DISTILLS, _TASK_DISTILL, _GENERAL = ("distill", "theseus", "general_distill"), ("distill",), ("general_distill",)
_TASK_JOBS = FINETUNING + ("sbert", "seq2seq")
_ONE_TASK = ("finetune", "distill", "theseus")  # finetune/trainer.py's Run: one task

FIELDS += (
    # The top level.
    _own("job", *_one_of(*JOB_KINDS), "the job the config is for (bert_jax/jobs.py): its runner, command and schema"),
    _own("init_from", *_STR, "start from this checkpoint: a bert_jax workdir or params checkpoint, a Hugging Face "
         "directory or hub name, a TF checkpoint; '': a fresh initialisation"),
    _own("init_from_model", *_BOOL, "the architecture, heads and tokenizer are init_from's (the model block: "
         "placeholders)", _PRETRAIN),
    _own("objective", *_STR, "the pretraining objective (training/objectives/, by name)", (CORPUS,)),
    _own("eval_only", *_BOOL, "evaluate init_from (a fine-tuning workdir of this task) and write predictions; "
         "no training", FINETUNING),
    _own("predict_split", *_one_of("", "dev", "test"), "which split gets a prediction file ('': none)", FINETUNING),
    _own("loss", *_STR, "the bi-encoder's loss: softmax (NLI), cosine (STS) or ranking (multiple negatives)",
         _SBERT),
    # train, optimizer, data: the fields some jobs add to the shared blocks.
    _own("train.mode", *_STR, "finetune (all parameters), adapters (Houlsby) or feature (frozen encoder, head "
         "only)", FINETUNING),
    _own("train.adapter_size", ">= 1", _int(1), "the adapters' bottleneck width with train.mode=adapters",
         FINETUNING),
    _own("train.head_seed", "an integer; -1: train.seed", _any_int,
         "the seed of the fresh parameters (the head, adapters; the model without init_from)", FINETUNING),
    _own("train.data_seed", "an integer; -1: train.seed", _any_int, "the seed of the training rows' order",
         FINETUNING),
    _own("train.dropout_seed", "an integer; -1: train.seed", _any_int, "the seed of dropout masks (and SMART's "
         "noise)", FINETUNING),
    _own("train.keep_best", *_BOOL, "keep the parameters of the best dev evaluation and report those",
         (DATASET,)),
    _own("train.early_stopping_patience", ">= 0", _int(0), "stop after this many evaluations without "
         "improvement; 0: never", (DATASET,)),
    _own("train.reinit_layers", ">= 0", _int(0), "re-initialise the top k encoder layers and the pooler",
         FINETUNING),
    _own("train.qat", *_BOOL, "Q8BERT: int8 matmuls in the forward pass, straight-through gradients "
         "(then `bert-jax quantize`)", FINETUNING),
    _own("optimizer.name", *_STR, "the optimizer (training/optim.py): adamw, lamb, adafactor, stable_adamw, ...",
         ("pretrain", "general_distill", "seq2seq")),
    _own("optimizer.frozen_learning_rate", "> 0", _positive, "the base rate in train.mode=adapters or feature",
         FINETUNING),
    _own("optimizer.head_learning_rate", ">= 0", _number(0), "the new head's rate; 0: optimizer.learning_rate",
         FINETUNING + _SBERT),
    _own("optimizer.layer_decay", "in (0, 1]", _fraction, "layer-wise decay: layer i trains at lr * decay ** "
         "(L + 1 - i); 1: off", FINETUNING + _SBERT),
    _own("optimizer.bias_correction", *_BOOL, "Adam's bias correction; false: the original BERTAdam",
         FINETUNING + _SBERT),
    _own("data.format", *_one_of("text", "bert_tfrecord"), "text (corpus, prepared or tfds_name) or "
         "bert_tfrecord (create_pretraining_data.py records in data.corpus)", (CORPUS,)),
    _own("data.corpus", "globs or ''", _str, "text files, comma separated; '' with no tfds_name: the embedded "
         "corpus", (CORPUS,)),
    _own("data.corpus_format", *_one_of("sentence_per_line", "document_per_line"), "how the corpus files hold "
         "documents", (CORPUS,)),
    _own("data.tfds_name", *_STR, "a TFDS text dataset to read instead of files; '': none", (CORPUS,)),
    _own("data.tfds_split", *_STR, "the TFDS split", (CORPUS,)),
    _own("data.tfds_feature", *_STR, "the TFDS feature holding the text", (CORPUS,)),
    _own("data.tfds_data_dir", *_STR, "the TFDS data directory; '': TFDS's default"),
    _own("data.prepared", "globs or ''", _str, "records written by `bert-jax data prepare`", (CORPUS,)),
    _own("data.eval_corpus", "globs or ''", _str, "the held-out set; '': data.eval_fraction of the documents",
         (CORPUS,)),
    _own("data.eval_fraction", "in [0, 1)", _number(0, 1, high_open=True), "the share of documents held out "
         "when data.eval_corpus is ''", (CORPUS,)),
    _own("data.tokenizer", *_STR, "the tokenizer kind (data_pipelines/tokenizer_kinds.py): wordpiece, "
         "sentencepiece, tokenizer_json, ...; it must match the vocabulary file", (CORPUS,)),
    _own("data.mask_rate", "in (0, 1)", lambda v: _positive(v) and v < 1, "the share of tokens masked", (CORPUS,)),
    _own("data.mask_rate_schedule", *_SEQ, "((step, rate), ...): from each step on, the rows of that step's "
         "batches are masked at that rate (data.mask_rate before the first); one run's masking-rate phases "
         "(mmBERT's 15% then its decay), changed inside the running input", (CORPUS,)),
    _own("data.masking", *_STR, "token, whole_word, ngram, span or knowledge (data_pipelines/masking.py)", (CORPUS,)),
    _own("data.knowledge", *_MAP, "data.masking=knowledge (ERNIE 1.0): spacy_model, phrases and each level's "
         "weight (data_pipelines/knowledge.py)", (CORPUS,)),
    _own("data.masking_mode", *_one_of("dynamic", "static"), "dynamic: fresh masks every epoch; static: "
         "data.dupe_factor fixed copies", (CORPUS,)),
    _own("data.dupe_factor", ">= 1", _int(1), "static masking: epochs repeat rows and masks with this period "
         "(BERT: 10)", (CORPUS,)),
    _own("data.mask_token", *_STR, "what the 80% branch writes: [MASK] or [UNK]", (CORPUS,)),
    _own("data.trigram_shuffle_rate", "in [0, 1]", _unit, "StructBERT: shuffle this share of the unmasked "
         "tokens' trigrams; 0: off", (CORPUS,)),
    _own("data.example_builder", *_STR, "how rows are built from documents: nsp, sop, sso, full_sentences, "
         "doc_sentences, ernie, ...", (CORPUS,)),
    _own("data.short_seq_prob", "in [0, 1]", _unit, "the chance a row targets a shorter length (BERT's "
         "short_seq_prob)", (CORPUS,)),
    _own("data.packing", *_BOOL, "pack whole documents per row (full_sentences and doc_sentences only)", (CORPUS,)),
    _own("data.num_shards", ">= 1", _int(1), "virtual shards: a multiple of the process count, dividing the "
         "global batch", (CORPUS,)),
    _own("data.shuffle_buffer", ">= 1", _int(1), "documents per shuffle block (rows are built and shuffled per "
         "block)", (CORPUS,)),
    _own("data.num_workers", ">= -1", _int(-1), "processes building and masking examples; 0: the training "
         "process; -1: one per core (the same batches for any value)", (CORPUS,)),
    _own("data.service_address", *_STR, "a tf.data service dispatcher (grpc://host:port) whose workers build the "
         "input; '': this process", (CORPUS,)),
    _own("data.seed", *_INT, "the input's seed: shard order, shuffling, masking", (CORPUS,)),
    _own("data.ernie_reorder_share", "in [0, 1]", _unit, "ERNIE 2.0: the share of rows that are sentence-"
         "reordering rows", _PRETRAIN),
    _own("data.noise_density", "in (0, 1)", lambda v: _positive(v) and v < 1, "T5's span corruption: the "
         "corrupted share of tokens", _PRETRAIN),
    _own("data.mean_noise_span_length", "> 0", _positive, "T5's span corruption: the mean span length",
         _PRETRAIN),
    _own("data.data_dir", *_STR, "the task's local files (GLUE TSVs, SQuAD JSON, CoNLL); '': TFDS or the "
         "embedded data", _TASK_JOBS),
    _own("data.length_buckets", "a tuple of whole token counts", _seq, "rows go to the smallest length that holds "
         "them, one compiled shape each; (): every row padded to data.max_seq_length", FINETUNING),
    _own("data.unpad", *_BOOL, "fine-tuning's steps, evaluation and predict pack each batch's real tokens into "
         "fewer rows (exact); refused for a model.family that cannot (init_from's runs padded)", FINETUNING),
    _own("data.train_limit", ">= 0", _int(0), "use only the first N training examples; 0: all",
         FINETUNING + _SEQ2SEQ),
    _own("data.eval_limit", ">= 0", _int(0), "evaluate only the first N dev examples; 0: all",
         FINETUNING + _SEQ2SEQ),
    _own("data.strict", *_BOOL, "malformed rows, misplaced answers: false warns with a count and goes on; true "
         "stops", FINETUNING + _SEQ2SEQ),
    _own("data.train_file", *_STR, "sentence pairs to train on; '': the embedded set", _SBERT),
    _own("data.dev_file", *_STR, "sentence1, sentence2 and score (tab-separated), scored by Spearman; '': the "
         "embedded set's dev pairs", _SBERT),
    _own("data.embedded_train", ">= 0", _int(0), "corpus sentences for the embedded set's training pairs",
         _SBERT),
    _own("data.embedded_dev", ">= 0", _int(0), "corpus sentences for the embedded set's dev pairs", _SBERT),
    _own("data.max_target_length", ">= 1", _int(1), "the decoder's tokens, </s> included (a longer target is an "
         "error)", _SEQ2SEQ),
    _own("data.train_source", *_STR, "task.family=files: one source text per line", _SEQ2SEQ),
    _own("data.train_target", *_STR, "task.family=files: its target on the same line", _SEQ2SEQ),
    _own("data.dev_source", *_STR, "task.family=files: the dev sources", _SEQ2SEQ),
    _own("data.dev_target", *_STR, "task.family=files: the dev targets", _SEQ2SEQ),
    # mesh: the device mesh and how names map onto it (training/partitioning.py).
    _own("mesh.data", ">= 1 or -1", _size, "devices along the data axis (the batch); -1: those the other axes "
         "leave"),
    _own("mesh.fsdp", ">= 1 or -1", _size, "devices the parameters and the batch are split over (ZeRO-3); -1: "
         "those the other axes leave"),
    _own("mesh.tensor", ">= 1 or -1", _size, "devices the wide per-layer axes are split over (Megatron); -1: "
         "those the other axes leave"),
    _own("mesh.shard_sequence", *_BOOL, "split the length axis of activations over the tensor axis between "
         "layers (sequence parallelism)"),
    _own("mesh.rules", "a tuple of (logical axis, mesh axes) pairs", _seq, "the logical axis names' mapping onto "
         "the mesh (configs/common.py: LOGICAL_AXIS_RULES)"),
    # task: the data a fine-tuning job trains on (finetune/task_registry.py).
    _own("task.family", *_STR, "the task family: glue, squad, ner, embedded, files, ... (finetune/"
         "task_registry.py; sbert and seq2seq: their own)", _TASK_JOBS),
    _own("task.name", *_STR, "the task within its family (e.g. a GLUE task)", _TASK_JOBS),
    _own("task.head", *_STR, "the head kind (models/head_kinds.py); '': the task's own", _ONE_TASK),
    _own("task.ranking", *_MAP, "task.head=ranking (MT-DNN's pairwise ranking): group_size, positive, scale",
         _ONE_TASK),
    _own("task.labels", *_SEQ, "the label names (NER's tags)", _ONE_TASK),
    _own("task.num_train", ">= 1", _int(1), "the embedded task's training examples", _ONE_TASK + _SEQ2SEQ),
    _own("task.num_dev", ">= 1", _int(1), "the embedded task's dev examples", _ONE_TASK + _SEQ2SEQ),
    _own("task.memory_segments", ">= 0", _int(0), "XLNet's segment recurrence: windows per example (a row is "
         "that many windows); 0: off", _ONE_TASK),
    _own("task.memory_len", ">= 0", _int(0), "the memory's tokens with task.memory_segments; 0: the model's "
         "mem_len", _ONE_TASK),
    _own("task.version", *_one_of("v1.1", "v2.0"), "the SQuAD version (v2.0 has unanswerable questions)",
         _ONE_TASK),
    _own("task.doc_stride", ">= 1", _int(1), "SQuAD: tokens between the starts of a context's windows", _ONE_TASK),
    _own("task.max_query_length", ">= 1", _int(1), "SQuAD: the question's tokens at most", _ONE_TASK),
    _own("task.max_answer_length", ">= 1", _int(1), "SQuAD: an answer's tokens at most", _ONE_TASK),
    _own("task.n_best_size", ">= 1", _int(1), "SQuAD: start and end candidates per window", _ONE_TASK),
    _own("task.null_score_diff_threshold", *_NUM, "SQuAD v2.0: predict no answer when the null score beats the "
         "best span's by this", _ONE_TASK),
    # head: the fine-tuning head's input.
    _own("head.pooling", *_STR, "pooled ([CLS] through the pooler) or layer_mix (a weighted mix of every "
         "layer's [CLS])", FINETUNING),
    _own("head.dropout", "in [0, 1)", _number(0, 1, high_open=True), "dropout before the head", FINETUNING),
    _own("head.cls_norm", *_STR, "none or isobn (the summary vector normalised, models/isobn.py)", FINETUNING),
    # smart (finetune/smart.py), sweep (finetune/sweep.py): fine-tuning's options.
    _own("smart.enabled", *_BOOL, "SMART (Jiang et al. 2019): adversarial regularisation and a Bregman "
         "proximal point term", FINETUNING),
    _own("smart.adversarial_weight", ">= 0", _number(0), "lambda_s; 0: no adversarial term", FINETUNING),
    _own("smart.bregman_weight", ">= 0", _number(0), "mu; 0: no Bregman proximal point term (and no teacher)",
         FINETUNING),
    _own("smart.noise_std", ">= 0", _number(0), "sigma of the initial perturbation", FINETUNING),
    _own("smart.step_size", ">= 0", _number(0), "eta of the ascent step", FINETUNING),
    _own("smart.epsilon", ">= 0", _number(0), "the perturbation's infinity-norm bound", FINETUNING),
    _own("smart.iterations", ">= 1", _int(1), "ascent steps (Algorithm 1's T_x; the paper uses 1)", FINETUNING),
    _own("smart.momentum", "in [0, 1]", _unit, "beta of the teacher for the first smart.momentum_switch of "
         "the steps", FINETUNING),
    _own("smart.late_momentum", "in [0, 1]", _unit, "beta of the teacher after that", FINETUNING),
    _own("smart.momentum_switch", "in [0, 1]", _unit, "the share of the steps at the first momentum",
         FINETUNING),
    _own("sweep.learning_rates", *_SEQ, "`bert-jax sweep`: the learning rates tried", FINETUNING),
    _own("sweep.batch_sizes", *_SEQ, "the batch sizes tried", FINETUNING),
    _own("sweep.epochs", *_SEQ, "the run lengths tried, in epochs", FINETUNING),
    _own("sweep.seeds", *_SEQ, "the seeds tried", FINETUNING),
    _own("sweep.vary_seed", *_one_of("all", "head", "data", "dropout"), "which seed sweep.seeds set: all "
         "(train.seed), head, data or dropout", FINETUNING),
    _own("sweep.eta", ">= 2", _int(2), "successive halving: keep the best 1/eta configurations at each rung",
         FINETUNING),
    _own("sweep.min_fraction", "in (0, 1]", _fraction, "the first rung trains this share of each run's steps",
         FINETUNING),
    # distill: task distillation (compress/distill.py), Theseus, general distillation (compress/general.py).
    _own("distill.teacher", *_STR, "the teacher: a workdir or checkpoint (a fine-tuning workdir of the task, or a "
         "pretraining one for general distillation)", _DISTILLS),
    _own("distill.temperature", "> 0", _positive, "the soft targets' softmax temperature (the KL scaled by T^2)",
         _TASK_DISTILL + _GENERAL),
    _own("distill.soft_weight", ">= 0", _number(0), "the weight of the KL to the teacher's soft targets",
         _TASK_DISTILL + _GENERAL),
    _own("distill.hard_weight", ">= 0", _number(0), "the weight of the student's own loss on the labels (or MLM)",
         _TASK_DISTILL + _GENERAL),
    _own("distill.hidden_weight", ">= 0", _number(0), "hidden-state MSE over the layer map (TinyBERT)",
         _TASK_DISTILL),
    _own("distill.attention_weight", ">= 0", _number(0), "attention transfer: the KL of the heads' attention",
         _TASK_DISTILL + _GENERAL),
    _own("distill.pkd_weight", ">= 0", _number(0), "normalised [CLS] MSE of the intermediate layers (BERT-PKD)",
         _TASK_DISTILL),
    _own("distill.projection", *_BOOL, "a learned student-to-teacher width map where the widths differ",
         _TASK_DISTILL),
    _own("distill.require_init_from", *_BOOL, "the student must start from a pretrained one (init_from; PD)",
         _TASK_DISTILL),
    _own("distill.soft_loss", *_one_of("kl", "logit_mse"), "the soft term: KL, or the squared distance of the "
         "logits (Tang et al.'s BiLSTM)", _TASK_DISTILL),
    _own("distill.student_layers", *_STR, "the student as teacher layers: '', every_other or indices "
         "(compress/teacher.py)", _TASK_DISTILL + _GENERAL),
    _own("distill.cosine_weight", ">= 0", _number(0), "1 - cos of the last hidden states (DistilBERT; the same "
         "width)", _GENERAL),
    _own("distill.alpha", "in [0, 1]", _unit, "pre-training distillation: alpha MLM + (1 - alpha) KD", _GENERAL),
    _own("distill.feature_weight", ">= 0", _number(0), "MobileBERT's feature-map transfer: the MSE of each "
         "layer's outputs", _GENERAL),
    _own("distill.stage_steps", ">= 1", _int(1), "MobileBERT's progressive transfer: the steps of each layer's "
         "stage", _GENERAL),
    _own("distill.modules", ">= 0", _int(0), "Theseus: successor layers (each replacing teacher layers / modules "
         "layers); 0: half the teacher's", ("theseus",)),
    _own("distill.replace_rate", "in [0, 1]", _unit, "Theseus: the curriculum's base replacement rate b",
         ("theseus",)),
    _own("distill.curriculum_fraction", "in (0, 1]", _fraction, "Theseus: the replacement rate reaches 1 after "
         "this share of the steps", ("theseus",)),
    # mtdnn (finetune/multitask.py).
    _own("mtdnn.tasks", *_MAP, "the tasks, by name: each a task block (family, name, ...)", _MTDNN),
    _own("mtdnn.select", *_STR, "comma-separated names of mtdnn.tasks to train (e.g. rte,mrpc); '': all",
         _MTDNN),
    _own("mtdnn.sampling", *_STR, "proportional (each task as often as its rows) or temperature", _MTDNN),
    _own("mtdnn.temperature", "> 0", _positive, "mtdnn.sampling=temperature: tasks drawn by size ** (1 / T)",
         _MTDNN),
    _own("mtdnn.loss_weights", *_MAP, "each task's loss weight (>= 0), by name; a task not named: 1", _MTDNN),
    # sbert (sbert/train.py): the bi-encoder's pooling and losses.
    _own("pooling.modes", *_SEQ, "cls, max, mean, mean_sqrt_len_tokens, concatenated in this order", _SBERT),
    _own("pooling.normalize", *_BOOL, "L2-normalise the embedding (sentence-transformers' Normalize)", _SBERT),
    _own("softmax.labels", *_SEQ, "loss=softmax: the NLI labels", _SBERT),
    _own("cosine.score_scale", "> 0", _positive, "loss=cosine: the gold scores are divided by this", _SBERT),
    _own("ranking.scale", "> 0", _positive, "loss=ranking: the similarities' scale (sentence-transformers' "
         "MultipleNegativesRankingLoss)", _SBERT),
    _own("ranking.directions", *_SEQ, "query_to_doc and any of query_to_query, doc_to_query, doc_to_doc", _SBERT),
    _own("ranking.partition_mode", *_STR, "joint or per_direction (the softmax over all directions or each)",
         _SBERT),
    _own("ranking.chunk_tokens", ">= 0", _int(0), "GradCache: embed the batch in chunks of at most this many "
         "tokens per device; 0: chunks of rows", _SBERT),
    _own("ranking.matryoshka_dims", *_SEQ, "Matryoshka: the loss also at these leading dimensions; (): off",
         _SBERT),
    _own("ranking.matryoshka_weights", *_SEQ, "each matryoshka dimension's weight; (): 1 each", _SBERT),
    # seq2seq (finetune/seq2seq.py).
    _own("decode.num_beams", ">= 1", _int(1), "beams of the search that writes predictions (1: greedy)",
         _SEQ2SEQ),
    # The pretraining objectives' own blocks (training/objectives/).
    _own("electra.disc_weight", ">= 0", _number(0), "ELECTRA: the discriminator loss's weight (lambda)",
         _PRETRAIN),
    _own("electra.generator_hidden_fraction", "in (0, 1]", _fraction, "ELECTRA: the generator's width as a share "
         "of the discriminator's", _PRETRAIN),
    _own("electra.generator_layer_fraction", "in (0, 1]", _fraction, "ELECTRA: the generator's depth as a share "
         "of the discriminator's", _PRETRAIN),
    _own("rtd.disc_weight", ">= 0", _number(0), "DeBERTa-v3: the discriminator loss's weight", _PRETRAIN),
    _own("rtd.generator_layer_fraction", "in (0, 1]", _fraction, "DeBERTa-v3: the generator's depth as a share "
         "of the discriminator's", _PRETRAIN),
    _own("xlnet.mem_len", ">= 0", _int(0), "XLNet: memory tokens carried to the next step", _PRETRAIN),
    _own("xlnet.reuse_len", ">= 0", _int(0), "XLNet: the tokens of a row the next step's memory reuses",
         _PRETRAIN),
    _own("xlnet.bi_data", *_BOOL, "XLNet: half the batch read backwards", _PRETRAIN),
    _own("xlnet.prediction_k", ">= 1", _int(1), "XLNet: 1/K of the tokens are predicted", _PRETRAIN),
    _own("xlnet.max_span", ">= 1", _int(1), "XLNet: the longest span of predicted tokens", _PRETRAIN),
    _own("xlnet.span_context", ">= 1", _int(1), "XLNet: the context around each span", _PRETRAIN),
    _own("ernie.stages", *_SEQ, "ERNIE 2.0's continual multi-task stages: START:task=weight,...", _PRETRAIN),
    _own("ernie.labelled", *_SEQ, "ERNIE 2.0's labelled tasks: name:num_classes:path", _PRETRAIN),
    _own("ernie_thu.entity_embeddings", *_STR, "ERNIE-THU: the entity vectors; embedded: the toy ones", _PRETRAIN),
    _own("ernie_thu.mentions", *_STR, "ERNIE-THU: the entity mentions; embedded: the toy ones", _PRETRAIN),
    _own("ernie_thu.max_entities", ">= 1", _int(1), "ERNIE-THU: entities per row at most", _PRETRAIN),
    _own("ernie_thu.dea_mask", "in [0, 1]", _unit, "ERNIE-THU's denoising entity auto-encoder: the share of "
         "alignments masked", _PRETRAIN),
    _own("ernie_thu.dea_replace", "in [0, 1]", _unit, "ERNIE-THU's dEA: the share of alignments replaced",
         _PRETRAIN),
    # model: the family's config class (models/records/; ModelConfig for BERT's families) reads it; the plain
    # fields' ranges are checked here, by the config classes too (`check_block`); a family's choices and the
    # rules between fields stay with its class.
    _own("model.family", *_STR, "the family record (models/records/); '': read off BERT's switches"),
    _own("model.vocab_size", ">= 1", _int(1), "the vocabulary's size"),
    _own("model.hidden_size", ">= 1", _int(1), "the width of the hidden states"),
    _own("model.num_layers", ">= 1", _int(1), "the encoder's layers"),
    _own("model.num_heads", ">= 1", _int(1), "attention heads per layer"),
    _own("model.intermediate_size", ">= 1", _int(1), "the feed-forward sublayer's width"),
    _own("model.max_position_embeddings", ">= 1", _int(1), "the longest row the position table holds"),
    _own("model.scan_unroll", ">= 1", _int(1), "layers per iteration of the scanned loop"),
    _own("model.type_vocab_size", ">= 0", _int(0), "token types (segments); 0: none"),
    _own("model.embedding_size", ">= 0", _int(0), "the token embeddings' width (ALBERT's factorisation); 0: "
         "model.hidden_size"),
    _own("model.hidden_dropout", "in [0, 1)", _number(0, 1, high_open=True), "dropout on the hidden states"),
    _own("model.attention_dropout", "in [0, 1)", _number(0, 1, high_open=True), "dropout on the attention "
         "probabilities"),
    _own("model.dropout", "in [0, 1)", _number(0, 1, high_open=True), "dropout (T5, XLNet, BiLSTM)"),
    _own("model.embedding_dropout", "in [0, 1)", _number(0, 1, high_open=True), "dropout on the embeddings "
         "(ModernBERT)"),
    _own("model.mlp_dropout", "in [0, 1)", _number(0, 1, high_open=True), "dropout in the feed-forward "
         "sublayer (ModernBERT)"),
    _own("model.layer_norm_eps", "> 0", _positive, "LayerNorm's epsilon"),
    _own("model.norm_eps", "> 0", _positive, "the norm's epsilon (ModernBERT, T5)"),
    _own("model.initializer_range", "> 0", _positive, "the initial weights' standard deviation"),
    _own("model.initializer_cutoff_factor", "> 0", _positive, "ModernBERT: the truncation of the initial "
         "weights, in standard deviations"),
    _own("model.initializer_factor", "> 0", _positive, "T5: the scale of the initial weights"),
    _own("model.hidden_act", *_STR, "the activation (the family's choices: gelu, gelu_tanh, relu, ...)"),
    _own("model.head_act", *_STR, "ModernBERT: the prediction head's activation"),
    _own("model.pooler_act", *_STR, "DeBERTa: the pooler's activation"),
    _own("model.position_style", *_STR, "absolute (0..T-1) or roberta (non-pad tokens from pad_token_id + 1)"),
    _own("model.pad_token_id", ">= 0", _int(0), "the padding token's id"),
    _own("model.eos_token_id", ">= 0", _int(0), "T5: the end-of-sequence token's id"),
    _own("model.decoder_start_token_id", ">= 0", _int(0), "T5: the token the decoder starts from"),
    _own("model.share_layers", *_STR, "cross-layer sharing (ALBERT): none, all, attention, ffn"),
    _own("model.use_pooler", *_BOOL, "the pooler (dense + tanh on [CLS]) that sentence heads read"),
    _own("model.mlm_head", *_BOOL, "the masked-LM head"),
    _own("model.sentence_head", *_STR, "the pretraining sentence head: nsp, sop or none"),
    _own("model.rtd_head", *_BOOL, "ELECTRA's replaced-token-detection head"),
    _own("model.dtype", *_STR, "the compute dtype: float32, bfloat16 (float16 where the family has it)"),
    _own("model.param_dtype", *_STR, "the parameters' dtype: float32 or bfloat16"),
    _own("model.remat", *_STR, "activation checkpointing per layer: none, full, dots, dots_no_batch"),
    _own("model.scan_layers", *_BOOL, "stacked layer parameters and one scan over the layers; false: unrolled"),
    _own("model.attention", *_STR, "the attention backend (models/attention.py): dot, splash, cudnn, auto"),
    _own("model.pruned_heads", "'' or {layer: [heads]}", _anything, "the heads removed from each layer (HF's "
         "pruned_heads)"),
    _own("model.sublayer_order", *_STR, "a sandwich transformer's order of s and f sublayers; '': interleaved"),
    _own("model.causal", *_BOOL, "each token attends to itself and those before it (a left-to-right model)"),
    _own("model.num_tasks", ">= 0", _int(0), "ERNIE 2.0's task embeddings; 0: none"),
    _own("model.entity_layers", ">= 0", _int(0), "ERNIE-THU: the top layers that fuse entities; 0: none"),
    _own("model.entity_dim", ">= 1", _int(1), "ERNIE-THU: the entity vectors' width"),
    _own("model.entity_heads", ">= 1", _int(1), "ERNIE-THU: the entity self-attention's heads"),
    _own("model.entity_fusion", *_STR, "ERNIE-THU: paper or residual (thunlp/ERNIE's code)"),
    _own("model.local_window", ">= 1", _int(1), "ModernBERT: a local layer's window (both sides)"),
    _own("model.global_every", ">= 1", _int(1), "ModernBERT: layers 0, n, 2n, ... attend globally"),
    _own("model.global_rope_theta", "> 0", _positive, "ModernBERT: the global layers' rotary base"),
    _own("model.local_rope_theta", "> 0", _positive, "ModernBERT: the local layers' rotary base"),
    _own("model.pooling", *_STR, "ModernBERT: the sequence head's pooling, cls or mean"),
    _own("model.head_dim", ">= 1", _int(1), "T5: each head's width"),
    _own("model.num_decoder_layers", ">= 0", _int(0), "T5: the decoder's layers; 0: model.num_layers"),
    _own("model.relative_buckets", ">= 1", _int(1), "T5: relative position buckets"),
    _own("model.relative_max_distance", ">= 1", _int(1), "T5: the distance the last bucket starts at"),
    _own("model.feed_forward", *_STR, "T5: the feed-forward sublayer: relu, gated-gelu, ..."),
    _own("model.tie_word_embeddings", *_BOOL, "T5: the output layer is the embedding table"),
    _own("model.scale_decoder_outputs", *_BOOL, "T5: scale the decoder's outputs by d ** -0.5 (tied "
         "embeddings)"),
    _own("model.position_buckets", ">= 0", _int(0), "DeBERTa: log-bucketed relative positions"),
    _own("model.max_relative_positions", *_INT, "DeBERTa: the relative span; -1: max_position_embeddings"),
    _own("model.pos_att_type", *_STR, "DeBERTa: the disentangled attention's terms (p2c, c2p)"),
    _own("model.position_biased_input", *_BOOL, "DeBERTa: absolute positions added to the input"),
    _own("model.norm_rel_ebd", *_STR, "DeBERTa: the relative embeddings' norm"),
    _own("model.emd_steps", ">= 0", _int(0), "DeBERTa: the enhanced mask decoder's steps; 0: none"),
    _own("model.classifier_activation", *_BOOL, "a family's classifier: an activation before the output layer"),
    _own("model.mem_len", ">= 0", _int(0), "XLNet: memory tokens; 0: none"),
    _own("model.reuse_len", ">= 0", _int(0), "XLNet: the tokens a row's memory reuses"),
    _own("model.clamp_len", *_INT, "XLNet: relative distances clamped to this; -1: none"),
    _own("model.bi_data", *_BOOL, "XLNet: half the batch read backwards"),
    _own("model.start_n_top", ">= 1", _int(1), "XLNet's beam QA head: start candidates"),
    _own("model.end_n_top", ">= 1", _int(1), "XLNet's beam QA head: end candidates per start"),
    _own("model.window_len", ">= 0", _int(0), "XLNet: the attention's window; 0: the whole row"),
    _own("model.intra_bottleneck_size", ">= 1", _int(1), "MobileBERT: the bottleneck's width"),
    _own("model.use_bottleneck", *_BOOL, "MobileBERT: bottlenecks around each layer"),
    _own("model.use_bottleneck_attention", *_BOOL, "MobileBERT: attention on the bottleneck's output"),
    _own("model.key_query_shared_bottleneck", *_BOOL, "MobileBERT: queries and keys share the bottleneck"),
    _own("model.num_feedforward_networks", ">= 1", _int(1), "MobileBERT: stacked feed-forward sublayers"),
    _own("model.normalization_type", *_STR, "MobileBERT: layer_norm or no_norm"),
    _own("model.trigram_input", *_BOOL, "MobileBERT: the embedding reads each token's trigram"),
    _own("model.lstm_size", ">= 1", _int(1), "the BiLSTM student's state width per direction"),
)


_MISSING = object()


def _get(config: ml_collections.ConfigDict, key: str) -> Any:
  """The value at `key` ("block.name", "name" or "block.sub.name"), or _MISSING."""
  value = config
  for name in key.split("."):
    if not hasattr(value, "keys") or name not in value:
      return _MISSING
    value = value[name]
  return value


def check_field(f: Field, value: Any) -> None:
  """UserError, one line: the field, its value, what it allows and what it means."""
  if not f.check(value):
    finite = "a finite number, " if isinstance(value, float) and not math.isfinite(value) else ""
    raise UserError(f"{f.key}={value!r} must be {finite}{f.allowed}: {f.meaning}")


def check_block(block: str, values: Any) -> None:
  """The declared fields of `block` that `values` (a ConfigDict or a frozen config dataclass, such as a
  family's model config) has: what a model config class checks of its plain fields."""
  for f in FIELDS:
    if f.block == block and hasattr(values, f.key.rpartition(".")[2]):
      check_field(f, getattr(values, f.key.rpartition(".")[2]))


@dataclasses.dataclass(frozen=True)
class Schema:
  """The blocks one job reads (its fields: those whose `kinds` name the job or its kind) and the
  validator of a config for it. `job` is a job name of JOB_KINDS, or a kind for the shared fields of
  every job of that kind."""
  job: str

  @property
  def kind(self) -> str:
    return JOB_KINDS.get(self.job, self.job)

  @property
  def fields(self) -> tuple[Field, ...]:
    return tuple(f for f in FIELDS if f.read_by(self.job))

  def declares(self, key: str) -> bool:
    return any(f.key == key for f in self.fields)

  def check(self, config: ml_collections.ConfigDict) -> None:
    """UserError naming the first field that is missing (a required one) or out of its allowed values, or a
    run with no length; then fills in what 0 stands for (train.eval_batch_size)."""
    for f in self.fields:
      value = _get(config, f.key)
      if value is _MISSING:
        if f.required:
          raise UserError(f"the config has no {f.key} ({f.meaning}); every {self.kind} job's config has it: "
                          "start from a preset in configs/")
        continue
      check_field(f, value)
    train = config.train
    if self.kind == CORPUS and train.num_steps < 1:
      raise UserError(f"train.num_steps={train.num_steps} must be >= 1: a job on a corpus counts its length in steps")
    if self.kind == DATASET and train.num_steps == 0 and train.epochs == 0:
      raise UserError("train.num_steps=0 and train.epochs=0: set the run's length in one of them")
    if config.train.eval_batch_size == 0:
      config.train.eval_batch_size = config.train.batch_size

  def described(self, config: ml_collections.ConfigDict) -> list[str]:
    """`bert-jax config show --fields`: each declared field the config has, its value, what it allows and
    means; then any key of the config the job's schema does not declare."""
    lines = [f"{f.key} = {_get(config, f.key)!r}  ({f.allowed}) {f.meaning}" for f in self.fields
             if _get(config, f.key) is not _MISSING]
    lines += [f"{key} = {_get(config, key)!r}  (not declared by job {self.job}'s schema)"
              for key in set_keys(config) if not self.declares(key)]
    return lines


SCHEMAS = {name: Schema(name) for name in JOB_KINDS}
CORPUS_JOBS, DATASET_JOBS = Schema(CORPUS), Schema(DATASET)


def of(config: ml_collections.ConfigDict, kind: str) -> Schema:
  """The schema of the job `config.job` names; a config without a known job: the shared fields of `kind`."""
  return SCHEMAS.get(config.get("job"), Schema(kind))


def set_keys(config: ml_collections.ConfigDict) -> list[str]:
  """The keys a config sets, as its schema declares them: "name" at the top, "block.name" below (a block
  within a block, such as task.ranking or mtdnn.tasks, is one key)."""
  keys = []
  for name, value in config.items():
    keys += [f"{name}.{sub}" for sub in value.keys()] if hasattr(value, "keys") else [name]
  return sorted(keys)


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
  """docs/reference/configuration.md's config reference: one row per field, block by block."""
  rows = ["| field | jobs | allowed | meaning |", "|---|---|---|---|"]
  rows += [f"| `{f.key}` | {f.jobs} | {f.allowed} | {f.meaning} |" for f in FIELDS]
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
