"""End to end on the embedded corpus: learning, exact resume, SIGTERM, and the CLI's one-line errors."""
import json
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from bert_jax import cli
from bert_jax.training import checkpoint, metrics, trainer
from core_helpers import slow, xla_flags

FAST = ["--config.data.max_seq_length=64", "--config.data.max_predictions_per_seq=10",
        "--config.train.batch_size=16", "--config.train.log_every_steps=1",
        "--config.train.eval_every_steps=0", "--config.data.shuffle_buffer=200"]


def _config(*overrides):
  return trainer.load_run_config("configs/bert.py:demo", FAST + list(overrides))


def _train_rows(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  return [r for r in rows if not r.get("eval")]


@slow  # .ci/run checks the whole demo's learning (README command 1, tests/readme_demo_check.py)
def test_loss_falls_on_the_embedded_corpus(tmp_path):
  config = _config("--config.train.num_steps=60", "--config.optimizer.warmup_steps=10",
                   "--config.train.eval_every_steps=60", "--config.train.eval_steps=2")
  result = trainer.pretrain(config, str(tmp_path))
  losses = [r["loss"] for r in _train_rows(tmp_path)]
  assert len(losses) == 60
  assert np.mean(losses[-10:]) < np.mean(losses[:10]) - 1.0, losses
  assert result["eval"]["mlm_loss"] < losses[0] - 1.0
  for key in ("loss", "mlm_accuracy", "nsp_accuracy", "learning_rate", "grad_norm", "tokens_per_sec"):
    assert key in _train_rows(tmp_path)[-1]
  saved = json.load(open(tmp_path / "config.json"))
  assert saved["model"]["hidden_size"] == 128 and os.path.exists(tmp_path / saved["data"]["vocab"])


def test_ctrl_c_saves_and_the_same_command_resumes_exactly(tmp_path, monkeypatch, capsys):
  """Ctrl-C while step 2's row is written (rows every 2 steps): the run saves step 3, says so, exits 130;
  the same command resumes to the uninterrupted run's parameters and rows, and its first row, which
  averages step 4 alone, says so."""
  overrides = ["--config.train.num_steps=6", "--config.checkpoint.every_steps=100",
               "--config.train.log_every_steps=2", "--config.model.num_layers=1", "--config.model.hidden_size=32",
               "--config.model.num_heads=2", "--config.model.intermediate_size=64",
               "--config.train.tensorboard=false"]
  trainer.pretrain(_config(*overrides), str(tmp_path / "straight"))
  command = ["pretrain", "--config", "configs/bert.py:demo", "--workdir", str(tmp_path / "resumed"), *FAST,
             *overrides]
  log_train = metrics.MetricsLogger.log_train

  def interrupt_at_2(self, step, *args, **kwargs):
    row = log_train(self, step, *args, **kwargs)
    if step == 2:
      os.kill(os.getpid(), signal.SIGINT)
    return row

  with monkeypatch.context() as m:
    m.setattr(metrics.MetricsLogger, "log_train", interrupt_at_2)
    assert cli.main(command) == 130
  out = capsys.readouterr().out
  assert "Ctrl-C: saving a checkpoint at step 3" in out and "Ctrl-C: saved a checkpoint at step 3" in out, out
  assert f"stopped at step 3/6 by Ctrl-C | checkpoint {tmp_path / 'resumed'}/checkpoints/3" in out
  assert cli.main(command) == 0
  assert "step 4/6 (mean of the 1 steps since the resume at 3)" in capsys.readouterr().out
  straight, resumed = _train_rows(tmp_path / "straight"), _train_rows(tmp_path / "resumed")
  assert [r["step"] for r in resumed] == [2, 3, 4, 6]
  assert [r.get("averaged_steps") for r in resumed] == [None, None, 1, None] and resumed[2]["resumed"]
  np.testing.assert_allclose([resumed[0]["loss"], resumed[3]["loss"]], [straight[0]["loss"], straight[2]["loss"]],
                             rtol=1e-6)
  a, _ = checkpoint.load_params(str(tmp_path / "straight"))
  b, _ = checkpoint.load_params(str(tmp_path / "resumed"))
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-6), a, b)


@slow  # an end-to-end chain; its parts are tested in the suite (BERT_JAX_SLOW_TESTS=1)
def test_sigterm_leaves_a_checkpoint(tmp_path):
  workdir = tmp_path / "run"
  command = [sys.executable, "-m", "bert_jax.cli", "pretrain", "--config", "configs/bert.py:demo",
             "--workdir", str(workdir), *FAST, "--config.train.num_steps=100000",
             "--config.checkpoint.every_steps=100000"]
  env = dict(os.environ, XLA_FLAGS=xla_flags(1))
  proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
  deadline = time.time() + 240
  while time.time() < deadline and not (workdir / "metrics.jsonl").exists():
    time.sleep(0.5)
  assert (workdir / "metrics.jsonl").exists(), proc.communicate(timeout=5)[0].decode()[-3000:]
  proc.send_signal(signal.SIGTERM)
  output = proc.communicate(timeout=120)[0].decode()
  assert proc.returncode == 143, output[-3000:]
  steps = [int(d) for d in os.listdir(workdir / "checkpoints") if d.isdigit()]
  assert steps and max(steps) >= 1
  assert f"saved a checkpoint at step {max(steps)}" in output


@pytest.mark.parametrize("overrides, message", [
    (["--config.train.batch_sise=3"], "unknown config key 'train.batch_sise'"),
    (["--config.mesh.data=3"], "needs 3 devices but 8 are available"),
    (["--config.train.batch_size=12"], "divisible by data-parallel size"),
    (["--config.data.corpus=/nonexistent/dir/*.txt"], "/nonexistent/dir"),
    (["--config.model.vocab_size=1000"], "vocab"),
])
def test_cli_errors_are_one_line(tmp_path, capsys, overrides, message):
  code = cli.main(["pretrain", "--config", "configs/bert.py:demo", "--workdir", str(tmp_path),
                   *FAST, *overrides])
  err = capsys.readouterr().err.strip()
  assert code == 2
  assert message in err and len(err.splitlines()) == 1, err
  assert "Traceback" not in err


def test_cli_error_for_a_workdir_of_another_model(tmp_path, capsys):
  (tmp_path / "config.json").write_text(json.dumps(
      {"objective": "bert", "model": {**_config().model.to_dict(), "hidden_size": 256}}))
  code = cli.main(["pretrain", "--config", "configs/bert.py:demo", "--workdir", str(tmp_path), *FAST])
  err = capsys.readouterr().err.strip()
  assert code == 2 and "holds a checkpoint of a different model" in err and "hidden_size" in err, err
