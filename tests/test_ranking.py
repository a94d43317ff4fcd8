"""MT-DNN's pairwise ranking (task.head=ranking, bert_jax/finetune/ranking.py, head kind `ranking`): the loss against
NumPy on a hand-built group batch with a padded candidate, also through the model on [G, K, T] rows; the groups,
the training groups and the group -> label conversion on hand-built rows; a tiny QNLI-format task (each question's
positive candidate starts with "true", its negatives with "false") whose short single-task run ranks the positive
first far above chance, with predict's per-pair scores and labels and a 1-label HF export; and (weekly) an MT-DNN run
of that ranking task beside the embedded first_word classification task, with predict and export --task qnli."""
import json
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

import data_fixtures
from bert_jax import cli
from bert_jax.config_utils import load_config
from bert_jax.errors import UserError
from bert_jax.finetune import batching, heads, multitask, ranking
from bert_jax.finetune.objective import FinetuneObjective
from bert_jax.models import head_kinds
from bert_jax.models.config import ModelConfig
from core_helpers import slow

SIZES = ["--config.model.num_layers=2", "--config.model.hidden_size=32", "--config.model.num_heads=2",
         "--config.model.intermediate_size=64", "--config.model.max_position_embeddings=32",
         "--config.data.max_seq_length=24", "--config.train.eval_batch_size=32",
         "--config.optimizer.learning_rate=8e-3", "--config.train.tensorboard=false",
         "--config.train.log_every_steps=10"]
SETTINGS = ranking.Settings(group_size=3, scale=2.0, positive=0, negative=1)


def _numpy_loss(scores, mask, label, scale):
  total = 0.0
  for s, m, y, g in zip(scores, mask, label, scale):
    z = g * np.asarray(s, np.float64)[np.asarray(m) > 0]
    total += np.logaddexp.reduce(z) - z[y]
  return total


def test_the_loss_is_numpys_and_a_padded_candidate_does_not_count():
  scores = np.array([[1.0, 2.0, 7.0], [0.5, -1.0, 3.0]], np.float32)
  batch = {"candidate_mask": np.array([[1, 1, 0], [1, 1, 1]], np.float32), "label": np.array([0, 2], np.int32),
           "scale": np.array([2.0, 2.0], np.float32), "input_ids": np.zeros((2, 3, 4), np.int32)}
  kind = head_kinds.get("ranking")
  want = _numpy_loss(scores, batch["candidate_mask"], batch["label"], batch["scale"])
  assert want == pytest.approx(np.log1p(np.exp(2.0)) + np.logaddexp.reduce([1.0, -2.0, 6.0]) - 6.0)
  assert float(kind.loss({"logits": jnp.asarray(scores)}, batch)) == pytest.approx(want, rel=1e-6)
  moved = scores.copy()
  moved[0, 2] = -50.0  # the padded candidate's score changes nothing
  assert float(kind.loss({"logits": jnp.asarray(moved)}, batch)) == pytest.approx(want, rel=1e-6)
  assert float(kind.count(batch)) == 2.0  # the loss is per group
  grad = jax.grad(lambda s: kind.loss({"logits": s}, batch))(jnp.asarray(scores))
  assert grad[0, 2] == 0.0 and np.all(np.asarray(grad[:, :2]) != 0)


def test_grouped_rows_run_as_rows_through_the_model():
  """A [G, K, T] batch through FinetuneModel gives each row's score as a [G * K, T] batch does; the objective's
  loss on it is NumPy's over those scores."""
  config = ModelConfig(vocab_size=128, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32,
                       max_position_embeddings=16)
  model = heads.FinetuneModel(heads.encoder_config(config, "ranking", "pooled"), "ranking", 1, head_dropout=0.0)
  objective = FinetuneObjective(model)
  rng = np.random.default_rng(0)
  ids = rng.integers(5, 128, (2, 3, 16)).astype(np.int32)
  batch = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids),
           "label": np.array([0, 1], np.int32), "candidate_mask": np.array([[1, 1, 0], [1, 1, 1]], np.float32),
           "scale": np.array([1.5, 1.5], np.float32)}
  params = jax.jit(objective.init)(jax.random.key(0), {k: v[0] for k, v in batch.items() if v.ndim == 3})
  logits = jax.jit(lambda p, b: objective.apply(p, b)["logits"])  # compiled: eager ops compile one by one
  flat = logits(params, {k: v.reshape(6, 16) for k, v in batch.items() if v.ndim == 3})
  # the grouped batch's scores and the objective's loss on it, in one compiled program
  grouped, loss = jax.jit(lambda p, b: (objective.apply(p, b)["logits"],
                                        objective.loss(objective.sums(p, b, None, True), objective.counts(b))))(
                                            params, batch)
  assert grouped.shape == (2, 3)
  np.testing.assert_allclose(np.asarray(grouped).reshape(-1), flat, rtol=1e-5, atol=1e-6)
  assert float(loss) == pytest.approx(
      _numpy_loss(np.asarray(flat).reshape(2, 3), batch["candidate_mask"], batch["label"], batch["scale"]) / 2,
      rel=1e-5)


