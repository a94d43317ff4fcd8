"""ERNIE 2.0 (continual multi-task pretraining): each task's labels against hand-built documents, each task's
loss against NumPy, the schedule's draws, task embeddings off = the model as before, exact resume across a
stage boundary, a labelled file as an extra task; the tiny preset's learning run is slow."""
import collections
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import params_checkpoint
from bert_jax.config_utils import load_config
from bert_jax.conversion import params as conversion_params
from bert_jax.data_pipelines import ernie, pipeline, shards
from bert_jax.data_pipelines.corpora import Stats
from bert_jax.data_pipelines.examples import BuilderConfig
from bert_jax.errors import UserError
from bert_jax.models import families
from bert_jax.models.config import ModelConfig
from bert_jax.training import loop, trainer
from bert_jax.training.objectives import ernie2, make_objective
from core_helpers import slow

CLS, SEP = 1, 2
WORDS = {w: i for i, w in enumerate("paris big the city old has a river is long".split(), start=10)}


def _encode(text):
  return [WORDS[w.lower()] for w in text.split()]


def _rows(docs, share, length=9, seed=0):
  encode = ernie.cased(_encode)
  cfg = BuilderConfig("ernie", length, CLS, SEP)
  stats = Stats()
  return ernie.build_rows(cfg, [[encode(s) for s in doc] for doc in docs], np.random.default_rng(seed), stats,
                          share), stats


def test_the_nine_reordering_classes():
  assert ernie.REORDER_CLASSES == ((0,), (0, 1), (1, 0), (0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1),
                                   (2, 1, 0))
  assert [ernie.reorder_label(p) for p in [(0,), (1, 0), (2, 0, 1)]] == [0, 2, 7]


def test_capitalisation_follows_the_cased_word_while_the_ids_are_uncased():
  encode = ernie.cased(_encode)
  ids = encode("Paris has a River")
  assert [i & ~(1 << ernie.CAPITAL_BIT) for i in ids] == _encode("paris has a river")
  assert [(i >> ernie.CAPITAL_BIT) & 1 for i in ids] == [1, 0, 0, 1]


def _distance_rows(docs, length=16, seeds=40):
  """{ids: row} of the sentence-distance rows over `seeds` draws."""
  found = {}
  for seed in range(seeds):
    rows, _ = _rows(docs, share=0.0, length=length, seed=seed)
    found.update({tuple(r.ids): r for r in rows if r.extras["distance_labels"] >= 0})
  return found


def test_sentence_distance_rows_and_their_token_labels_by_hand():
  # One run per sentence (a third of the document's 11 tokens): s0 -> s1 adjacent or s2 far, s1 -> s2
  # adjacent (no far run), s2 -> s0 far; no other document.
  s0, s1, s2 = "Paris is big", "the city is old", "Paris has a city"
  found = _distance_rows([[s0, s1, s2]])
  pair = lambda a, b: (CLS, *_encode(a), SEP, *_encode(b), SEP)  # noqa: E731
  assert {k: r.extras["distance_labels"] for k, r in found.items()} == {
      pair(s0, s1): 0, pair(s0, s2): 1, pair(s1, s2): 0, pair(s2, s0): 1}
  adjacent, far = found[pair(s1, s2)], found[pair(s2, s0)]
  assert adjacent.segment_ids == [0] * 6 + [1] * 5 and adjacent.extras["reorder_labels"] == -1
  assert adjacent.extras["capital_labels"] == [-1, 0, 0, 0, 0, -1, 1, 0, 0, 0, -1]
  # outside the row: s0 = paris is big
  assert adjacent.extras["token_doc_labels"] == [-1, 0, 0, 1, 0, -1, 1, 0, 0, 0, -1]
  # outside: s1 = the city is old
  assert far.extras["token_doc_labels"] == [-1, 0, 0, 0, 1, -1, 0, 1, 0, -1]
  assert far.extras["capital_labels"] == [-1, 1, 0, 0, 0, -1, 1, 0, 0, -1]
  assert found[pair(s0, s2)].extras["token_doc_labels"] == [-1, 0, 1, 0, -1, 0, 0, 0, 1, -1]  # outside: s1


