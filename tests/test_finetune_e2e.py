"""End to end: a learnable task through the CLI must reach 95% dev accuracy; then eval-only,
two-stage fine-tuning, early stopping with the best checkpoint kept, pause/resume, SIGTERM and resume,
a finished run run again, and a sweep."""
import json
import os
import shutil
import signal

import jax
import numpy as np
import pytest

import data_fixtures
from bert_jax import cli
from bert_jax.config_utils import load_config
from bert_jax.errors import UserError
from bert_jax.finetune import sweep, trainer
from bert_jax.training import finite, metrics
from core_helpers import slow


TINY = ["--config.model.num_layers=1", "--config.model.hidden_size=32", "--config.model.num_heads=2",
        "--config.model.intermediate_size=64", "--config.model.max_position_embeddings=32",
        "--config.data.max_seq_length=32", "--config.train.batch_size=16", "--config.train.eval_batch_size=32",
        "--config.train.log_every_steps=4"]


def _glue_dir(directory, name, labels, header, n_train=256, n_dev=64):
  """Real sentences whose label is written in their first word ("true ..." / "false ...")."""
  os.makedirs(directory, exist_ok=True)
  sentences = data_fixtures.real_sentences(n_train + n_dev)
  rng = np.random.default_rng(0)
  for split, chunk in (("train", sentences[:n_train]), ("dev", sentences[n_train:])):
    with open(os.path.join(directory, f"{split}.tsv"), "w", encoding="utf-8") as f:
      f.write("\t".join(header) + "\n")
      for i, sentence in enumerate(chunk):
        y = int(rng.integers(2))
        f.write(name(i, f"{('false', 'true')[y]} {sentence}", labels[y]) + "\n")
  return str(directory)


@pytest.fixture(scope="module")
def sst2_run(sst2_finetuned):
  """The session's fine-tuned sst2 model (tests/conftest.py: 4 epochs of 16 steps, through the CLI)."""
  return sst2_finetuned


def test_learnable_task_reaches_95_percent(sst2_run):
  _, workdir, _ = sst2_run
  with open(os.path.join(workdir, "eval_results.json")) as f:
    assert json.load(f)["accuracy"] >= 0.95
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    records = [json.loads(line) for line in f]
  assert [r["step"] for r in records if not r.get("eval")] == list(range(4, 65, 4))  # 4 epochs of 16 steps
  assert [r["step"] for r in records if r.get("eval") and "accuracy" in r] == [16, 32, 48, 64]
  with open(os.path.join(workdir, "predictions", "SST-2.dev.tsv")) as f:
    lines = f.read().splitlines()
  assert lines[0] == "index\tprediction" and len(lines) == 65 and lines[1].split("\t")[1] in ("0", "1")


def test_eval_only_reproduces_results(sst2_run, tmp_path, capsys):
  data, workdir, overrides = sst2_run
  config = load_config("configs/glue.py:sst2", overrides + [f"--config.init_from={workdir}",
                                                            "--config.eval_only=true"])
  result = trainer.finetune(config, str(tmp_path))
  with open(os.path.join(workdir, "eval_results.json")) as f:
    assert result["dev"] == json.load(f)
  assert os.path.exists(tmp_path / "predictions" / "SST-2.dev.tsv")
  out = capsys.readouterr().out
  assert "eval_only: evaluating the " in out and f"parameters of {workdir}" in out and "parameters train" not in out
  line = trainer.summary(config, str(tmp_path), result)
  assert line.startswith("done: dev accuracy ") and f"predictions in {tmp_path}/predictions" in line
  assert line.endswith(f"next: bert-jax predict --model {workdir} --input FILE"), line
  config = load_config("configs/glue.py:embedded", TINY + ["--config.predict_split=test", "--config.data.train_limit=32",
                                                          "--config.data.eval_limit=32"])
  with pytest.raises(UserError, match="task embedded has no test split to predict: set --config.predict_split=dev"):
    trainer.finetune(config, str(tmp_path / "test"))


