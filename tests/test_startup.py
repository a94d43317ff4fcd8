"""What a process does before it trains: multi-host start-up, quiet defaults, and the memory estimate.

The libtpu cases need libtpu (the `[tpu]` extra; the `[test]` extra brings it) and skip without it: with
no libtpu installed there is no noise to quiet and no TPU variables to inherit.
"""
import importlib.util
import logging
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from bert_jax import params_checkpoint
from bert_jax.cli import main
from bert_jax.errors import UserError
from bert_jax.training import checkpoint, distributed, memory
from bert_jax.training.step import build_train_setup
from core_helpers import TINY, random_batch, tiny_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
needs_libtpu = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                  reason="libtpu is not installed (pip install 'bert_jax[tpu]')")
# What libtpu leaves in the environment when it loads on a machine without a TPU.
LIBTPU_FILLS = {"TPU_WORKER_ID": "WARNING: could not determine TPU worker number, please set env var",
                "CLOUD_TPU_TASK_ID": "WARNING: could not determine TPU worker number, please set env var",
                "TPU_WORKER_HOSTNAMES": "WARNING: could not determine TPU worker hostnames or IP addresses",
                "TPU_ACCELERATOR_TYPE": "WARNING: could not determine TPU accelerator type"}
# libtpu's start-up errors on a machine without a TPU.
NOISE = ("Failed to find host bounds", "Logging before InitGoogle", "unexpected worker hostname")


def _clean_env(**extra):
  env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", *LIBTPU_FILLS)}
  return {**env, "PYTHONPATH": ROOT, **extra}


@pytest.mark.parametrize("env,several_hosts", [
    (LIBTPU_FILLS, False),  # what a notebook's commands inherit once its kernel has loaded libtpu
    ({"TPU_WORKER_HOSTNAMES": "t1v-0,t1v-1,t1v-2,t1v-3"}, True),
    ({"TPU_WORKER_HOSTNAMES": "localhost"}, False),
    ({"TPU_ACCELERATOR_TYPE": "v4-32"}, True),
    ({"TPU_ACCELERATOR_TYPE": "v5litepod-8"}, False),
    ({"MEGASCALE_COORDINATOR_ADDRESS": "10.0.0.2"}, True),
    ({"CLOUD_TPU_TASK_ID": "3"}, True),
])
def test_multi_host_start_up_needs_a_tpu_here_and_several_hosts_named(monkeypatch, env, several_hosts):
  for name in (*LIBTPU_FILLS, "TPU_PROCESS_ADDRESSES", "MEGASCALE_COORDINATOR_ADDRESS"):
    monkeypatch.delenv(name, raising=False)
  for name, value in env.items():
    monkeypatch.setenv(name, value)
  assert distributed.slice_has_several_hosts() == several_hosts
  monkeypatch.setattr(distributed, "tpu_allowed", lambda: True)
  monkeypatch.setattr(distributed, "tpu_attached", lambda: True)
  assert distributed.on_tpu_vm() == several_hosts  # a real worker of a slice
  monkeypatch.setattr(distributed, "tpu_attached", lambda: False)
  assert not distributed.on_tpu_vm()  # the same variables on a machine with no TPU
  monkeypatch.setattr(distributed, "tpu_attached", lambda: True)
  monkeypatch.setattr(distributed, "tpu_allowed", lambda: False)
  assert not distributed.on_tpu_vm()  # JAX_PLATFORMS=cpu


def test_tpu_allowed_reads_the_platform_list():
  before = jax.config.jax_platforms  # read when backends start: changing it here touches nothing else
  try:
    for platforms, allowed in (("cpu", False), ("cuda,cpu", False), ("tpu,cpu", True), ("", True)):
      jax.config.update("jax_platforms", platforms)
      assert distributed.tpu_allowed() == allowed, platforms
  finally:
    jax.config.update("jax_platforms", before)


def test_initialize_joins_no_job_on_a_machine_without_a_tpu(monkeypatch):
  """The notebook's crash: its kernel had loaded libtpu, so each `bert-jax` command inherited libtpu's
  fills and called jax.distributed.initialize ("coordinator_address should be defined")."""
  def join(**kwargs):
    raise AssertionError(f"jax.distributed.initialize({kwargs}) on a machine without a TPU")
  monkeypatch.setattr(jax.distributed, "initialize", join)
  monkeypatch.setattr(distributed, "tpu_allowed", lambda: True)  # no JAX_PLATFORMS, as in the notebook
  for name, value in {**LIBTPU_FILLS, "TPU_WORKER_HOSTNAMES": "t1v-0,t1v-1", "TPU_ACCELERATOR_TYPE": "v4-16"}.items():
    monkeypatch.setenv(name, value)
  assert not distributed.tpu_attached()  # this machine (the test suite runs on CPUs)
  distributed.initialize()