def _rows(questions, labels, weight=None):
  """Pair rows: [CLS] q [SEP] candidate [SEP] with question tokens q and a distinct candidate token each."""
  ids = np.zeros((len(questions), 8), np.int32)
  types, mask = np.zeros_like(ids), np.zeros_like(ids)
  for i, q in enumerate(questions):
    row = [1, *q, 2, 100 + i, 2]
    ids[i, :len(row)], mask[i, :len(row)], types[i, len(q) + 2:len(row)] = row, 1, 1
  out = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types, "label": np.array(labels, np.int32)}
  return out if weight is None else {**out, "example_weight": np.array(weight, np.float32)}


def test_groups_training_groups_and_the_conversion_to_labels():
  a, b, c = [7, 8], [7, 9], [5]
  rows = _rows([a, b, a, a, c, b, a], [1, 0, 0, 1, 1, 1, 1], weight=[1, 1, 1, 1, 1, 1, 0])
  np.testing.assert_array_equal(ranking.group_ids(rows), [0, 1, 0, 0, 2, 1, 3])  # the padding row: its own
  # Within each group the top score is the positive (label 0), the rest negative; ties: the first row.
  scores = np.array([0.1, 3.0, 0.5, 0.2, -1.0, 3.0, 9.0])
  np.testing.assert_array_equal(ranking.to_labels(scores, ranking.group_ids(rows), 0, 1), [1, 0, 0, 1, 0, 1, 0])
  # question a: one positive (row 2), negatives 0, 3 -> one full group; b: positive 1, negative 5; c: no
  # positive, left out; the padding row 6 is a group of its own with no positive.
  grouped = ranking.group_rows(rows, SETTINGS)
  np.testing.assert_array_equal(grouped["input_ids"][:, :, 4], [[102, 100, 103], [101, 105, 101]])
  np.testing.assert_array_equal(grouped["candidate_mask"], [[1, 1, 1], [1, 1, 0]])
  np.testing.assert_array_equal(grouped["label"], [0, 0])
  np.testing.assert_array_equal(grouped["scale"], [2.0, 2.0])
  # Four negatives and two positives with group_size 3: two groups, each negative once.
  many = ranking.group_rows(_rows([a] * 6, [0, 1, 1, 0, 1, 1]), SETTINGS)
  np.testing.assert_array_equal(many["input_ids"][:, :, 4], [[100, 101, 102], [103, 104, 105]])
  with pytest.raises(UserError, match="no question has both a positive and a negative"):
    ranking.group_rows(_rows([a, b], [0, 0]), SETTINGS)


def test_length_buckets_cut_whole_groups():
  """A group goes to the bucket of its longest row; its inputs are cut on their last axis, the rest kept."""
  lengths = np.array([[3, 2], [1, 3], [7, 2], [3, 6]])  # groups' longest rows: 3, 3, 7, 6
  mask = (np.arange(8) < lengths[..., None]).astype(np.int32)
  features = {"input_ids": mask * 7, "attention_mask": mask, "token_type_ids": mask * 0,
              "label": np.zeros(4, np.int32), "candidate_mask": np.ones((4, 2), np.float32)}
  np.testing.assert_array_equal(batching.row_lengths(features), [3, 3, 7, 6])
  shapes = {}
  for batch in batching.train_batches(features, 2, 0, 0, 4, (4, 8)):
    short = batch["input_ids"].shape[-1] == 4
    assert batch["candidate_mask"].shape == (2, 2) and batch["label"].shape == (2,)
    shapes[short] = batch["input_ids"].shape
    assert batch["attention_mask"].sum() == (9 if short else 18)  # whole groups: (3+2)+(1+3), (7+2)+(3+6)
  assert shapes == {True: (2, 2, 4), False: (2, 2, 8)}