def test_two_stage_takes_encoder_and_drops_other_head(sst2_run, tmp_path):
  _, workdir, overrides = sst2_run
  rte = _glue_dir(tmp_path / "rte", lambda i, s, y: f"{i}\t{s}\tyes\t{y}", ("entailment", "not_entailment"),
                  ("index", "sentence1", "sentence2", "label"), n_train=32, n_dev=32)
  config = load_config("configs/glue.py:rte", overrides + [f"--config.init_from={workdir}",
                                                           f"--config.data.data_dir={rte}"])
  run = trainer.start(config, str(tmp_path / "run"))
  saved, _ = trainer.checkpoint.load_params(workdir)
  same = jax.tree.map(np.array_equal, jax.device_get(run.state.params["encoder"]), saved["encoder"])
  assert all(jax.tree.leaves(same))
  assert not np.array_equal(jax.device_get(run.state.params["head"]["classifier"]["kernel"]),
                            saved["head"]["classifier"]["kernel"])


def test_early_stopping_keeps_best_and_says_so(sst2_run, tmp_path, capsys):
  data, _, overrides = sst2_run
  config = load_config("configs/glue.py:sst2", overrides + [
      f"--config.data.data_dir={data}", "--config.train.eval_every_steps=2", "--config.train.epochs=2",
      "--config.train.early_stopping_patience=2", "--config.optimizer.learning_rate=1e-9",
      "--config.data.train_limit=64"])
  result = trainer.finetune(config, str(tmp_path))
  # lr ~ 0: the score never improves on the first evaluation, so two more evaluations stop the run
  assert result["stopped_early"] and result["best_step"] == 2 and result["step"] == 6
  assert result["dev"]["accuracy"] == pytest.approx(result["best_score"])
  best = f"{result['best_score']:.4g}"
  assert (f"early stopping at step 6 of 8: 2 evaluation(s) without a better dev accuracy than {best} (step 2)"
          in capsys.readouterr().out)
  assert trainer.summary(config, str(tmp_path), result).startswith(
      f"done: stopped early at step 6 of 8 (best dev accuracy {best} at step 2) | dev accuracy {best}")


def test_paused_and_sigterm_stopped_runs_continue_exactly(sst2_run, tmp_path, monkeypatch, capsys):
  """A run paused at step 1 (as a sweep pauses), continued by the CLI, stopped there by SIGTERM (sent while
  step 2's row is written: saved at step 3, exit 143), and continued again by the same command ends with
  the parameters and dev results of the run that was never stopped."""
  data, _, overrides = sst2_run
  overrides = overrides + [f"--config.data.data_dir={data}", "--config.train.epochs=1",
                           "--config.data.train_limit=64", "--config.train.keep_best=false",
                           "--config.train.log_every_steps=1"]
  config = load_config("configs/glue.py:sst2", overrides)
  straight = trainer.finetune(config, str(tmp_path / "straight"))
  paused = trainer.start(config, str(tmp_path / "paused"))
  paused.advance(1)
  paused.pause()
  command = ["finetune", "--config", "configs/glue.py:sst2", "--workdir", str(tmp_path / "paused"), *overrides]
  log_train = metrics.MetricsLogger.log_train

  def terminate_at_2(self, step, *args, **kwargs):
    row = log_train(self, step, *args, **kwargs)
    if step == 2:
      os.kill(os.getpid(), signal.SIGTERM)
    return row

  capsys.readouterr()
  with monkeypatch.context() as m:
    m.setattr(metrics.MetricsLogger, "log_train", terminate_at_2)
    assert cli.main(command) == 143
  out = capsys.readouterr().out
  assert f"resumed from {tmp_path}/paused/state/1" in out and "SIGTERM: saved a checkpoint at step 3" in out
  assert f"stopped at step 3/4 by SIGTERM | train state in {tmp_path}/paused/state" in out, out
  assert cli.main(command) == 0
  assert f"resumed from {tmp_path}/paused/state/3" in capsys.readouterr().out
  with open(tmp_path / "paused" / "eval_results.json") as f:
    assert json.load(f) == straight["dev"]
  a, _ = trainer.checkpoint.load_params(tmp_path / "straight")
  b, _ = trainer.checkpoint.load_params(tmp_path / "paused")
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-6), a, b)
  assert not os.path.exists(tmp_path / "paused" / "state")