@needs_libtpu
def test_commands_start_quietly_on_a_cpu_machine_with_libtpu_and_tpu_variables():
  """A command with no JAX_PLATFORMS, libtpu installed, no TPU, and the TPU variables a notebook's kernel
  leaves behind: no libtpu start-up lines, exit 0. The same machine's plain `jax.devices()` prints them,
  so the test sees the noise it guards against. ALLOW_MULTIPLE_LIBTPU_LOAD: libtpu skips its machine-wide
  lock file, which another process holding it would otherwise make libtpu quiet about."""
  env = _clean_env(ALLOW_MULTIPLE_LIBTPU_LOAD="1")
  noisy = subprocess.run([sys.executable, "-c", "import jax; jax.devices()"], env=env, capture_output=True,
                         text=True, timeout=300)
  assert any(n in noisy.stderr for n in NOISE), noisy.stderr
  command = [sys.executable, "-m", "bert_jax.cli", "info", "--config", "configs/bert.py:tiny", *TINY]
  quiet = subprocess.run(command, env={**env, **LIBTPU_FILLS}, cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert quiet.returncode == 0 and "num_params" in quiet.stdout, quiet.stderr
  assert quiet.stderr == ""
  # A library user (a benchmark, a notebook) importing a jax-using subpackage before jax itself.
  library = subprocess.run([sys.executable, "-c", "import bert_jax.training.benchmark, jax; print(jax.devices())"],
                           env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert library.returncode == 0 and "CpuDevice" in library.stdout, library.stderr
  assert not any(n in library.stderr for n in NOISE), library.stderr


def test_reading_a_workdirs_params_logs_no_checkpoint_metadata_warning(tmp_path, caplog):
  """A CheckpointManager keeps _CHECKPOINT_METADATA beside state/, not in it; reading state/'s tree
  through a Checkpointer warned once per read (twice per fine-tune from a pretraining workdir)."""
  params = {"encoder": {"kernel": np.arange(6, dtype=np.float32).reshape(2, 3)}}
  ckpt = checkpoint.Checkpointer(tmp_path / "checkpoints", keep=1, async_save=False, items=())
  ckpt.save(3, {"params": params, "step": np.int32(3)})
  ckpt.close()
  with caplog.at_level(logging.WARNING):
    shapes = params_checkpoint.params_metadata(tmp_path)
    tree_path, keys = params_checkpoint.params_location(tmp_path)
    restored = params_checkpoint._restore_on_host(tree_path, keys)  # pylint: disable=protected-access
  assert jax.tree.map(lambda s: s.shape, shapes) == {"encoder": {"kernel": (2, 3)}}
  np.testing.assert_array_equal(restored["encoder"]["kernel"], params["encoder"]["kernel"])
  assert not [r for r in caplog.records if "_CHECKPOINT_METADATA" in r.getMessage()]


@pytest.fixture(scope="module")
def tiny_setup():
  return build_train_setup(tiny_config("--config.train.batch_size=32"))


def test_the_memory_estimate_agrees_with_the_compiled_step(tiny_setup):
  """The estimate (state + gradients + the residuals of the loss's vjp, x1.1) against XLA's own count of
  the compiled step's arguments and temporaries, with the same abstract inputs."""
  est = memory.estimate(tiny_setup)
  batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in random_batch(batch=32).items()}
  compiled = tiny_setup.train_step.lower(tiny_setup.abstract_state, batch, jax.random.key(0)).compile()
  stats = compiled.memory_analysis()
  per_device = stats.argument_size_in_bytes + stats.temp_size_in_bytes  # of one device's program
  assert est.devices == len(jax.devices()) == 8 and est.rows == 32
  assert per_device <= est.per_device <= 1.6 * per_device
  params = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tiny_setup.abstract_state.params))
  assert 3 * params <= est.state <= 3 * params + 16 and est.gradients == params  # AdamW: params, mu, nu; steps


def test_a_step_that_cannot_fit_is_one_line_naming_what_fits(tiny_setup, monkeypatch):
  capacity = 2 ** 30
  monkeypatch.setattr(memory, "host_available_bytes", lambda: 2 * capacity)  # a host with 2 GiB free
  big = build_train_setup(tiny_config("--config.train.batch_size=65536"))
  made, estimate = [], memory.estimate  # the estimate check_fits makes (a trace of the step's backward pass)
  monkeypatch.setattr(memory, "estimate", lambda setup: made.append(estimate(setup)) or made[-1])
  with pytest.raises(UserError) as raised:
    memory.check_fits(big)
  message = str(raised.value)
  assert "\n" not in message and "GiB are available on this host" in message
  [est] = made
  assert est.rows == 65536 and est.accum == 1
  assert f"needs about {est.needed / 2 ** 30:.1f} GiB" in message
  # The fewest micro-batches whose estimate fits in 80% of the capacity, and the next fewer do not.
  accum = int(message.split("grad_accum_steps=")[1].split()[0])
  assert est.with_batch(65536, accum).needed <= 0.8 * 2 * capacity < est.with_batch(65536, accum // 2).needed
  monkeypatch.setattr(memory, "host_available_bytes", lambda: 16 * capacity)
  assert memory.check_fits(tiny_setup) is None  # 32 rows: a loose bound shows it fits, no trace


def test_pretrain_refuses_before_the_workdir_exists(tmp_path, capsys):
  workdir = tmp_path / "run"
  status = main(["pretrain", "--config", "configs/bert.py:tiny", *TINY, "--config.train.batch_size=4194304",
                 "--workdir", str(workdir)])
  err = capsys.readouterr().err.strip()
  assert status == 2 and len(err.splitlines()) == 1 and "needs about" in err and "grad_accum_steps=" in err
  assert not workdir.exists()
