"""SQuAD v1.1 and v2.0 (Rajpurkar et al. 2016, 2018) from tfds `squad` or the official JSON files.

Pre-processing (as the original run_squad.py): the question is cut to max_query_length tokens; the
context is covered by windows of the remaining length that start doc_stride tokens apart. Training
rows whose window does not contain the whole answer (and v2.0's unanswerable questions) point at
[CLS] (position 0; in XLNet's rows, context <sep> question <sep> <cls> padded on the left, the last).
Each context token keeps its character span in the context, so an answer span maps to tokens, and a
predicted token span back to the exact context text.

Post-processing: in every window, the n_best_size best starts and ends form candidate spans (inside
the context, end >= start, at most max_answer_length tokens, start in the window where it has the most
context); the best-scoring span over all windows is the answer. v2.0 answers "" when the [CLS] score
(lowest over the windows) beats the best span by more than null_score_diff_threshold.

task.head picks the span head and its decoder (`HEADS`): "" or span (the start and end logits above), or
xlnet_beam (XLNet's SQuAD v2 head, models/xlnet_qa.py; XLNet's layout only). xlnet_beam trains on
is_impossible as well (1 where the row points at <cls>: the unanswerable questions and the windows without
the answer, as XLNet's run_squad.py and transformers' SQuAD features), and decodes as XLNet's run_squad.py:
the start_n_top x end_n_top candidates of each window (the same filters as above), scored log p(start) +
log p(end); the null score is the answer class's logit (lowest over the windows), which v2.0 compares with
null_score_diff_threshold directly (its logit > 0: "no answer" more likely than not, at the threshold 0).
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Callable

import ml_collections
import numpy as np
from etils import epath

from bert_jax import workdir
from bert_jax.data_pipelines.tftools import open_text
from bert_jax.errors import UserError
from bert_jax.finetune import features as feats
from bert_jax.finetune import metrics
from bert_jax.finetune.tasks import EvalSet, Task


@dataclasses.dataclass
class Example:
  qid: str
  question: str
  context: str
  answers: list[tuple[str, int]]  # (text, character offset in context)
  impossible: bool = False


@dataclasses.dataclass
class Window:
  """Where a row's context tokens come from: context token i sits at row position offset + i - start."""
  example: int
  start: int
  length: int
  offset: int
  max_context: np.ndarray  # bool[length]: this window gives token start + i its most context
  null: int = 0  # the [CLS] position, whose start and end scores say "no answer"


def _field(node, key: str, kinds: tuple[type, ...], where: str, path: str):
  value = node.get(key) if isinstance(node, dict) else None
  if not isinstance(value, kinds) or isinstance(value, bool) and bool not in kinds:
    raise UserError(f"{path}: {where} has no {key!r} of type {' or '.join(k.__name__ for k in kinds)} "
                    "(the official layout: data[].paragraphs[].context and .qas[] with id, question, answers)")
  return value


def _example(qa, context: str, where: str, path: str) -> Example:
  optional = lambda key, kind, default: (  # noqa: E731
      _field(qa, key, (kind,), where, path) if isinstance(qa, dict) and key in qa else default)
  answers = []
  for k, answer in enumerate(optional("answers", list, [])):
    answers.append((_field(answer, "text", (str,), f"{where}.answers[{k}]", path),
                    _field(answer, "answer_start", (int,), f"{where}.answers[{k}]", path)))
  impossible = optional("is_impossible", bool, False)
  return Example(str(_field(qa, "id", (str, int), where, path)), _field(qa, "question", (str,), where, path),
                 context, answers, impossible)


def read_json(path: str) -> list[Example]:
  """The questions of an official SQuAD JSON file; a broken file or a missing field is a UserError naming it."""
  try:
    with open_text(path) as f:
      data = json.load(f)
  except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
    raise UserError(f"{path}: not valid JSON ({e})") from None
  examples, seen = [], set()
  for a, article in enumerate(_field(data, "data", (list,), "the top level", path)):
    for p, paragraph in enumerate(_field(article, "paragraphs", (list,), f"data[{a}]", path)):
      where = f"data[{a}].paragraphs[{p}]"
      context = _field(paragraph, "context", (str,), where, path)
      for q, qa in enumerate(_field(paragraph, "qas", (list,), where, path)):
        example = _example(qa, context, f"{where}.qas[{q}]", path)
        if example.qid in seen:
          raise UserError(f"{path}: question id {example.qid!r} appears twice; predictions are keyed by id")
        seen.add(example.qid)
        examples.append(example)
  return examples


