"""Two local processes joined by jax.distributed (gloo CPU collectives) equal one process."""
import json
import os
import socket
import subprocess
import sys

import numpy as np

from core_helpers import slow, xla_flags

COMMON = ["pretrain", "--config", "configs/bert.py:demo", "--config.data.max_seq_length=64",
          "--config.data.max_predictions_per_seq=10", "--config.train.batch_size=16",
          "--config.train.log_every_steps=1", "--config.train.eval_every_steps=0",
          "--config.data.shuffle_buffer=200", "--config.train.num_steps=4",
          "--config.train.tensorboard=false",  # no TensorBoard writer: clu's writers import Keras (~3 s a process)
          "--config.checkpoint.every_steps=4"]


def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _launch(workdir, extra, devices_per_process, command=COMMON):
  env = dict(os.environ, XLA_FLAGS=xla_flags(devices_per_process))
  return subprocess.Popen([sys.executable, "-m", "bert_jax.cli", *command, "--workdir", workdir, *extra],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)


def _losses(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line)["loss"] for line in f if '"eval"' not in line]


def _two_and_one(tmp_path, command=COMMON):
  """Runs `command` as two processes (workdir multi) and as one (single); returns their outputs."""
  port = _free_port()
  multi = [_launch(str(tmp_path / "multi"), ["--coordinator-address", f"127.0.0.1:{port}",
                                             "--num-processes", "2", "--process-id", str(i)], 1, command)
           for i in range(2)]
  single = _launch(str(tmp_path / "single"), [], 1, command)
  outputs = [p.communicate(timeout=600)[0].decode() for p in multi + [single]]
  for proc, out in zip(multi + [single], outputs):
    assert proc.returncode == 0, out[-4000:]
  return outputs


def test_two_processes_equal_one(tmp_path):
  """With micro-batches: each process sums its two micro-batches' gradients, then one all-reduce
  across the processes (training/accumulate.py); dropout draws what one process draws for those
  micro-batches."""
  small = ["--config.model.num_layers=1", "--config.model.hidden_size=32", "--config.model.num_heads=2",
           "--config.model.intermediate_size=64"]
  outputs = _two_and_one(tmp_path, COMMON + small + ["--config.train.grad_accum_steps=2"])
  assert "step 4/4" in outputs[0] and "step 4/4" not in outputs[1]  # only process 0 reports
  np.testing.assert_allclose(_losses(tmp_path / "multi"), _losses(tmp_path / "single"), rtol=1e-5)
  saved = set(os.listdir(tmp_path / "multi" / "checkpoints" / "4" / "data"))
  assert {"data_state.process00000.json", "data_state.process00001.json"} <= saved


@slow
def test_general_distillation_on_two_processes_equals_one(tmp_path):
  """`bert-jax distill` of a general-* config across two processes: process 0 alone writes the student's
  init (every other layer of the teacher) while process 1 waits for it, and the run equals one process."""
  teacher = str(tmp_path / "teacher")
  done = subprocess.run([sys.executable, "-m", "bert_jax.cli", *COMMON[:-2], "--config.train.num_steps=2",
                         "--config.checkpoint.every_steps=2", "--workdir", teacher], capture_output=True, text=True,
                        timeout=600, check=False)
  assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
  distill = ["distill", "--config", "configs/distill.py:general-tiny", f"--config.distill.teacher={teacher}",
             *COMMON[3:]]
  outputs = _two_and_one(tmp_path, distill)
  assert "step 4/4" in outputs[0] and "step 4/4" not in outputs[1]
  taught = _losses(tmp_path / "multi")
  np.testing.assert_allclose(taught, _losses(tmp_path / "single"), rtol=1e-5)
  for run in ("multi", "single"):
    config = json.load(open(tmp_path / run / "student_init" / "config.json"))
    assert config["model"]["num_layers"] == 1  # the demo teacher's 2 layers, every other one