def write_qnli(directory, n_train_questions=96, n_dev_questions=24):
  """QNLI-format train.tsv/dev.tsv: each question (a real sentence's first words) with one candidate starting
  "true" (entailment) and one to three starting "false" (not_entailment), in shuffled order."""
  os.makedirs(directory, exist_ok=True)
  sentences = data_fixtures.real_sentences(4 * (n_train_questions + n_dev_questions) + 8)
  rng = np.random.default_rng(0)
  index = 0
  for split, count in (("train", n_train_questions), ("dev", n_dev_questions)):
    lines = ["index\tquestion\tsentence\tlabel\n"]
    for _ in range(count):
      question = " ".join(sentences[index].split()[:4]) + "?"
      candidates = [("true", "entailment")] + [("false", "not_entailment")] * int(rng.integers(1, 4))
      for k in rng.permutation(len(candidates)):
        index += 1
        word, label = candidates[k]
        tail = " ".join(sentences[index].split()[:8])
        lines.append(f"{len(lines) - 1}\t{question}\t{word} {tail}\t{label}\n")
      index += 1
    with open(os.path.join(directory, f"{split}.tsv"), "w", encoding="utf-8") as f:
      f.writelines(lines)
  return str(directory)


def _dev_rows(data):
  with open(os.path.join(data, "dev.tsv"), encoding="utf-8") as f:
    return [line.split("\t") for line in f.read().splitlines()[1:]]


@pytest.fixture(scope="module")
def single(tmp_path_factory):
  data = write_qnli(tmp_path_factory.mktemp("qnli"))
  workdir = tmp_path_factory.mktemp("rank")
  args = ["finetune", "--config", "configs/glue.py:qnli", *SIZES, f"--config.data.data_dir={data}",
          "--config.task.head=ranking", "--config.train.batch_size=8", "--config.train.num_steps=20",
          "--config.data.length_buckets=(16,)", "--workdir", str(workdir)]  # groups of <= 16 tokens: 16 wide
  assert cli.main(args) == 0
  return data, workdir


def test_a_short_run_ranks_the_positive_first(single, tmp_path, capsys):
  """Chance for the converted labels is 0.56 (one of 2-4 candidates picked at random); the run is far above it.
  predict writes each pair's score and the converted label, the same as the run's evaluation."""
  data, workdir = single
  results = json.loads((workdir / "eval_results.json").read_text())
  assert results["accuracy"] >= 0.9 and np.isfinite(results["loss"])
  saved = json.loads((workdir / "config.json").read_text())
  assert saved["task"]["head"] == "ranking" and saved["task"]["num_labels"] == 1
  assert (workdir / "predictions" / "QNLI.dev.tsv").exists()
  out = tmp_path / "dev.jsonl"
  assert cli.main(["predict", "--model", str(workdir), "--input", os.path.join(data, "dev.tsv"),
                   "--output", str(out)]) == 0
  assert "(qnli, ranking)" in capsys.readouterr().err
  records = [json.loads(line) for line in out.read_text().splitlines()]
  gold = [row[3] for row in _dev_rows(data)]
  assert np.mean([r["label"] == g for r, g in zip(records, gold)]) == pytest.approx(results["accuracy"])
  groups = np.array([r["group"] for r in records])
  for g in np.unique(groups):  # one entailment per question, the top-scored one
    members = [records[i] for i in np.flatnonzero(groups == g)]
    top = max(range(len(members)), key=lambda i: members[i]["score"])
    assert [m["label"] for m in members] == ["entailment" if i == top else "not_entailment"
                                             for i in range(len(members))]


def test_tokens_per_second_count_every_row_of_a_group(single):
  """train.batch_size counts groups: the logged tokens/s is 8 groups x 2 rows (group_size) x 24 tokens a step."""
  _, workdir = single
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines() if "tokens_per_sec" in line]
  assert rows and all(r["tokens_per_sec"] == pytest.approx(r["steps_per_sec"] * 8 * 2 * 24) for r in rows)