def check_answers(examples: list[Example], source: str, strict: bool) -> list[Example]:
  """Training questions whose answer lies inside its context. Others are dropped and counted; an answer
  whose text is not at its offset is kept (trained on as given) and named; data.strict makes both errors."""
  kept, outside, misplaced = [], [], []
  for example in examples:
    if not example.impossible:
      text, start = example.answers[0] if example.answers else ("", 0)
      if start < 0 or start + len(text) > len(example.context) or not text.strip():
        outside.append(example.qid)
        continue
      if example.context[start:start + len(text)] != text:
        misplaced.append(example.qid)
    kept.append(example)
  feats.report(source, len(outside), "training questions dropped: answer missing, empty or outside the context",
               outside, strict)
  feats.report(source, len(misplaced), "training answers whose text is not at answer_start (kept as given)",
               misplaced, strict)
  return kept


def read_tfds(version: str, split: str, data_dir: str) -> list[Example]:
  examples = []
  files = f"a folder with SQuAD's {_files(version)['train']} and {_files(version)['dev']}"
  for ex in feats.tfds_examples(f"squad/{version}", split, data_dir, files):
    answers = list(zip((feats.text(t) for t in ex["answers"]["text"]),
                       (int(s) for s in ex["answers"]["answer_start"])))
    examples.append(Example(feats.text(ex["id"]), feats.text(ex["question"]), feats.text(ex["context"]),
                            answers, bool(ex.get("is_impossible", False))))
  return examples


def tokenize_context(context: str, tokenizer) -> tuple[list[int], np.ndarray]:
  """Token ids of the context and each token's [start, end) character span in it.

  Sub-tokens of one word share the word's span, which the basic tokenizer reports with the word
  (`basic_tokenize_spans`): never empty, and covering characters it deletes inside the word (a
  zero-width space, a soft hyphen), so no answer on such a word is lost.
  """
  from bert_jax.data_pipelines.tokenizers import basic_tokenize_spans  # pylint: disable=import-outside-toplevel
  ids, spans = [], []
  for word, start, end in basic_tokenize_spans(context, tokenizer.lower_case):
    pieces = tokenizer.encode(word)
    ids.extend(pieces)
    spans.extend([(start, end)] * len(pieces))
  return ids, np.asarray(spans, np.int64).reshape(-1, 2)


def answer_tokens(spans: np.ndarray, text: str, char_start: int) -> tuple[int, int] | None:
  """First and last context token overlapping [char_start, char_start + len(text)); None if none do."""
  char_end = char_start + len(text)
  inside = np.flatnonzero((spans[:, 1] > char_start) & (spans[:, 0] < char_end))
  return (int(inside[0]), int(inside[-1])) if len(inside) else None


def windows(num_tokens: int, max_tokens: int, stride: int) -> list[tuple[int, int]]:
  """(start, length) of the windows covering num_tokens tokens."""
  if max_tokens < 1 or stride < 1:  # the loop below would never advance
    raise UserError(f"windows of {max_tokens} context tokens every {stride}: data.max_seq_length must exceed "
                    "task.max_query_length + 3 and task.doc_stride must be >= 1")
  out, start = [], 0
  while True:
    length = min(num_tokens - start, max_tokens)
    out.append((start, length))
    if start + length >= num_tokens:
      return out
    start += min(length, stride)


def max_context(spans: list[tuple[int, int]]) -> list[np.ndarray]:
  """Per window, per token: is this the window where min(left, right context) + 0.01 * length peaks?"""
  best: dict[int, tuple[float, int]] = {}
  for w, (start, length) in enumerate(spans):
    for i in range(length):
      value = min(i, length - 1 - i) + 0.01 * length
      if start + i not in best or value > best[start + i][0]:
        best[start + i] = (value, w)
  return [np.array([best[start + i][1] == w for i in range(length)]) for w, (start, length) in enumerate(spans)]


