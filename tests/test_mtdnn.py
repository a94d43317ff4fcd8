"""Multi-task fine-tuning (MT-DNN, bert_jax/finetune/multitask.py) at tiny sizes: the task draws against their
formula and exact across a resume; one head per task, and a step on one task's batch moves only that task's
head; a two-task run (the first-word sst2 files and the embedded first_word task) trains both heads far above
chance with a table per task in eval_results.json; the workdir is an init_from for single-task fine-tuning (its
encoder and the task's head: the same dev metrics); a SIGTERM-stopped run resumes to the uninterrupted result."""
import json
import os
import re
import signal

import jax
import ml_collections
import numpy as np
import pytest

import bert_jax
import data_fixtures
from bert_jax import cli
from bert_jax.config_utils import load_config
from bert_jax.errors import UserError
from bert_jax.finetune import multitask
from bert_jax.training import driver, loop, partitioning
from core_helpers import slow

SIZES = ["--config.model.num_layers=2", "--config.model.hidden_size=32", "--config.model.num_heads=2",
         "--config.model.intermediate_size=64", "--config.model.max_position_embeddings=32",
         "--config.data.max_seq_length=16", "--config.train.batch_size=16", "--config.train.eval_batch_size=32",
         "--config.optimizer.learning_rate=8e-3", "--config.train.tensorboard=false",
         "--config.train.log_every_steps=16"]
FIRST_WORD = ["--config.task.name=first_word", "--config.task.num_train=256", "--config.task.num_dev=64"]


def _config(data_dir, *overrides):
  """The tiny preset with two learnable tasks: the embedded first_word task and the first-word sst2 files."""
  config = load_config("configs/mtdnn.py:tiny", SIZES + ["--config.train.num_steps=40", *overrides])
  with config.unlocked():
    config.mtdnn.tasks = ml_collections.ConfigDict({
        "first_word": {"family": "embedded", "name": "first_word", "data_dir": "", "num_train": 256, "num_dev": 64},
        "sst2": {"family": "glue", "name": "sst2", "data_dir": data_dir}})
    config.mtdnn.loss_weights = ml_collections.ConfigDict({"first_word": 1.0, "sst2": 1.0})
  return config


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  data = data_fixtures.write_first_word_sst2(tmp_path_factory.mktemp("sst2"), n_train=256, n_dev=64)
  workdir = tmp_path_factory.mktemp("mtdnn")
  result = multitask.train(_config(data), str(workdir))
  return data, workdir, result