def test_export_is_a_one_label_sequence_classifier(single, tmp_path):
  transformers = pytest.importorskip("transformers")
  torch = pytest.importorskip("torch")
  import bert_jax  # pylint: disable=import-outside-toplevel
  data, workdir = single
  assert cli.main(["convert", "--to", "hf", str(workdir), str(tmp_path / "hf")]) == 0
  model = transformers.BertForSequenceClassification.from_pretrained(tmp_path / "hf").eval()
  assert model.config.num_labels == 1 and model.config.id2label == {0: "relevance"}
  pairs = [(row[1], row[2]) for row in _dev_rows(data)[:6]]
  tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
  with torch.no_grad():
    encoded = tokenizer([a for a, _ in pairs], [b for _, b in pairs], padding=True, truncation=True,
                        max_length=24, return_tensors="pt")
    logits = model(**encoded).logits.numpy()[:, 0]
  ours = bert_jax.Predictor.load(str(workdir)).outputs(pairs)["logits"]
  np.testing.assert_allclose(ours, logits, atol=1e-5)


def test_bad_ranking_settings_are_named(tmp_path, capsys):
  data = write_qnli(tmp_path / "q", 4, 2)
  for override, message in (("task.ranking.group_size=1", "task.ranking.group_size=1 must be >= 2"),
                            ("task.ranking.positive=yes", "task.ranking.positive='yes' is not one of"),
                            ("smart.enabled=true", "SMART (smart.enabled) perturbs rows"),
                            ("task.head=span", "task.head='span': task qnli trains with its own head")):
    assert cli.main(["finetune", "--config", "configs/glue.py:qnli", *SIZES, f"--config.data.data_dir={data}",
                     "--config.task.head=ranking", f"--config.{override}", "--workdir", str(tmp_path / "w")]) == 2
    assert message in capsys.readouterr().err


@slow  # a multi-task run: two tasks' steps and evaluations compiled, predict and export
def test_mtdnn_trains_a_ranking_task_beside_a_classification_task(tmp_path):
  data = write_qnli(tmp_path / "qnli", 32, 8)
  config = load_config("configs/mtdnn.py:tiny", SIZES + ["--config.train.num_steps=8", "--config.train.batch_size=8"])
  with config.unlocked():
    config.mtdnn.tasks = ml_collections.ConfigDict({
        "first_word": {"family": "embedded", "name": "first_word", "data_dir": "", "num_train": 64, "num_dev": 16},
        "qnli": {"family": "glue", "name": "qnli", "data_dir": data, "head": "ranking",
                 "ranking": {"group_size": 3, "scale": 1.0, "positive": "entailment"}}})
    config.mtdnn.loss_weights = ml_collections.ConfigDict({"first_word": 1.0, "qnli": 1.0})
  result = multitask.train(config, str(tmp_path / "w"))
  results = json.loads((tmp_path / "w" / "eval_results.json").read_text())
  assert result["dev"] == results and set(results) == {"first_word", "qnli", "score"}
  assert 0 <= results["qnli"]["accuracy"] <= 1 and np.isfinite(results["qnli"]["loss"])
  saved = json.loads((tmp_path / "w" / "config.json").read_text())
  assert saved["task"]["heads"]["qnli"]["head"] == "ranking" and saved["task"]["heads"]["qnli"]["num_labels"] == 1
  assert saved["task"]["heads"]["first_word"]["head"] == "classification"
  out = tmp_path / "dev.jsonl"  # predict --task qnli: the run's dev accuracy, from the pairs' scores
  assert cli.main(["predict", "--model", str(tmp_path / "w"), "--task", "qnli", "--input",
                   os.path.join(data, "dev.tsv"), "--output", str(out)]) == 0
  labels = [json.loads(line)["label"] for line in out.read_text().splitlines()]
  gold = [row[3] for row in _dev_rows(data)]
  assert np.mean([p == g for p, g in zip(labels, gold)]) == pytest.approx(results["qnli"]["accuracy"])
  assert cli.main(["convert", "--to", "hf", "--task", "qnli", str(tmp_path / "w"), str(tmp_path / "hf")]) == 0
  assert json.loads((tmp_path / "hf" / "config.json").read_text())["num_labels"] == 1
  # Stage 2: single-task QNLI ranking from the multi-task workdir starts from its encoder and qnli head.
  assert cli.main(["finetune", "--config", "configs/glue.py:qnli", *SIZES, f"--config.data.data_dir={data}",
                   "--config.task.head=ranking", f"--config.init_from={tmp_path / 'w'}", "--config.eval_only=true",
                   "--workdir", str(tmp_path / "stage2")]) == 0
  single = json.loads((tmp_path / "stage2" / "eval_results.json").read_text())
  assert single["accuracy"] == results["qnli"]["accuracy"]
  assert single["loss"] == pytest.approx(results["qnli"]["loss"], rel=1e-5)