@dataclasses.dataclass
class Featurized:
  features: dict[str, np.ndarray]
  windows: list[Window]
  spans: list[np.ndarray]  # per example: its context tokens' character spans


def featurize(examples: list[Example], tokenizer, task_cfg, max_len: int, training: bool) -> Featurized:
  """Windows as the tokenizer's layout places them: BERT's [CLS] question [SEP] context [SEP], XLNet's
  context <sep> question <sep> <cls> padded on the left; "no answer" points at the [CLS] position."""
  layout = feats.layout_of(tokenizer)
  cls, sep = tokenizer.special_ids["[CLS]"], tokenizer.special_ids["[SEP]"]
  rows, starts, ends, all_windows, all_spans = [], [], [], [], []
  for e, example in enumerate(examples):
    query = tokenizer.encode(example.question)[:task_cfg.max_query_length]
    ids, spans = tokenize_context(example.context, tokenizer)
    all_spans.append(spans)
    target = None
    if training and not example.impossible:
      target = next((t for t in (answer_tokens(spans, *a) for a in example.answers[:1]) if t), None)
      if target is None:  # an answer that is not in its context: nothing to learn from
        continue
    placed = windows(len(ids), max_len - len(query) - layout.pair_specials, task_cfg.doc_stride)
    for (start, length), best in zip(placed, max_context(placed)):
      context = ids[start:start + length]
      row_ids, types = (layout.wrap(cls, sep, query, context) if layout.cls_first
                        else layout.wrap(cls, sep, context, query))
      rows.append(feats.pad_row(tokenizer, row_ids, types, max_len))
      first = feats.pad_start(tokenizer, len(row_ids), max_len)
      offset = first + (len(query) + layout.pair_specials - 1 if layout.cls_first else 0)
      null = first if layout.cls_first else first + len(row_ids) - 1
      inside = target is not None and start <= target[0] and target[1] < start + length
      starts.append(target[0] - start + offset if inside else null)
      ends.append(target[1] - start + offset if inside else null)
      all_windows.append(Window(e, start, length, offset, best, null))
  features = feats.stack(rows, start_positions=np.asarray(starts, np.int32),
                         end_positions=np.asarray(ends, np.int32))
  return Featurized(features, all_windows, all_spans)


def best_answers(start_logits: np.ndarray, end_logits: np.ndarray, examples: list[Example],
                 featurized: Featurized, task_cfg) -> tuple[dict[str, str], dict[str, float]]:
  """Answer text and null-score difference (null minus best span; -inf without candidates) per question."""
  best: dict[int, tuple[float, int, int]] = {}  # example -> (score, first char, end char)
  null: dict[int, float] = {}
  for row, window in enumerate(featurized.windows):
    e, s, t = window.example, start_logits[row], end_logits[row]
    null[e] = min(null.get(e, np.inf), float(s[window.null] + t[window.null]))
    lo, hi = window.offset, window.offset + window.length
    top_starts = np.argsort(-s)[:task_cfg.n_best_size]
    top_ends = np.argsort(-t)[:task_cfg.n_best_size]
    for i in top_starts:
      if not (lo <= i < hi and window.max_context[i - lo]):
        continue
      for j in top_ends:
        if j < i or j >= hi or j - i + 1 > task_cfg.max_answer_length:
          continue
        score = float(s[i] + t[j])
        if e not in best or score > best[e][0]:
          spans = featurized.spans[e]
          best[e] = (score, spans[window.start + i - lo][0], spans[window.start + j - lo][1])
  answers, null_diff = {}, {}
  for e, example in enumerate(examples):
    if e not in null:
      continue
    score, first, last = best.get(e, (-np.inf, 0, 0))
    null_diff[example.qid] = null[e] - score
    text = example.context[first:last]
    answers[example.qid] = "" if task_cfg.version == "v2.0" and (
        null_diff[example.qid] > task_cfg.null_score_diff_threshold) else text
  return answers, null_diff