def test_task_draws_follow_the_formula_and_resume_exactly():
  sizes = [3000, 1000, 500]
  p = multitask.probabilities(sizes, "proportional", 1.0)
  np.testing.assert_allclose(p, np.array(sizes) / 4500)
  t2 = multitask.probabilities(sizes, "temperature", 2.0)
  np.testing.assert_allclose(t2, np.sqrt(sizes) / np.sqrt(sizes).sum())
  np.testing.assert_allclose(multitask.probabilities(sizes, "temperature", 1e6), [1 / 3] * 3, atol=1e-5)
  draws = np.bincount([multitask.task_at(s, 7, p) for s in range(6000)], minlength=3) / 6000
  np.testing.assert_allclose(draws, p, atol=0.02)  # ~3.5 binomial standard deviations
  features = [{"input_ids": np.arange(n)[:, None] + 1000 * i, "label": np.zeros(n)} for i, n in enumerate((40, 24))]
  p = multitask.probabilities([40, 24], "proportional", 1.0)

  def stream(start, end):
    s = multitask.TaskStream(features, 4, 3, p, start, end)
    return [(int(next(s)["input_ids"][0, 0]), s.task) for _ in range(end - start)]
  whole = stream(0, 30)
  assert stream(17, 30) == whole[17:]  # the steps after a resume see what an uninterrupted run saw
  assert all(ids // 1000 == task for ids, task in whole) and {t for _, t in whole} == {0, 1}


@pytest.mark.parametrize("preset", ["glue", "tiny"])
def test_presets_pass_and_bad_values_are_named(preset):
  config = load_config(f"configs/mtdnn.py:{preset}")
  multitask.validate(config)
  assert set(config.mtdnn.loss_weights.keys()) == set(config.mtdnn.tasks.keys())
  if preset == "glue":
    assert multitask.task_names(load_config("configs/mtdnn.py:glue", ["--config.mtdnn.select=stsb, rte"])) == [
        "rte", "stsb"]
  for override, message in (("mtdnn.sampling=uniform", "mtdnn.sampling='uniform' is not one of"),
                            ("mtdnn.temperature=0", "mtdnn.temperature=0.0 must be > 0"),
                            ("smart.enabled=true", "['smart.enabled']: not available in a multi-task run"),
                            ("mtdnn.select=nope", "mtdnn.select names ['nope']")):
    with pytest.raises(UserError, match=re.escape(message)):
      multitask.validate(load_config(f"configs/mtdnn.py:{preset}", [f"--config.{override}"]))


def test_a_step_moves_the_encoder_and_only_its_tasks_head(trained, tmp_path):
  config = _config(trained[0])  # the trained run's: its step is compiled already
  multitask.validate(config)
  learner = multitask.MultiTaskRun(config, tmp_path / "w")
  run = driver.Driver(config, tmp_path / "w", learner, loop.StopRequests())
  assert learner.names == ["first_word", "sst2"]
  params = jax.device_get(run.state.params)
  assert set(params[multitask.HEADS]) == {"first_word", "sst2"} and "head" not in params
  i = learner.names.index("sst2")
  batch = {k: v[:16] for k, v in learner.tasks[i].train.items()}
  objective = learner.setups[i].objective
  loss = lambda p: objective.loss(objective.sums(p, batch, None, True), objective.counts(batch))  # noqa: E731
  grads = jax.jit(jax.grad(loss))(params)
  assert all(np.all(g == 0) for g in jax.tree.leaves(grads[multitask.HEADS]["first_word"]))
  assert all(np.any(g != 0) for g in jax.tree.leaves(grads[multitask.HEADS]["sst2"]))
  state = run.state
  for _ in range(2):  # the first step's learning rate is 0 (warmup)
    state, _ = learner.setups[i].train_step(state, partitioning.global_batch(batch, run.setup.mesh), jax.random.key(0))
  after = jax.device_get(state.params)
  for before_leaf, after_leaf in zip(jax.tree.leaves(params[multitask.HEADS]["first_word"]),
                                     jax.tree.leaves(after[multitask.HEADS]["first_word"])):
    np.testing.assert_array_equal(before_leaf, after_leaf)  # weight decay would have moved it
  assert all(np.any(a != b) for a, b in zip(jax.tree.leaves(params[multitask.HEADS]["sst2"]),
                                            jax.tree.leaves(after[multitask.HEADS]["sst2"])))
  assert any(np.any(a != b) for a, b in zip(jax.tree.leaves(params["encoder"]), jax.tree.leaves(after["encoder"])))


def test_both_tasks_train_with_a_table_each(trained):
  _, workdir, result = trained
  results = json.loads((workdir / "eval_results.json").read_text())
  assert set(results) == {"first_word", "sst2", "score"}
  assert results["first_word"]["accuracy"] >= 0.9 and results["sst2"]["accuracy"] >= 0.9  # chance: 0.5
  assert results["score"] == pytest.approx((results["first_word"]["accuracy"] + results["sst2"]["accuracy"]) / 2)
  assert result["dev"] == results and result["step"] == 40
  saved = json.loads((workdir / "config.json").read_text())
  assert saved["task"]["heads"]["sst2"] == {"head": "classification", "num_labels": 2, "labels": ["0", "1"]}
  assert (workdir / "predictions" / "sst2" / "SST-2.dev.tsv").exists()
  assert not (workdir / "state").exists()


def test_the_workdir_is_an_init_from_for_one_task(trained, tmp_path, capsys):
  """Stage 2: a single-task run of first_word from the multi-task workdir starts from its encoder and
  its first_word head, so evaluating it gives the multi-task run's dev metrics."""
  _, workdir, _ = trained
  results = json.loads((workdir / "eval_results.json").read_text())
  args = ["finetune", "--config", "configs/glue.py:embedded", *SIZES, *FIRST_WORD, f"--config.init_from={workdir}"]
  assert cli.main([*args, "--workdir", str(tmp_path / "eval"), "--config.eval_only=true"]) == 0
  assert "initialised the first_word head" in capsys.readouterr().out
  single = json.loads((tmp_path / "eval" / "eval_results.json").read_text())
  assert single["accuracy"] == results["first_word"]["accuracy"]
  assert single["loss"] == pytest.approx(results["first_word"]["loss"], rel=1e-5)


def test_predict_and_export_take_one_task(trained, tmp_path, capsys):
  """predict --task sst2 labels the dev file as the run's evaluation scored it; convert --to hf --task sst2
  writes a BertForSequenceClassification with the same logits; without --task both name the tasks."""
  data, workdir, _ = trained
  results = json.loads((workdir / "eval_results.json").read_text())
  dev = os.path.join(data, "dev.tsv")
  out = tmp_path / "dev.jsonl"
  assert cli.main(["predict", "--model", str(workdir), "--task", "sst2", "--input", dev, "--output", str(out)]) == 0
  assert "64 predictions (sst2, classification)" in capsys.readouterr().err
  labels = [json.loads(line)["label"] for line in out.read_text().splitlines()]
  with open(dev, encoding="utf-8") as f:
    rows = [line.split("\t") for line in f.read().splitlines()[1:]]
  assert np.mean([p == gold for p, (_, gold) in zip(labels, rows)]) == pytest.approx(results["sst2"]["accuracy"])
  assert cli.main(["predict", "--model", str(workdir), "--input", dev]) == 2
  assert "choose its task with --task NAME, one of ['first_word', 'sst2']" in capsys.readouterr().err
  transformers = pytest.importorskip("transformers")
  torch = pytest.importorskip("torch")
  assert cli.main(["convert", "--to", "hf", "--task", "sst2", str(workdir), str(tmp_path / "hf")]) == 0
  model = transformers.BertForSequenceClassification.from_pretrained(tmp_path / "hf").eval()
  assert model.config.id2label == {0: "0", 1: "1"}
  sentences = [sentence for sentence, _ in rows[:8]]
  tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
  with torch.no_grad():
    logits = model(**tokenizer(sentences, padding=True, truncation=True, return_tensors="pt")).logits.numpy()
  ours = bert_jax.Predictor.load(str(workdir), task="sst2").outputs(sentences)["logits"]
  np.testing.assert_allclose(ours, logits, atol=1e-5)


class _StopAt(loop.StopRequests):
  def __init__(self, step):
    super().__init__()
    self.at = step

  def reached(self, step):
    if step == self.at:
      self.received = signal.SIGTERM
    return super().reached(step)


@slow  # two more runs
def test_a_stopped_run_resumes_to_the_uninterrupted_result(trained, tmp_path):
  config = _config(trained[0], "--config.train.eval_every_steps=32")
  reference = multitask.train(config, str(tmp_path / "ref"))
  workdir = tmp_path / "w"
  multitask.validate(config)
  run = driver.Driver(config, workdir, multitask.MultiTaskRun(config, workdir), _StopAt(21))
  run.advance()
  assert run.stopped_by == "SIGTERM" and run.step == 21 and (workdir / "state").exists()
  assert multitask.train(config, str(workdir))["dev"] == reference["dev"]


@slow  # two more compiles of each task's step
def test_a_2x2x2_mesh_trains_as_data_parallel(trained, tmp_path):
  """The same three steps (both tasks drawn) with the weights split over fsdp and tensor as with data parallelism."""
  params = []
  for i, mesh in enumerate((["--config.mesh.data=8"], ["--config.mesh.data=2", "--config.mesh.fsdp=2",
                                                       "--config.mesh.tensor=2"])):
    config = _config(trained[0], *mesh)
    run = driver.Driver(config, tmp_path / str(i), multitask.MultiTaskRun(config, tmp_path / str(i)), _StopAt(3))
    run.advance()
    assert run.step == 3
    params.append(jax.device_get(run.state.params))
  assert {multitask.task_at(s, 0, run.learner.p) for s in range(3)} == {0, 1}
  for a, b in zip(jax.tree.leaves(params[0]), jax.tree.leaves(params[1])):
    np.testing.assert_allclose(a, b, atol=2e-5)


@slow  # two more runs
def test_each_task_reaches_its_single_task_score_within_noise(trained, tmp_path):
  """MT-DNN's claim at this scale: the two-task run (40 steps shared) scores on each task within 0.05 of
  a single-task run of that task alone (40 steps, the same model and optimizer)."""
  data, workdir, _ = trained
  multi = json.loads((workdir / "eval_results.json").read_text())
  runs = {"first_word": ["--config", "configs/glue.py:embedded", *FIRST_WORD],
          "sst2": ["--config", "configs/glue.py:sst2", f"--config.data.data_dir={data}"]}
  for task, args in runs.items():
    out = tmp_path / task
    assert cli.main(["finetune", *args, *SIZES, "--config.train.num_steps=40", "--workdir", str(out)]) == 0
    single = json.loads((out / "eval_results.json").read_text())["accuracy"]
    assert multi[task]["accuracy"] >= single - 0.05, (task, multi[task]["accuracy"], single)


def test_config_json_records_the_trainable_parameters_as_fine_tuning_does(trained):
  """Before: MT-DNN's config.json had no trainable_parameters (fine-tuning's has): every parameter trains."""
  from bert_jax.training import checkpoint  # pylint: disable=import-outside-toplevel
  _, workdir, _ = trained
  record = json.loads((workdir / "config.json").read_text())["trainable_parameters"]
  params, _ = checkpoint.load_params(workdir)
  assert record == {"count": sum(x.size for x in jax.tree.leaves(params)),
                    "total": sum(x.size for x in jax.tree.leaves(params)), "share": 1.0}
