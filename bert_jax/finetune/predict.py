"""Predictions from a fine-tuning workdir: text in, labels, values, tags or answers out.

`Predictor.load(workdir)` rebuilds `heads.FinetuneModel` from the workdir's config.json (the encoder,
the head's kind and its label names by id) and its kept parameters. Calling it featurizes with the
task module's own featurize function, so rows are exactly those of the dev evaluation; runs one
jitted function on batches of one shape [batch_size, max_seq_length] (compiled once; short chunks are
padded with copies of a row); and decodes with the task module's own decoder. Examples and records:

  classification (GLUE, embedded)  "sentence", or a pair ("a", "b") / "a<TAB>b"
                                   -> {"label", "score", "scores": {label: probability}}
  regression (STS-B)               the same inputs -> {"value"}
  ranking (QNLI, task.head=ranking) pairs ("question", "candidate"), all at once
                                   -> {"label", "score": Rel(Q, A), "group"}: within each question's
                                      group the top-scored row gets the positive label (finetune/ranking.py)
  token (NER)                      words: ["EU", "rejects", ...] or "EU rejects ..." -> {"words", "tags"}
  span (SQuAD)                     {"id", "question", "context"}
                                   -> {"id", "answer", "score", "null_score_diff"} (v2.0: "" when
                                      null_score_diff > task.null_score_diff_threshold)
  xlnet_beam (SQuAD, XLNet)        the same -> the same, decoded from the beam (finetune/squad.py: score
                                      log p(start) + log p(end), null_score_diff the answer class's logit)

The predictor holds its parameters so that one `load` serves many calls; the model itself stays a
pure function (`FinetuneModel.apply`), jitted over a data-parallel mesh of the local devices (the
fine-tuning default, so predictions match the run's dev evaluation on the same machine).
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import sys
from typing import Any, Callable, Iterable, Iterator, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import tqdm
from etils import epath

from bert_jax import params_checkpoint, pretrained, workdir
from bert_jax.configs import common
from bert_jax.errors import UserError
from bert_jax.finetune import batching, embedded, glue, heads, ner, ranking, squad
from bert_jax.finetune import features as feats
from bert_jax.models import families, head_kinds, unpad
from bert_jax.ops import int8
from bert_jax.training import partitioning

Decode = Callable[[dict[str, np.ndarray]], list[dict]]


def head_info(config: dict, source: str) -> tuple[str, int, tuple[str, ...]]:
  """(head kind, num_labels, label names by id) that a fine-tuning run recorded in config.json."""
  task = config.get("task") or {}
  if "head" not in task:
    raise UserError(f"{source}: config.json records no fine-tuning head (task.head); predict and export "
                    "take a workdir written by `bert-jax finetune`")
  return task["head"], int(task["num_labels"]), tuple(task.get("labels") or ())


def _data_parallel_mesh():
  return partitioning.make_mesh(ml_collections.ConfigDict({"data": -1, "fsdp": 1, "tensor": 1}),
                                jax.local_devices())


@dataclasses.dataclass(frozen=True)
class Predictor:
  """An inference handle on a fine-tuned model: `predictor(examples) -> records`.

  `Predictor.load(workdir)` reads a `bert-jax finetune` workdir; calling it featurizes the examples as the
  run's dev evaluation did, runs one jitted function over batches of one shape, and decodes one record per
  example, by the head's kind:

  - classification (GLUE, embedded): a sentence, a pair `("a", "b")` or `"a<TAB>b"` ->
    `{"label", "score", "scores": {label: probability}}`
  - regression (STS-B): the same inputs -> `{"value"}`
  - ranking (QNLI with `task.head=ranking`): `("question", "candidate")` pairs -> `{"label", "score", "group"}`
  - token (NER): words, a list or one string -> `{"words", "tags"}`
  - span (SQuAD): `{"id", "question", "context"}` -> `{"id", "answer", "score", "null_score_diff"}`
  """
  config: dict
  tokenizer: Any
  params: Any
  apply: Callable  # jitted (params, batch of MODEL_INPUTS) -> model outputs
  mesh: Any
  batch_size: int

  @classmethod
  def load(cls, path: str, batch_size: int = 0, task: str | None = None) -> "Predictor":
    """From a fine-tuning workdir (a multi-task one: its head for `task`); batch_size 0: the run's
    eval_batch_size (rounded up to the devices)."""
    params, config = params_checkpoint.one_task(*params_checkpoint.load_params(path), task, path)
    return cls.build(config, params, pretrained.load_tokenizer(path), batch_size, path)

  @classmethod
  def build(cls, config: dict, params: Any, tokenizer, batch_size: int = 0, source: str = "model"
            ) -> "Predictor":
    """From a fine-tuning run's config (as its config.json holds it), its parameters and tokenizer."""
    kind, num_labels, _ = head_info(config, source)
    batch_size = batch_size or config["train"]["eval_batch_size"]
    if batch_size <= 0:
      raise UserError(f"batch size {batch_size} must be positive")
    model = heads.FinetuneModel(families.model_config(config["model"]), kind, num_labels,
                                config["head"]["pooling"], config["head"]["dropout"],
                                config["head"].get("cls_norm", "none"))
    if (config.get("quantization") or {}).get("activations") == "int8":
      model = int8.int8_model(model)
    dummy = jnp.zeros((1, config["data"]["max_seq_length"]), jnp.int32)
    abstract = jax.eval_shape(lambda: model.init(jax.random.key(0), dummy, dummy + 1, dummy)["params"])
    params_checkpoint.check_shapes(params, nn.meta.unbox(abstract), source)
    mesh, rules = _data_parallel_mesh(), common.LOGICAL_AXIS_RULES
    shardings = partitioning.logical_shardings(abstract, mesh, rules)
    def forward(p, batch):
      args, packed = unpad.model_inputs(batch)  # a packed batch (models/unpad.py) or the padded one
      return model.apply({"params": p}, *args, **packed)
    data = partitioning.batch_sharding(mesh)
    devices = partitioning.data_parallel_size(mesh)
    return cls(config=config, tokenizer=tokenizer, params=jax.device_put(params, shardings),
               apply=jax.jit(partitioning.in_mesh(forward, mesh, rules), in_shardings=(shardings, data),
                             out_shardings=data),
               mesh=mesh, batch_size=-(-batch_size // devices) * devices)

  @property
  def kind(self) -> str:
    """The head's kind: classification, regression, ranking, token, span or xlnet_beam."""
    return self.config["task"]["head"]

  @property
  def labels(self) -> tuple[str, ...]:
    """The label names by id, as the run recorded them in config.json (empty where it recorded none)."""
    return tuple(self.config["task"].get("labels") or ())

  def __call__(self, examples: Sequence, *, progress: bool = False) -> list[dict]:
    """One record per example, in order (see the class doc for each kind's examples and records)."""
    return list(self.records(examples, progress=progress))

  def records(self, examples: Sequence, *, progress: bool = False) -> Iterator[dict]:
    """One record per example, in order, computed a batch of examples at a time (a tqdm bar on stderr
    when `progress` and the job takes more than a couple of seconds)."""
    examples = self.normalize(examples)
    with tqdm.tqdm(total=len(examples), disable=not progress, delay=2.0, file=sys.stderr,
                   unit="example", desc="predict") as bar:
      # With buckets, a bucket's last batch is padded: featurize enough examples at once to fill most.
      # A ranking model's rows are labelled per question: one chunk, so that no question is cut in two.
      chunk = max(len(examples), 1) if _EXAMPLES[self.kind].whole else self.batch_size * (32 if self.lengths else 1)
      for start in range(0, len(examples), chunk):
        part = examples[start:start + chunk]
        features, decode = self.featurize(part)
        yield from decode(self.run(features))
        bar.update(len(part))

  def normalize(self, examples: Iterable) -> list:
    """Examples in the one form featurize takes ((a, b | None), [words] or squad.Example); a malformed
    one is a UserError naming it by its position."""
    return _EXAMPLES[self.kind].normalize(self, list(examples))

  def featurize(self, examples: Sequence) -> tuple[dict[str, np.ndarray], Decode]:
    """The model rows for normalized `examples` and the function turning the model's outputs into records."""
    return _EXAMPLES[self.kind].featurize(self, examples)

  @property
  def lengths(self) -> tuple[int, ...]:
    """The run's data.length_buckets (finetune/batching.py); () pads every row to max_seq_length."""
    data = self.config["data"]
    return batching.buckets(data.get("length_buckets") or (), data["max_seq_length"])

  def run(self, features: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The model's outputs (numpy, one row per feature row) in batches of batch_size (of one length
    bucket each with data.length_buckets)."""
    quantized = (self.config.get("quantization") or {}).get("activations") == "int8"
    packing = None if quantized else batching.unpad_config(self.config["data"],
                                                           families.model_config(self.config["model"]))
    return batching.run_model(self.apply, self.params, self.mesh, features, self.batch_size, self.lengths, packing)

  def outputs(self, examples: Sequence) -> dict[str, np.ndarray]:
    """The raw model outputs (logits) for `examples`, one row per feature row."""
    features, _ = self.featurize(self.normalize(examples))
    return self.run(features)


def _glue_spec(config: dict) -> glue.GlueSpec:
  task = config["task"]
  if task["family"] == "embedded":
    return embedded.FIRST_WORD if task["name"] == "first_word" else embedded.SPEC
  return glue.SPECS[task["name"]]


def _sentence_pairs(predictor: Predictor, examples: list) -> list[tuple[str, str | None]]:
  paired = _glue_spec(predictor.config).tfds_fields[1] is not None
  return [_sentences(ex, i, paired) for i, ex in enumerate(examples)]


def _sentences(example, index: int, paired: bool) -> tuple[str, str | None]:
  """(a, b) from "a", "a<TAB>b" or ("a", "b")."""
  parts = example.split("\t") if isinstance(example, str) else list(example)
  if len(parts) != (2 if paired else 1) or not all(isinstance(p, str) for p in parts):
    want = "a pair of sentences ('first<TAB>second' or a 2-tuple)" if paired else \
        "one sentence (no tab)"
    raise UserError(f"example {index + 1}: the model's task takes {want}, got {example!r:.80}")
  return parts[0], parts[1] if paired else None


def _sentence_features(predictor: Predictor, examples) -> tuple[dict[str, np.ndarray], Decode]:
  spec = _glue_spec(predictor.config)
  rows = [(a, b, None) for a, b in examples]
  features = glue.featurize(rows, spec, predictor.tokenizer, feats.input_length(predictor.config))
  records = head_kinds.get(predictor.kind).records
  return features, lambda outputs: records(outputs, predictor.labels)


def _ranked_features(predictor: Predictor, examples) -> tuple[dict[str, np.ndarray], Decode]:
  spec, labels = _glue_spec(predictor.config), predictor.labels
  features = glue.featurize([(a, b, None) for a, b in examples], spec, predictor.tokenizer,
                            feats.input_length(predictor.config))
  groups = ranking.group_ids(features)
  positive = labels.index((predictor.config["task"].get("ranking") or {}).get("positive") or labels[0])

  def decode(outputs):
    predicted = ranking.to_labels(outputs["logits"], groups, positive, 1 - positive)
    return [{"label": labels[p], "score": float(s), "group": int(g)}
            for p, s, g in zip(predicted, outputs["logits"], groups)]

  return features, decode


def _words(example, index: int) -> list[str]:
  words = example.split() if isinstance(example, str) else list(example)
  if not all(isinstance(w, str) for w in words):
    raise UserError(f"example {index + 1}: NER takes a sentence as words (a list, or one string), "
                    f"got {example!r:.80}")
  return words


def _word_lists(predictor: Predictor, examples: list) -> list[list[str]]:
  del predictor
  return [_words(ex, i) for i, ex in enumerate(examples)]


def _word_features(predictor: Predictor, examples) -> tuple[dict[str, np.ndarray], Decode]:
  labels = predictor.labels
  sentences = [(words, [labels[0]] * len(words)) for words in examples]  # tags: placeholders
  features, first_positions = ner.featurize(sentences, labels, predictor.tokenizer,
                                            feats.input_length(predictor.config))

  def decode(outputs):
    tags = ner.predicted_tags(outputs, sentences, first_positions, labels)
    return [{"words": words, "tags": t} for (words, _), t in zip(sentences, tags)]

  return features, decode


def _question(example, index: int) -> squad.Example:
  if isinstance(example, squad.Example):
    return example
  if not isinstance(example, dict) or not all(isinstance(example.get(k), str) for k in ("id", "question",
                                                                                       "context")):
    raise UserError(f"example {index + 1}: question answering takes {{'id', 'question', 'context'}} "
                    f"strings, got {example!r:.80}")
  return squad.Example(example["id"], example["question"], example["context"], [])


def _questions(predictor: Predictor, examples: list) -> list[squad.Example]:
  del predictor
  questions = [_question(ex, i) for i, ex in enumerate(examples)]
  repeated = sorted(i for i, n in collections.Counter(q.qid for q in questions).items() if n > 1)
  if repeated:
    raise UserError(f"question ids must be unique (answers are keyed by them); repeated: {repeated[:5]}")
  return questions


def _finite(value: float) -> float | None:
  return float(value) if np.isfinite(value) else None


def _question_features(predictor: Predictor, examples) -> tuple[dict[str, np.ndarray], Decode]:
  task = ml_collections.ConfigDict(predictor.config["task"])
  questions = list(examples)
  featurized = squad.featurize(questions, predictor.tokenizer, task, predictor.config["data"]["max_seq_length"],
                               training=False)

  def decode(outputs):
    decoded = squad.decode(predictor.kind, outputs, questions, featurized, task)
    return [{"id": q.qid, "answer": decoded.answers[q.qid], "score": _finite(decoded.scores[q.qid]),
             "null_score_diff": _finite(decoded.null_diff[q.qid])} for q in questions]

  return featurized.features, decode


@dataclasses.dataclass(frozen=True)
class _Examples:
  """What predict takes for a head kind: normalize(predictor, examples) -> the one form featurize
  takes; featurize(predictor, normalized) -> (rows, decode); read(text, path, config) -> the examples
  in a user's --input file; whole: featurize every example at once (the records depend on each other)."""
  normalize: Callable[[Predictor, list], list]
  featurize: Callable[[Predictor, Sequence], tuple[dict[str, np.ndarray], Decode]]
  read: Callable[[str, Any, dict], list]
  whole: bool = False


def read_examples(path: str, kind: str, config: dict) -> list:
  """The examples in a user's input file: SQuAD JSON for span models; otherwise one example per line
  (a GLUE TSV with its header row is read as fine-tuning reads it, by the task's columns)."""
  path = epath.Path(path)
  return _EXAMPLES[kind].read(_read_text(path), path, config)


def read_lines(path: str) -> list[str]:
  """A user's input file's lines (a seq2seq model's sources: finetune/seq2seq.py)."""
  return _lines(_read_text(epath.Path(path)), path, {})


def _read_text(path: epath.Path) -> str:
  if not path.is_file():
    raise UserError(f"--input {path}: no such file")
  try:
    return path.read_text(encoding="utf-8")
  except UnicodeDecodeError as e:
    raise UserError(f"--input {path}: not UTF-8 text ({e})") from None


def _lines(text: str, path, config: dict) -> list[str]:
  del path, config
  lines = [line.removesuffix("\r") for line in text.split("\n")]
  return lines[:-1] if lines and not lines[-1] else lines


def _sentence_lines(text: str, path, config: dict) -> list:
  """Lines, or a GLUE TSV with its header row read as fine-tuning reads it, by the task's columns."""
  lines = _lines(text, path, config)
  spec = _glue_spec(config)
  if lines and spec.tsv_columns[0] in lines[0].split("\t"):
    return [(a, b) if b is not None else a for a, b, _ in glue.read_tsv(str(path), spec)]
  return lines


def _squad_questions(text: str, path, config: dict) -> list[dict]:
  del config
  try:
    articles = json.loads(text)["data"]
    return [{"id": qa["id"], "question": qa["question"], "context": paragraph["context"]}
            for article in articles for paragraph in article["paragraphs"] for qa in paragraph["qas"]]
  except (ValueError, KeyError, TypeError) as e:
    raise UserError(f"--input {path}: not SQuAD JSON ({type(e).__name__}: {e}); expected "
                    '{"data": [{"paragraphs": [{"context", "qas": [{"id", "question"}]}]}]}') from None


_SENTENCES = _Examples(_sentence_pairs, _sentence_features, _sentence_lines)
_EXAMPLES = {"classification": _SENTENCES, "regression": _SENTENCES,
             "ranking": _Examples(_sentence_pairs, _ranked_features, _sentence_lines, whole=True),
             "token": _Examples(_word_lists, _word_features, _lines),
             "span": _Examples(_questions, _question_features, _squad_questions)}
_EXAMPLES["xlnet_beam"] = _EXAMPLES["span"]


def write_records(records: Iterable[dict], output: str | None) -> int:
  """JSON lines to `output` (stdout when None), written as they come; returns how many."""
  count = 0
  with workdir.atomic_open(output) if output else contextlib.nullcontext(sys.stdout) as stream:
    for record in records:
      stream.write(json.dumps(record, ensure_ascii=False) + "\n")
      count += 1
    stream.flush()
  return count