def test_a_segment_from_another_document_is_distance_two():
  found = _distance_rows([["Paris is big"], ["the river is long"]])
  key = (CLS, *_encode("paris is big"), SEP, *_encode("the river is long"), SEP)
  assert {r.extras["distance_labels"] for r in found.values()} == {2} and key in found
  assert found[key].extras["token_doc_labels"] == [-1] + [0] * 3 + [-1] + [0] * 4 + [-1]
  assert found[key].extras["capital_labels"] == [-1, 1, 0, 0, -1, 0, 0, 0, 0, -1]


def test_all_three_distances_occur_on_the_embedded_corpus_and_none_dominates():
  config = load_config("configs/ernie.py:tiny", ["--config.data.masking=whole_word", "--config.data.num_shards=1",
                                                 "--config.data.shuffle_buffer=300"])
  data = pipeline.for_config(config, "train", 64)
  try:
    labels = np.concatenate([next(data)["distance_labels"] for _ in range(3)])
  finally:
    data.close()
  counts = np.bincount(labels[labels >= 0], minlength=3) / (labels >= 0).sum()
  assert counts.min() > 0.05 and counts.max() < 0.65, counts  # short documents: few far runs


def test_reordering_rows_put_back_in_order_give_the_text_and_cover_the_nine_classes():
  doc = ["Paris is big", "the city is old", "Paris has a city", "the river is long"]
  seen = collections.Counter()
  for seed in range(60):
    rows, _ = _rows([doc], share=1.0, length=40, seed=seed)
    assert len(rows) == 2  # runs of one sentence (a third of the document's 15 tokens): rows of two runs
    for row, text in zip(rows, (doc[:2], doc[2:])):
      order = ernie.REORDER_CLASSES[row.extras["reorder_labels"]]
      assert row.extras["distance_labels"] == -1 and row.ids[0] == CLS and row.ids[-1] == SEP
      shown = np.split(np.array(row.ids[1:-1]), np.flatnonzero(np.array(row.ids[1:-1]) == SEP))
      shown = [list(p[p != SEP]) for p in shown]
      assert len(shown) == len(order)
      pieces = [None] * len(order)
      for place, piece in zip(order, shown):
        pieces[place] = piece
      assert sum(pieces, []) == _encode(" ".join(text))
      seen[row.extras["reorder_labels"]] += 1
  assert sorted(seen) == list(range(9))


def test_token_document_relation_of_reordering_rows():
  doc = ["Paris big", "the city", "Paris city"]  # runs of one sentence (budget 3); rows: s0 + s1, then s2
  rows, _ = _rows([doc], share=1.0, length=9)
  first, second = rows
  pairs = lambda row: sorted((i, c, t) for i, c, t in zip(row.ids, row.extras["capital_labels"],  # noqa: E731
                                                          row.extras["token_doc_labels"]) if i != CLS and i != SEP)
  p, b, t, c = (WORDS[w] for w in ("paris", "big", "the", "city"))
  assert pairs(first) == sorted([(p, 1, 1), (b, 0, 0), (t, 0, 0), (c, 0, 1)])  # outside: "Paris city"
  assert pairs(second) == sorted([(p, 1, 1), (c, 0, 1)])  # outside: "Paris big the city"


def _tiny_model(**changes):
  return ModelConfig(vocab_size=64, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                     max_position_embeddings=16, sentence_head="none", **changes)


def _batch(rng, rows=4, length=12, predictions=3, tasks=None):
  mask = (np.arange(length)[None] < rng.integers(6, length + 1, (rows, 1))).astype(np.int32)
  token_labels = lambda: np.where(mask > 0, rng.integers(0, 2, (rows, length)), -1).astype(np.int32)  # noqa: E731
  return {"input_ids": (rng.integers(5, 64, (rows, length)) * mask).astype(np.int32), "input_mask": mask,
          "segment_ids": np.zeros((rows, length), np.int32),
          "masked_lm_positions": np.sort(rng.integers(1, 6, (rows, predictions)), -1).astype(np.int32),
          "masked_lm_ids": rng.integers(5, 64, (rows, predictions)).astype(np.int32),
          "masked_lm_weights": (rng.random((rows, predictions)) < 0.8).astype(np.float32),
          "next_sentence_labels": np.zeros((rows,), np.int32),
          "capital_labels": token_labels(), "token_doc_labels": token_labels(),
          "reorder_labels": np.array([3, -1, 8, 0][:rows], np.int32),
          "distance_labels": np.array([-1, 2, -1, 1][:rows], np.int32),
          "task_ids": np.asarray(tasks if tasks is not None else [0] * rows, np.int32)}