@dataclasses.dataclass
class Decoded:
  """Per question id: the answer ("" for v2.0's no answer), the null score difference (compared with
  null_score_diff_threshold; the span head's is +inf without candidates) and the best span's score (-inf
  without candidates)."""
  answers: dict[str, str]
  null_diff: dict[str, float]
  scores: dict[str, float]


def _logit_answers(outputs: dict[str, np.ndarray], examples: list[Example], featurized: Featurized,
                   task_cfg) -> Decoded:
  start, end = outputs["start_logits"], outputs["end_logits"]
  answers, null_diff = best_answers(start, end, examples, featurized, task_cfg)
  null = {}  # the [CLS] score as best_answers takes it: lowest over the question's windows
  for row, w in enumerate(featurized.windows):
    null[w.example] = min(null.get(w.example, np.inf), float(start[row, w.null] + end[row, w.null]))
  return Decoded(answers, null_diff, {q.qid: null[e] - null_diff[q.qid] for e, q in enumerate(examples)
                                      if q.qid in null_diff})


def _candidate(window: Window, i: int, j: int, task_cfg) -> bool:
  """Row positions i..j: inside the window's context, i where the window gives it most context, short enough."""
  lo, hi = window.offset, window.offset + window.length
  return lo <= i < hi and window.max_context[i - lo] and i <= j < hi and j - i + 1 <= task_cfg.max_answer_length


