"""The text-to-text fine-tuning job (`seq2seq`; `bert-jax finetune --config configs/t5_finetune.py:PRESET`): a T5
checkpoint (a T5 pretraining workdir, a Hugging Face T5 folder, another seq2seq workdir) or a fresh T5 trained on
(source, target) text pairs with teacher-forced cross-entropy on the targets, evaluated by greedy (or beam)
decoding: exact match of the generated strings (T5's accuracy for a recast classification task).

  task.family=glue      a GLUE task recast as T5 does (finetune/text_to_text.py), from data.data_dir's TSVs or tfds
  task.family=files     data.train_source/train_target and data.dev_source/dev_target, one example per line
  task.family=embedded  the embedded word-order task (finetune/embedded.py) recast: "embedded sentence: ..." ->
                        "original" / "shuffled" (task.name=first_word: its first-word task), offline

Every pair is encoded before the workdir is written: a target longer than the decoder's length
(data.max_target_length, </s> included) is one line and exit 2. It is a learner on the one driver
(training/driver.py: keep-best on exact match, early stopping, pausing, the finish). The workdir it leaves:
params/ (T5Model's tree, nothing else), config.json (the model, the tokenizer, `decode`), the tokenizer,
eval_results.json, predictions/dev.jsonl ({source, target, prediction}); so `bert-jax predict --model WORKDIR`
generates (`Generator`) and `bert-jax convert --to hf WORKDIR OUT` writes a T5ForConditionalGeneration.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from bert_jax import config_schema, params_checkpoint, pretrained, workdir as workdir_lib
from bert_jax.data_pipelines import tokenizer_kinds
from bert_jax.errors import UserError
from bert_jax.finetune import embedded, glue, text_to_text
from bert_jax.finetune.batching import train_batches
from bert_jax.models import families, t5_decode
from bert_jax.training import checkpoint, driver, optim, partitioning
from bert_jax.training.objectives.base import token_nll_and_correct
from bert_jax.training.step import sharded_setup, summarize_eval

JOB = "seq2seq"
TASK_FAMILIES = ("glue", "files", "embedded")
PREDICTIONS_FILE = "dev.jsonl"


class Seq2SeqObjective:
  """Teacher-forced cross-entropy of the targets (training/step.py's objective): batch input_ids, attention_mask
  int32[B, T]; decoder_input_ids, labels int32[B, S] (labels 0: padding, not scored)."""

  def __init__(self, model):
    self.model = model

  def init(self, rng: jax.Array, batch: Any = None) -> Any:
    del batch
    ids = jnp.zeros((1, 8), jnp.int32)
    return self.model.init({"params": rng}, ids, decoder_input_ids=ids)["params"]

  def sums(self, params: Any, batch: dict, rng: jax.Array | None, deterministic: bool) -> dict[str, jax.Array]:
    logits = self.model.apply({"params": params}, batch["input_ids"], attention_mask=batch["attention_mask"],
                              decoder_input_ids=batch["decoder_input_ids"], deterministic=deterministic,
                              rngs=None if deterministic else {"dropout": rng}).logits
    weights = (batch["labels"] != 0).astype(jnp.float32)
    nll, correct = token_nll_and_correct(logits, batch["labels"])
    return {"target_loss": jnp.sum(nll * weights), "target_correct": jnp.sum(correct * weights)}

  def counts(self, batch: dict) -> dict[str, jax.Array]:
    return {"targets": jnp.sum((batch["labels"] != 0).astype(jnp.float32)),
            "rows": jnp.asarray(batch["input_ids"].shape[0], jnp.float32)}

  def loss(self, sums: dict, counts: dict) -> jax.Array:
    return sums["target_loss"] / jnp.maximum(counts["targets"], 1.0)

  def metrics(self, sums: dict, counts: dict) -> dict[str, jax.Array]:
    n = jnp.maximum(counts["targets"], 1.0)
    return {"target_loss": sums["target_loss"] / n, "target_accuracy": sums["target_correct"] / n}


# --- the data --------------------------------------------------------------------------------------------------


def _glue_pairs(config: ml_collections.ConfigDict, split: str) -> list[tuple[str, str]]:
  """GLUE rows (data.data_dir's TSVs or tfds, as fine-tuning reads them) recast as T5 does."""
  name = config.task.name
  if name not in glue.SPECS:
    raise UserError(f"task.name={name!r} is not a GLUE task; choose one of {sorted(glue.SPECS)}")
  spec = glue.SPECS[name]
  suffix = spec.splits[0] if split == "dev" else ""
  rows = glue._read_split(config, spec, split + suffix)  # pylint: disable=protected-access
  field_a, field_b = spec.tfds_fields
  pairs = []
  for a, b, label in rows:
    example = {field_a: a, **({field_b: b} if field_b else {})}
    example["label"] = (float(label) if not spec.labels else spec.labels.index(label)) if label is not None else -1
    pairs.append(text_to_text.glue_example(name, example))
  return pairs


def _embedded_pairs(config: ml_collections.ConfigDict, split: str) -> list[tuple[str, str]]:
  name, _, rows_of = embedded.variant(config)
  num_dev, num_train = config.task.num_dev, config.task.num_train
  sentences = embedded.corpus_sentences(num_dev + num_train)
  chosen = sentences[:num_dev] if split == "dev" else sentences[num_dev:]
  return [(f"{name} sentence: {text}", label) for text, _, label in rows_of(chosen, seed=1 if split == "dev" else 2)]


def _file_pairs(config: ml_collections.ConfigDict, split: str) -> list[tuple[str, str]]:
  source, target = config.data[f"{split}_source"], config.data[f"{split}_target"]
  if not (source and target):
    raise UserError(f"task.family='files' reads data.{split}_source and data.{split}_target (one example per line)")
  for path in (source, target):
    if not workdir_lib.path(path).exists():
      raise UserError(f"{path} not found (data.{split}_source / data.{split}_target)")
  return text_to_text.read_pairs(source, target)


_READERS = {"glue": _glue_pairs, "files": _file_pairs, "embedded": _embedded_pairs}


def read_pairs(config: ml_collections.ConfigDict, split: str) -> list[tuple[str, str]]:
  """(source, target) pairs of `split` (train | dev), the first data.{split}_limit of them (0: all)."""
  if config.task.family not in _READERS:
    raise UserError(f"task.family={config.task.family!r} is not one of {TASK_FAMILIES}")
  pairs = _READERS[config.task.family](config, split)
  limit = config.data.train_limit if split == "train" else config.data.eval_limit
  pairs = pairs[:limit] if limit else pairs
  if not pairs:
    raise UserError(f"the {split} split of task {config.task.name!r} has no examples")
  return pairs


def load_tokenizer(config: ml_collections.ConfigDict):
  """data.vocab (a T5 spiece.model), else init_from's, else the embedded corpus's T5 vocabulary."""
  from bert_jax.data_pipelines import embedded as embedded_data, t5_spm  # pylint: disable=import-outside-toplevel
  from bert_jax.data_pipelines.tokenizers import load_tokenizer as load_vocab  # pylint: disable=import-outside-toplevel
  if config.data.vocab:
    return load_vocab(config.data.vocab, False, kind=t5_spm.KIND)
  if config.init_from:
    import bert_jax  # pylint: disable=import-outside-toplevel
    return bert_jax.load_tokenizer(config.init_from)
  return load_vocab(embedded_data.ensure_t5_sentencepiece(), False, kind=t5_spm.KIND)


@dataclasses.dataclass
class Data:
  """The task's encoded pairs, read and checked before the workdir is written."""
  tokenizer: Any
  train: dict[str, np.ndarray]
  dev: dict[str, np.ndarray]
  dev_pairs: list[tuple[str, str]]


def read_data(config: ml_collections.ConfigDict) -> Data:
  tokenizer = load_tokenizer(config)
  if getattr(tokenizer, "eos_id", None) is None:
    raise UserError(f"the tokenizer ({tokenizer.path}) is not T5's: a seq2seq run needs a T5 vocabulary "
                    "(a spiece.model as data.vocab, or a T5 init_from)")
  length, target_length = config.data.max_seq_length, config.data.max_target_length
  encoded = {}
  for split in ("train", "dev"):
    pairs = read_pairs(config, split)
    try:
      encoded[split] = (pairs, text_to_text.encode_pairs(pairs, tokenizer, length, target_length))
    except UserError as e:
      raise UserError(f"the {split} split: {e} (data.max_target_length={target_length})") from None
  if len(encoded["train"][0]) < config.train.batch_size:
    raise UserError(f"{len(encoded['train'][0])} training pairs are fewer than train.batch_size="
                    f"{config.train.batch_size}")
  return Data(tokenizer, encoded["train"][1], encoded["dev"][1], encoded["dev"][0])


# --- the model and its checks ----------------------------------------------------------------------------------


def model_config(config: ml_collections.ConfigDict):
  """init_from's T5 (its dropout config.model.dropout's), else config.model."""
  saved = workdir_lib.read_config(config.init_from)["model"] if config.init_from else config.model.to_dict()
  model = families.model_config(dict(saved))
  if model.family != "t5":
    raise UserError(f"init_from: {config.init_from} holds a model of family {model.family!r}; a seq2seq run "
                    "fine-tunes a T5 (family 't5')")
  return model.replace(dropout=config.model.dropout)


def validate(config: ml_collections.ConfigDict) -> None:
  """The shared blocks (bert_jax/config_schema.py), then the seq2seq job's own fields."""
  config_schema.of(config, config_schema.DATASET).check(config)
  if config.task.family not in TASK_FAMILIES:
    raise UserError(f"task.family={config.task.family!r} is not one of {TASK_FAMILIES}")


class Seq2Seq:
  """The seq2seq job's learner (training/driver.py): its pairs' batches, its step, the dev exact match of the
  generated strings (the score) and the T5 model as params/."""

  evaluates_start = False
  score_name = "exact_match"

  def __init__(self, config: ml_collections.ConfigDict, run_dir, data: Data):
    self.config, self.run_dir, self.data = config, run_dir, data
    self.model_config = model_config(config)
    if self.model_config.vocab_size < data.tokenizer.vocab_size:
      raise UserError(f"the tokenizer has {data.tokenizer.vocab_size} ids and the model's vocabulary "
                      f"{self.model_config.vocab_size}: give the model's own vocabulary (data.vocab)")
    self.model = families.build(self.model_config)
    self.objective = Seq2SeqObjective(self.model)
    train = config.train
    self.steps_per_epoch = max(len(data.train["input_ids"]) // train.batch_size, 1)
    num_steps = config_schema.run_steps(train, self.steps_per_epoch)
    init_params = self.objective.init
    make_tx = lambda abstract: optim.make_optimizer(  # noqa: E731
        config.optimizer, num_steps, partitioning.stacked_layers_tree(abstract))
    self.setup = sharded_setup(config, self.objective, init_params, make_tx, num_steps)
    self.tokens_per_step = train.batch_size * (config.data.max_seq_length + config.data.max_target_length)
    self._rng = jax.random.key(train.seed)

  def initial_params(self) -> Any:
    """init_from's T5 (every parameter) over a fresh init, or a fresh init."""
    params = self.setup.init_params(jax.random.key(self.config.train.seed))
    if self.config.init_from:
      params = checkpoint.load_params_into(self.config.init_from, params)
      print(f"initialised the T5 from {self.config.init_from}", flush=True)
    else:
      print("model: a random T5 (no init_from); --config.init_from=CKPT fine-tunes a pretrained one", flush=True)
    return params

  def batches(self, start: int, end: int):
    return train_batches(self.data.train, self.config.train.batch_size, self.config.train.seed, start, end)

  def step(self, state: Any, batch: dict) -> tuple[Any, dict]:
    return self.setup.train_step(state, batch, self._rng)

  def evaluate(self, params: Any) -> driver.Scored:
    """Dev: the generated strings' exact match, and the teacher-forced loss and token accuracy."""
    predictions = generate(self.model, params, self.data.dev, self.data.tokenizer, self.config.train.eval_batch_size,
                           self.config.data.max_target_length, self.config.decode.num_beams)
    scores = {"exact_match": text_to_text.exact_match(predictions, [t for _, t in self.data.dev_pairs]),
              **self._dev_loss(params)}
    return driver.Scored(scores["exact_match"], scores, scores, scores["target_loss"], predictions)

  def _dev_loss(self, params: Any) -> dict[str, float]:
    size, dev = self.config.train.eval_batch_size, self.data.dev
    rows = len(dev["input_ids"])
    totals = None
    for start in range(0, rows, size):
      batch = {k: _padded(v[start:start + size], size) for k, v in dev.items()}
      out = self.setup.eval_step(params, partitioning.global_batch(batch, self.setup.mesh))
      totals = out if totals is None else jax.tree.map(lambda a, b: a + b, totals, out)
    return {k: float(v) for k, v in summarize_eval(self.objective, totals).items()}

  def saved_config(self) -> dict:
    """config.json: the run config with the resolved model and the tokenizer's copy."""
    saved = self.config.to_dict()
    saved["model"] = self.model_config.to_dict()
    saved["data"].update(vocab=workdir_lib.path(self.data.tokenizer.path).name,
                         **tokenizer_kinds.saved_fields(self.data.tokenizer))
    return saved

  def exported(self, params: Any) -> Any:
    return params

  def save_params(self, params: Any) -> None:
    checkpoint.save_params(self.run_dir, params, self.saved_config(), self.data.tokenizer.files)

  def write_outputs(self, params: Any, scored: driver.Scored) -> None:
    """predictions/dev.jsonl: each dev pair with its generated string."""
    del params
    if jax.process_index() != 0:
      return
    lines = [json.dumps({"source": s, "target": t, "prediction": p}, ensure_ascii=False) + "\n"
             for (s, t), p in zip(self.data.dev_pairs, scored.outputs)]
    workdir_lib.write_text(self.run_dir / workdir_lib.PREDICTIONS / PREDICTIONS_FILE, "".join(lines))


def _padded(rows: np.ndarray, size: int) -> np.ndarray:
  """rows with zero rows appended up to `size` (a padding row has no target tokens: it counts for nothing)."""
  return np.concatenate([rows, np.zeros((size - len(rows), *rows.shape[1:]), rows.dtype)]) if len(rows) < size else rows


def generate(model, params: Any, features: dict[str, np.ndarray], tokenizer, batch_size: int, max_length: int,
             num_beams: int = 1) -> list[str]:
  """The generated string of each row of features (input_ids, attention_mask): greedy, or beam search with
  num_beams > 1, in batches of batch_size (one compiled shape)."""
  out = []
  ids, mask = features["input_ids"], features["attention_mask"]
  for start in range(0, len(ids), batch_size):
    chunk = slice(start, start + batch_size)
    args = (jnp.asarray(_padded(ids[chunk], batch_size)), jnp.asarray(_padded(mask[chunk], batch_size)))
    if num_beams > 1:
      tokens = t5_decode.beam_search(model, params, *args, max_length, num_beams)
    else:
      tokens = t5_decode.greedy(model, params, *args, max_length)
    rows = t5_decode.strip(np.asarray(tokens)[:len(ids[chunk])], model.config.eos_token_id)
    out += [tokenizer.decode(row) for row in rows]
  return out


def train(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Fine-tunes a T5 on text pairs in `workdir` through the driver (training/driver.py:run_job); the pairs are
  read and encoded first (a target too long for the decoder stops it before the workdir is written)."""
  data = []

  def checked(config: ml_collections.ConfigDict) -> None:
    validate(config)
    if config.init_from and not workdir_lib.path(config.init_from).exists():
      return  # check_init_from says so, in one line
    family = pretrained.family_name(config.init_from) if config.init_from else "t5"
    if family not in ("t5", None):
      raise UserError(f"init_from: {config.init_from} holds a model of family {family!r}; a seq2seq run fine-tunes "
                      "a T5 (family 't5': a T5 pretraining workdir, a Hugging Face T5 folder, a seq2seq workdir)")
    data.append(read_data(config))
  return driver.run_job(config, workdir, validate=checked,
                        learner=lambda config, run_dir: Seq2Seq(config, run_dir, data[0]))


def summary(config: ml_collections.ConfigDict, workdir: str, result: dict) -> str:
  """The line a seq2seq run ends with."""
  del config
  if result["stopped_by"]:
    return driver.stopped_line(workdir, result)
  dev = result["dev"]
  before = driver.finished_before(workdir, result)
  best = (f" (best at step {result['best_step']})" if result.get("best_step", -1) >= 0 else "")
  return (f"{before}done: dev exact match {dev['exact_match']:.4f}{best} | dev target loss {dev['target_loss']:.4g} | "
          f"a T5 in {workdir}, predictions in {workdir}/{workdir_lib.PREDICTIONS} | next: bert-jax predict --model "
          f"{os.fspath(workdir)} --input FILE")


# --- predict ---------------------------------------------------------------------------------------------------


def is_workdir(path: str) -> bool:
  """Whether `path` holds a seq2seq run's model (its config.json names the job)."""
  try:
    return workdir_lib.read_config(path).get("job") == JOB
  except (UserError, OSError, ValueError):
    return False


@dataclasses.dataclass
class Generator:
  """A fine-tuned T5's generation: `Generator.load(workdir)(sources) -> strings`."""
  model: Any
  params: Any
  tokenizer: Any
  config: dict
  batch_size: int
  num_beams: int

  @classmethod
  def load(cls, path: str, batch_size: int = 0, num_beams: int = 0) -> "Generator":
    """From a seq2seq workdir; batch_size 0: the run's eval_batch_size; num_beams 0: the run's decode.num_beams."""
    params, config = params_checkpoint.load_params(path)
    model = families.build(families.model_config(config["model"]))
    batch_size = batch_size or config["train"]["eval_batch_size"]
    beams = num_beams or config.get("decode", {}).get("num_beams", 1)
    if batch_size < 1 or beams < 1:
      raise UserError(f"batch size {batch_size} and beams {beams} must be >= 1")
    return cls(model, params, pretrained.load_tokenizer(path), config, batch_size, beams)

  def __call__(self, sources: Sequence[str]) -> list[str]:
    data = self.config["data"]
    pairs = [(s, "") for s in sources]
    features = text_to_text.encode_pairs(pairs, self.tokenizer, data["max_seq_length"], data["max_target_length"])
    return generate(self.model, self.params, features, self.tokenizer, self.batch_size, data["max_target_length"],
                    self.num_beams)

  def records(self, sources: Sequence[str]):
    for source, text in zip(sources, self(sources)):
      yield {"source": source, "prediction": text}