def _np_nll(logits, labels):
  logits = np.asarray(logits, np.float64)
  logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
  return logz - np.take_along_axis(logits, labels[..., None], -1)[..., 0]


def test_each_task_loss_against_numpy():
  objective = ernie2.Ernie2Pretraining(_tiny_model(num_tasks=5))
  rng = np.random.default_rng(0)
  batch = _batch(rng, tasks=[1, 1, 3, 4])  # rows of capital, reorder and distance
  params = jax.jit(lambda r: nn.meta.unbox(objective.init(r, batch)))(jax.random.key(0))
  sums, counts = jax.jit(lambda p: objective.sums(p, batch, None, True))(params), objective.counts(batch)
  out = jax.jit(lambda p: objective.model.apply({"params": p}, **ernie2.model_inputs(batch),
                                                task_ids=batch["task_ids"]))(
      {k: v for k, v in params.items() if k != ernie2.HEADS})
  heads = jax.tree.map(np.asarray, params[ernie2.HEADS])
  dense = lambda x, p: np.asarray(x, np.float64) @ p["kernel"] + p["bias"]  # noqa: E731
  h, pooled = np.asarray(out.last_hidden_state), np.asarray(out.pooled_output)
  cases = {"mlm": (np.asarray(out.mlm_logits), batch["masked_lm_ids"], batch["masked_lm_weights"]),
           "capital": (dense(h, heads["capital"]), batch["capital_labels"], None),
           "token_doc": (dense(h, heads["token_doc"]), batch["token_doc_labels"], None),
           "reorder": (dense(pooled, heads["reorder"]), batch["reorder_labels"], None),
           "distance": (dense(pooled, heads["distance"]), batch["distance_labels"], None)}
  expected_loss = 0.0
  for task, (logits, labels, weights) in cases.items():
    weights = (labels >= 0).astype(np.float64) if weights is None else weights
    nll = _np_nll(logits, np.maximum(labels, 0)) * weights
    drawn = (batch["task_ids"] == ernie2.TASKS.index(task)).reshape((-1,) + (1,) * (labels.ndim - 1))
    np.testing.assert_allclose(sums[f"{task}_loss"], nll.sum(), rtol=2e-5)
    np.testing.assert_allclose(sums[f"{task}_drawn_loss"], (nll * drawn).sum(), rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(counts[f"{task}_drawn"], (weights * drawn).sum())
    correct = (np.argmax(logits, -1) == np.maximum(labels, 0)) * weights
    np.testing.assert_allclose(sums[f"{task}_correct"], correct.sum())
    expected_loss += (nll * drawn).sum() / max((weights * drawn).sum(), 1.0)
  assert counts["mlm_drawn"] == 0 and counts["capital_drawn"] == (batch["capital_labels"][:2] >= 0).sum()
  np.testing.assert_allclose(objective.loss(sums, counts), expected_loss, rtol=2e-5)
  metrics = objective.metrics(sums, counts)  # a drawn task on its rows, the others on all their labels
  np.testing.assert_allclose(metrics["reorder_loss"], sums["reorder_drawn_loss"] / 1, rtol=1e-6)  # row 2 only
  np.testing.assert_allclose(metrics["mlm_accuracy"], sums["mlm_correct"] / counts["mlm"], rtol=1e-6)
  assert float(sums["reorder_loss"]) > float(sums["reorder_drawn_loss"])  # 3 reordering rows


def test_the_schedule_draws_from_its_stage_with_its_weights_and_only_from_seed_and_step():
  names = ernie2.TASKS
  stages = ("0:mlm=1", "10:mlm=3,capital=1", "20:mlm=1,capital=1,reorder=2")
  schedule = ernie2.Schedule(stages, names, seed=5)
  assert [schedule.stage_at(s).start for s in (1, 10, 11, 20, 21)] == [0, 0, 10, 10, 20]
  assert {schedule.task_at(s) for s in range(1, 11)} == {0}
  assert {schedule.task_at(s) for s in range(11, 21)} <= {0, 1}
  third = collections.Counter(schedule.task_at(s) for s in range(21, 4021))
  assert set(third) == {0, 1, 3} and abs(third[3] / 4000 - 0.5) < 0.03 and abs(third[0] / 4000 - 0.25) < 0.03
  two = ernie2.Schedule(stages[:2], names, seed=5)
  second = [two.task_at(s) for s in range(11, 4011)]
  assert abs(second.count(0) / 4000 - 0.75) < 0.03
  assert [ernie2.Schedule(stages[:2], names, seed=5).task_at(s) for s in range(11, 4011)] == second  # (seed, step)
  other = ernie2.Schedule(stages[:2], names, seed=6)
  assert [other.task_at(s) for s in range(11, 211)] != second[:200]
  with pytest.raises(UserError, match="drops \\['capital'\\]"):
    ernie2.Schedule(("0:mlm=1,capital=1", "5:mlm=1"), names, seed=0)
  with pytest.raises(UserError, match="first stage must start at step 0"):
    ernie2.Schedule(("3:mlm=1",), names, seed=0)
  with pytest.raises(UserError, match="tasks must be among"):
    ernie2.Schedule(("0:nsp=1",), names, seed=0)


def test_task_embeddings_off_is_the_model_as_before_and_on_adds_one_row_per_task():
  rng = np.random.default_rng(1)
  batch = _batch(rng)
  inputs = ernie2.model_inputs(batch)
  off, on = families.build(_tiny_model()), families.build(_tiny_model(num_tasks=5))
  params = jax.jit(lambda r: nn.meta.unbox(off.init(r, **inputs)["params"]))(jax.random.key(0))
  with_tasks = jax.jit(lambda r: nn.meta.unbox(on.init(r, **inputs)["params"]))(jax.random.key(0))
  assert "task_embeddings" not in params["embeddings"] and ModelConfig().num_tasks == 0
  assert with_tasks["embeddings"]["task_embeddings"]["embedding"].shape == (5, 16)
  rest = {k: v for k, v in with_tasks["embeddings"].items() if k != "task_embeddings"}
  assert jax.tree.map(jnp.shape, rest) == jax.tree.map(jnp.shape, params["embeddings"])
  base = jax.jit(lambda p: off.apply({"params": p}, **inputs))(params)
  apply_on = jax.jit(lambda p, tasks: on.apply({"params": p}, **inputs, task_ids=tasks))
  zero = {**params, "embeddings": {**params["embeddings"],
                                   "task_embeddings": {"embedding": jnp.zeros((5, 16))}}}
  same = apply_on(zero, jnp.array([0, 1, 2, 4]))
  np.testing.assert_array_equal(base.last_hidden_state, same.last_hidden_state)  # bit for bit
  table = jnp.zeros((5, 16)).at[2].set(1.0)
  shifted = {**zero, "embeddings": {**zero["embeddings"], "task_embeddings": {"embedding": table}}}
  out = apply_on(shifted, jnp.array([0, 2, 0, 2]))
  np.testing.assert_array_equal(out.last_hidden_state[0], base.last_hidden_state[0])
  assert not np.allclose(out.last_hidden_state[1], base.last_hidden_state[1])


def test_task_embeddings_match_hugging_faces_ernie_with_task_ids():
  """HF's ErnieModel (use_task_id=True) adds task_type_embeddings[task] to every token's input embedding."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  torch.manual_seed(0)
  hf = transformers.ErnieModel(transformers.ErnieConfig(
      vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
      max_position_embeddings=16, use_task_id=True, task_type_vocab_size=5)).eval()
  tensors = {k: v.numpy() for k, v in hf.state_dict().items()}
  config = _tiny_model(num_tasks=5, mlm_head=False)
  params = conversion_params.to_params(config, families.get("bert"), tensors, "hf", {"b": ""}, "ErnieModel")
  params["embeddings"]["task_embeddings"] = {"embedding": tensors["embeddings.task_type_embeddings.weight"]}
  batch = _batch(np.random.default_rng(2))
  tasks = np.array([0, 3, 4, 1], np.int32)
  ours = jax.jit(lambda p: families.build(config).apply({"params": p}, **ernie2.model_inputs(batch),
                                                        task_ids=tasks))(params)
  with torch.no_grad():
    theirs = hf(input_ids=torch.tensor(batch["input_ids"], dtype=torch.long),
                attention_mask=torch.tensor(batch["input_mask"]),
                token_type_ids=torch.tensor(batch["segment_ids"], dtype=torch.long),
                task_type_ids=torch.tensor(np.repeat(tasks[:, None], 12, 1), dtype=torch.long))
  real = batch["input_mask"] > 0
  np.testing.assert_allclose(np.asarray(ours.last_hidden_state)[real], theirs.last_hidden_state.numpy()[real],
                             atol=2e-5)
  np.testing.assert_allclose(ours.pooled_output, theirs.pooler_output.numpy(), atol=2e-5)


RUN = ["--config.model.hidden_size=32", "--config.model.num_heads=2", "--config.model.intermediate_size=64",
       "--config.model.num_layers=1", "--config.data.max_seq_length=32", "--config.data.max_predictions_per_seq=5",
       "--config.train.batch_size=8", "--config.data.num_shards=2", "--config.data.shuffle_buffer=20",
       "--config.train.eval_every_steps=0", "--config.checkpoint.every_steps=0", "--config.checkpoint.async_save=false",
       "--config.train.tensorboard=false", "--config.optimizer.decay=constant", "--config.optimizer.warmup_steps=0",
       "--config.train.log_every_steps=1"]
STAGES = "--config.ernie.stages=('0:mlm=1', '2:mlm=1,capital=1,token_doc=1', '4:" + "mlm=1,capital=1,token_doc=1," \
         "reorder=1,distance=1')"


def _run(workdir, steps, *extra):
  """The pretrain job in `workdir` without its start-up memory check (a second compile of the step)."""
  config = trainer.load_run_config("configs/ernie.py:tiny", RUN + [STAGES, f"--config.train.num_steps={steps}",
                                                                   *extra])
  with loop.hold(str(workdir)) as (run_dir, signals):
    return trainer.pretrain_in(config, run_dir, signals)


@slow  # three short runs; the draws that make it exact are test_the_schedule_draws_from_its_stage_..., in the default suite
def test_a_run_stopped_and_resumed_across_a_stage_boundary_equals_the_uninterrupted_run(tmp_path):
  whole = _run(tmp_path / "whole", 6)
  _run(tmp_path / "parts", 3)
  parts = _run(tmp_path / "parts", 6)  # resumes at step 3, in stage 2; step 5 is stage 3's first
  assert parts["step"] == whole["step"] == 6
  a, _ = params_checkpoint.load_params(str(tmp_path / "whole"))
  b, _ = params_checkpoint.load_params(str(tmp_path / "parts"))
  jax.tree.map(np.testing.assert_array_equal, a, b)
  assert {k: v for k, v in parts["train"].items() if "per_sec" not in k} == {
      k: v for k, v in whole["train"].items() if "per_sec" not in k}


def test_a_labelled_file_is_an_extra_classification_task(tmp_path):
  tsv = tmp_path / "discourse.tsv"
  tsv.write_text("".join(f"the file is {'and' if i % 2 else 'but'}\tit was {i}\t{i % 2}\n" for i in range(10)))
  config = load_config("configs/ernie.py:tiny", RUN + [
      f"--config.ernie.labelled=('discourse:2:{tsv}',)", "--config.model.num_tasks=6",
      "--config.ernie.stages=('0:mlm=1', '1:mlm=1,discourse=3')", "--config.train.num_steps=4"])
  objective = make_objective(config)
  assert objective.names[-1] == "discourse"

  class Corpus:  # two batches of the corpus's features
    tokenizer = shards.make_tokenizer(config.data)

    def __next__(self):
      return {k: v for k, v in _batch(np.random.default_rng(0), length=32).items() if k != "task_ids"}

  feed = objective.feed(Corpus(), 0, "train", config)
  drawn = [next(feed) for _ in range(12)]
  assert drawn[0]["task_ids"][0] == 0 and (drawn[0]["labelled_labels"] == -1).all()
  labelled = [b for b in drawn if b["task_ids"][0] == 5]
  assert labelled, "the labelled task is never drawn"
  b = labelled[0]
  assert set(b["labelled_labels"]) <= {0, 1} and (b["masked_lm_weights"] == 0).all()
  assert (b["capital_labels"] == -1).all() and (b["reorder_labels"] == -1).all()
  tok = Corpus.tokenizer
  text = tok.decode_tokens(b["input_ids"][0][b["input_mask"][0] > 0])
  assert text[:4] == ["[CLS]", "the", "file", "is"] and int(b["labelled_labels"][0]) == (text[4] == "and")
  params = jax.jit(lambda r: nn.meta.unbox(objective.init(r, b)))(jax.random.key(0))
  sums, counts = jax.jit(lambda p: objective.sums(p, b, None, True))(params), objective.counts(b)
  assert counts["discourse_drawn"] == 4 and float(sums["discourse_loss"]) > 0
  np.testing.assert_allclose(objective.loss(sums, counts), sums["discourse_drawn_loss"] / 4, rtol=1e-6)
  with pytest.raises(UserError, match="model.num_tasks=5: the task embeddings need one row per task, 6"):
    make_objective(load_config("configs/ernie.py:tiny", [f"--config.ernie.labelled=('discourse:2:{tsv}',)"]))


def test_the_ernie_rows_and_objective_go_together():
  with pytest.raises(UserError, match="data.example_builder='ernie' makes ERNIE 2.0's rows, which objective='bert'"):
    make_objective(load_config("configs/bert.py:tiny", ["--config.data.example_builder=ernie"]))
  with pytest.raises(UserError, match="objective='ernie2' needs data.example_builder='ernie'"):
    make_objective(load_config("configs/ernie.py:tiny", ["--config.data.example_builder=nsp"]))
  objective = make_objective(load_config("configs/ernie.py:tiny"))
  assert objective.names == ("mlm", "capital", "token_doc", "reorder", "distance")
  assert objective.config.num_tasks == 5


def _chance(config) -> dict[str, float]:
  """Each task's majority-class accuracy on the held-out batches (MLM: the most frequent masked token's)."""
  data = pipeline.for_config(config, "eval", config.train.eval_batch_size)
  try:
    batches = [next(data) for _ in range(config.train.eval_steps)]
  finally:
    data.close()
  chance = {}
  for task, name in (("capital", "capital_labels"), ("token_doc", "token_doc_labels"),
                     ("reorder", "reorder_labels"), ("distance", "distance_labels"), ("mlm", "masked_lm_ids")):
    labels = np.concatenate([b[name].ravel() for b in batches])
    if task == "mlm":
      labels = labels[np.concatenate([b["masked_lm_weights"].ravel() for b in batches]) > 0]
    labels = labels[labels >= 0]
    chance[task] = np.bincount(labels).max() / len(labels)
  return chance


@slow  # the tiny preset's whole schedule on the embedded corpus (BERT_JAX_SLOW_TESTS=1)
def test_the_tiny_preset_learns_every_task(tmp_path):
  config = trainer.load_run_config("configs/ernie.py:tiny", ["--config.train.eval_steps=32",
                                                             "--config.train.tensorboard=false"])
  chance = _chance(config)
  result = trainer.pretrain(config, str(tmp_path))
  with open(tmp_path / "metrics.jsonl") as f:
    rows = [json.loads(line) for line in f]
  train, evals = [r for r in rows if not r.get("eval")], [r for r in rows if r.get("eval")]
  assert train[-1]["mlm_loss"] < train[0]["mlm_loss"] - 1.0
  assert evals[-1]["loss"] < evals[0]["loss"]  # every task is in the schedule by the first evaluation
  for task, level in chance.items():
    assert result["eval"][f"{task}_accuracy"] > level + 0.01, (task, level, result["eval"])