def beam_answers(outputs: dict[str, np.ndarray], examples: list[Example], featurized: Featurized,
                 task_cfg) -> Decoded:
  """xlnet_beam's outputs (models/xlnet_qa.py) -> answers, as XLNet's run_squad.py (the module doc)."""
  start_p, start_i = outputs["start_top_log_probs"], outputs["start_top_index"]
  end_p, end_i = outputs["end_top_log_probs"], outputs["end_top_index"]
  k1 = start_p.shape[1]
  best: dict[int, tuple[float, int, int]] = {}
  null: dict[int, float] = {}
  with np.errstate(divide="ignore"):
    for row, window in enumerate(featurized.windows):
      e = window.example
      null[e] = min(null.get(e, np.inf), float(outputs["cls_logits"][row]))
      for i in range(k1):
        for j in range(end_p.shape[1] // k1):
          flat = j * k1 + i  # the j-th best end of the i-th start (transformers' layout)
          first, last = int(start_i[row, i]), int(end_i[row, flat])
          if not _candidate(window, first, last, task_cfg):
            continue
          score = float(np.log(start_p[row, i]) + np.log(end_p[row, flat]))
          if e not in best or score > best[e][0]:
            spans = featurized.spans[e]
            best[e] = (score, spans[window.start + first - window.offset][0],
                       spans[window.start + last - window.offset][1])
  decoded = Decoded({}, {}, {})
  for e, example in enumerate(examples):
    if e not in null:
      continue
    score, first, last = best.get(e, (-np.inf, 0, 0))
    decoded.null_diff[example.qid], decoded.scores[example.qid] = null[e], score
    no_answer = task_cfg.version == "v2.0" and null[e] > task_cfg.null_score_diff_threshold
    decoded.answers[example.qid] = "" if no_answer else example.context[first:last]
  return decoded


@dataclasses.dataclass(frozen=True)
class SpanHead:
  """A head kind SQuAD trains: decode(outputs, examples, featurized, task_cfg) -> Decoded; cls_last: it
  reads <cls> at the last real token (XLNet's layout only); answer_class: it also trains on is_impossible."""
  decode: Callable[[dict[str, np.ndarray], list[Example], Featurized, Any], Decoded]
  cls_last: bool = False
  answer_class: bool = False


# task.head ("" is span) -> its SpanHead
HEADS = {"span": SpanHead(_logit_answers), "xlnet_beam": SpanHead(beam_answers, cls_last=True, answer_class=True)}


def head_of(task_cfg) -> str:
  head = task_cfg.get("head", "") or "span"
  if head not in HEADS:
    raise UserError(f"task.head={head!r}: SQuAD trains with one of {sorted(HEADS)}")
  return head


def decode(head: str, outputs: dict[str, np.ndarray], examples: list[Example], featurized: Featurized,
           task_cfg) -> Decoded:
  return HEADS[head].decode(outputs, examples, featurized, task_cfg)


def _files(version: str) -> dict[str, str]:
  return {"train": f"train-{version}.json", "dev": f"dev-{version}.json"}


def _read_split(config: ml_collections.ConfigDict, split: str) -> list[Example]:
  version = config.task.version
  if config.data.data_dir:
    source = os.fspath(epath.Path(config.data.data_dir) / _files(version)[split])
    if not epath.Path(source).exists():
      raise UserError(f"{source} not found: data.data_dir must hold the official SQuAD {version} JSON files")
    examples = read_json(source)
  else:
    source = f"tfds squad/{version} {split}"
    examples = read_tfds(version, "validation" if split == "dev" else split, config.data.tfds_data_dir)
  if not examples:
    raise UserError(f"{source}: no questions")
  limit = config.data.train_limit if split == "train" else config.data.eval_limit
  examples = examples[:limit] if limit else examples
  return check_answers(examples, source, config.data.strict) if split == "train" else examples


def write_predictions(directory: str, split: str, answers: dict[str, str], null_diff: dict[str, float],
                      version: str) -> None:
  """predictions.SPLIT.json ({id: answer}) and, for v2.0, null_odds.SPLIT.json as the official script reads."""
  workdir.write_json(epath.Path(directory) / f"predictions.{split}.json", answers, indent=1)
  if version == "v2.0":
    workdir.write_json(epath.Path(directory) / f"null_odds.{split}.json",
                       {k: v if np.isfinite(v) else 1e9 for k, v in null_diff.items()}, indent=1)


def _dev_set(config, tokenizer) -> EvalSet:
  examples = _read_split(config, "dev")
  featurized = featurize(examples, tokenizer, config.task, config.data.max_seq_length, training=False)
  features = feats.pad_to_multiple(labelled(featurized, head_of(config.task)), config.train.eval_batch_size)
  golds = {ex.qid: [] if ex.impossible else [text for text, _ in ex.answers] for ex in examples}
  answers = lambda out: decode(head_of(config.task), out, examples, featurized, config.task)  # noqa: E731

  def write(directory, out):
    decoded = answers(out)
    write_predictions(directory, "dev", decoded.answers, decoded.null_diff, config.task.version)

  return EvalSet(
      name="dev", features=features,
      evaluate=lambda out: metrics.squad_scores(answers(out).answers, golds, config.task.version),
      write_predictions=write)


def validate(config: ml_collections.ConfigDict) -> None:
  task = config.task  # its fields' ranges: the schema's
  if config.data.max_seq_length <= task.max_query_length + 3:
    raise UserError(f"data.max_seq_length={config.data.max_seq_length} leaves no room for the context: it "
                    f"must exceed task.max_query_length={task.max_query_length} + 3 ([CLS], 2 x [SEP])")


def labelled(featurized: Featurized, head: str) -> dict[str, np.ndarray]:
  """The rows' features, with the head's answer-class label where it has one: is_impossible, 1 where the
  row points at <cls> (at evaluation every row does: it is no label there, only the feature the loss reads)."""
  features = featurized.features
  if HEADS[head].answer_class:
    null = np.asarray([w.null for w in featurized.windows], np.int32)
    features["is_impossible"] = (features["start_positions"] == null).astype(np.float32)
  return features


def build(config: ml_collections.ConfigDict, tokenizer, *, need_train: bool) -> Task:
  validate(config)
  if config.predict_split == "test":
    raise UserError("SQuAD's test set is hidden; use predict_split=dev (the official submission format)")
  head = head_of(config.task)
  if HEADS[head].cls_last and feats.layout_of(tokenizer).cls_first:
    raise UserError(f"task.head={head} reads the answer class at <cls>, the last token (XLNet's layout); "
                    f"this model's {tokenizer.kind} tokenizer puts [CLS] first: use task.head=span")
  train = None
  if need_train:
    train = labelled(featurize(_read_split(config, "train"), tokenizer, config.task, config.data.max_seq_length,
                               training=True), head)
  return Task(name=config.task.name, head=head, num_labels=2, train=train, evals=[_dev_set(config, tokenizer)],
              tests=[], selection=("exact_match", "f1"))