def test_a_finished_run_says_so_and_restarts_only_when_asked(sst2_run, tmp_path, capsys):
  data, workdir, overrides = sst2_run
  run = tmp_path / "run"
  shutil.copytree(workdir, run)
  before = (run / "metrics.jsonl").read_bytes()
  finished = json.loads((run / "finished.json").read_text())
  command = ["finetune", "--config", "configs/glue.py:sst2", "--workdir", str(run), *overrides]
  assert cli.main(command) == 0
  out = capsys.readouterr().out
  assert (f"{run}: this run finished at step 64 of 64 (best dev accuracy {finished['best_score']:.4g} at step "
          f"{finished['best_step']}); nothing to train" in out), out
  assert "--config.train.restart=true" in out and "step 4/64" not in out
  assert (run / "metrics.jsonl").read_bytes() == before
  assert cli.main(command + ["--config.train.restart=true", "--config.train.epochs=1",
                             "--config.data.train_limit=64"]) == 0
  assert f"the finished run's files are now in {run}/previous-1" in capsys.readouterr().out
  assert (run / "previous-1" / "metrics.jsonl").read_bytes() == before
  assert json.loads((run / "finished.json").read_text())["num_steps"] == 4


def test_divergence_stops_a_finetuning_run(sst2_run, tmp_path):
  data, _, overrides = sst2_run
  config = load_config("configs/glue.py:sst2", overrides + [
      f"--config.data.data_dir={data}", "--config.train.epochs=1", "--config.data.train_limit=64",
      "--config.train.eval_every_steps=2"])
  run = trainer.start(config, str(tmp_path))
  step = run.setup.train_step

  def poisoned(state, batch, rng):  # step 3 reports a non-finite loss
    state, metrics = step(state, batch, rng)
    return state, {**metrics, "finite": metrics["finite"] & (state.step != 3)}

  run.setup.train_step = poisoned
  with pytest.raises(finite.TrainingDiverged, match=r"not finite at step 3; .*the latest checkpoint, step 2, is "
                                                    r"finite"):
    run.advance()
  assert run.progress.best_step == 2


@slow  # an end-to-end chain; its parts are tested in the suite (BERT_JAX_SLOW_TESTS=1)
def test_sweep_halves_and_reports(sst2_run, tmp_path):
  data, _, overrides = sst2_run
  config = load_config("configs/glue.py:sst2", overrides + [
      f"--config.data.data_dir={data}", "--config.sweep.learning_rates=(3e-3, 1e-9)",
      "--config.sweep.batch_sizes=(16,)", "--config.sweep.epochs=(4.0,)", "--config.sweep.seeds=(0, 1)",
      "--config.sweep.min_fraction=0.5", "--config.sweep.eta=2"])
  table = sweep.sweep(config, str(tmp_path))["table"]
  with open(tmp_path / "sweep_results.json") as f:
    results = json.load(f)
  fractions = {r["setting"]: r["fraction"] for r in results["settings"]}
  assert fractions == {"lr0.003_bs16_ep4": 1.0, "lr1e-09_bs16_ep4": 0.5}  # the useless rate stopped early
  assert all(r["dev_loss"] > 0 for r in results["settings"])  # read back from each run's best evaluation
  assert "lr0.003_bs16_ep4" in table.splitlines()[1] and "significance test" in table
  assert os.path.exists(tmp_path / "lr0.003_bs16_ep4" / "seed1" / "eval_results.json")
  assert os.path.exists(tmp_path / "lr1e-09_bs16_ep4" / "seed0" / "state")  # paused, not finished


# The audit's case (issue 16): at the first rung every learning rate sits at the majority class
# (0.516), and grid order kept lr 1e-4, dropping 3e-3, the only rate that went on to learn (1.0).
AUDIT_GRID = [sweep.Setting(lr, 32, 3.0) for lr in (1e-4, 3e-4, 1e-3, 3e-3)]


def _rung(losses):
  return {s: {"scores": [0.516] * 3, "losses": [loss] * 3, "fraction": 0.25} for s, loss in zip(AUDIT_GRID, losses)}


def test_halving_breaks_ties_by_dev_loss_then_diversity():
  learning = _rung([0.693, 0.692, 0.690, 0.652])  # lr 3e-3 already lowers the dev loss
  assert sweep.survivors(learning, AUDIT_GRID, 2) == [AUDIT_GRID[3], AUDIT_GRID[2]]
  assert sweep.survivors(learning, AUDIT_GRID, 1) == [AUDIT_GRID[3]]
  # losses tied too (or a task without one): keep the ends of the grid, not its first two entries
  for losses in ([0.693] * 4, [float("nan")] * 4):
    kept = sweep.survivors(_rung(losses), AUDIT_GRID, 2)
    assert sorted(kept, key=AUDIT_GRID.index) == [AUDIT_GRID[0], AUDIT_GRID[3]]
  # a better score still wins over a lower loss
  better = {**learning, AUDIT_GRID[0]: {"scores": [0.6] * 3, "losses": [0.9] * 3, "fraction": 0.25}}
  assert sweep.survivors(better, AUDIT_GRID, 2) == [AUDIT_GRID[0], AUDIT_GRID[3]]
  # three of five tied settings on a 2-D grid: each next one the farthest from those kept
  grid = [sweep.Setting(lr, b, 3.0) for lr, b in [(1e-4, 16), (1e-4, 32), (1e-3, 16), (1e-3, 32), (3e-4, 16)]]
  tied = {s: {"scores": [0.5], "losses": [0.7], "fraction": 0.25} for s in grid}
  kept = sweep.survivors(tied, grid, 3)
  assert len(set(kept)) == 3 and {kept[0], kept[1]} in ({grid[0], grid[3]}, {grid[1], grid[2]})


def test_welch_on_tied_scores_is_undefined_with_why():
  test = sweep.compare([0.516] * 3, [0.516] * 3)
  assert test["welch_p"] is None and "no variance" in test["welch_undefined"]
  assert test["permutation_p"] == pytest.approx(1.0)
  rows = sweep.summarize({AUDIT_GRID[0]: {"scores": [0.516] * 3, "fraction": 1.0},
                          AUDIT_GRID[3]: {"scores": [0.516] * 3, "fraction": 1.0}})
  line = sweep.format_table(rows, test).splitlines()[-1]
  assert "Welch's t-test undefined" in line and "nan" not in line
  assert sweep.compare([0.5, 0.5], [0.7, 0.7])["welch_p"] is None  # scipy: t = -inf, p = 0


def test_sweep_statistics():
  rows = sweep.summarize({sweep.Setting(1e-3, 16, 1.0): {"scores": [0.8, 0.9, 1.0], "fraction": 1.0}})
  assert rows[0]["mean"] == pytest.approx(0.9) and rows[0]["std"] == pytest.approx(0.1)
  test = sweep.compare([0.80, 0.82, 0.81, 0.83], [0.70, 0.71, 0.69, 0.72])
  assert test["welch_p"] < 0.001 and test["permutation_p"] == pytest.approx(2 / 70)  # exact: 2 of C(8, 4)
  assert sweep.rung_fractions(0.25, 2) == [0.25, 0.5, 1.0]


# SQuAD v2 and NER end to end (their eval_results.json and written predictions): test_finetune_predict.py's
# test_squad_answers_match_dev_predictions and test_ner_tags_match_dev_predictions run the same tiny tasks.
