"""Test setup: 8 host CPU devices for mesh tests (set before JAX starts), TF kept off accelerators, and one
persistent XLA compilation cache per session, shared by the xdist workers, so that runs differing only in
workdir or seed (and the processes tests start, which inherit it) compile each program once. It works on JAX
0.10's CPU backend: in one worker of six heavy files (faults, mtdnn, qbert, ranking, finetune_predict, pretrain;
2026-11-29) 16 cache hits saved 41 s of 53 s of compiling. Programs compiled in under 0.5 s are not cached: there
they were 32 of 52 compiles but 4.5 s in all, so a lower threshold has little to win."""
import fcntl
import os
import shutil
import subprocess
import sys

import pytest

from core_helpers import xla_flags

os.environ.setdefault("XLA_FLAGS", xla_flags(8))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

_EMBEDDED_BUILD = pytest.StashKey[subprocess.Popen]()


def pytest_sessionstart(session):
  """Under xdist the controller, idle while its workers start and collect, builds the embedded corpus and
  vocabulary in a background process when the cache lacks them (a fresh BERT_JAX_CACHE, as in CI: ~30 s of one
  core). A worker that needs them sooner waits on embedded.build_once's lock instead of building a second copy."""
  if getattr(session.config.option, "numprocesses", None) and not os.environ.get("PYTEST_XDIST_WORKER"):
    code = "from bert_jax.data_pipelines import embedded; embedded.ensure_embedded()"
    session.config.stash[_EMBEDDED_BUILD] = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def pytest_sessionfinish(session):
  build = session.config.stash.get(_EMBEDDED_BUILD, None)
  if build is not None:
    build.wait()


def _shared_tmp(tmp_path_factory):
  """This run's temporary folder that every xdist worker sees (the workers' folders share a parent)."""
  base = tmp_path_factory.getbasetemp()
  return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session", autouse=True)
def compilation_cache(tmp_path_factory):
  import jax  # pylint: disable=import-outside-toplevel
  directory = str(_shared_tmp(tmp_path_factory) / "xla_cache")
  os.makedirs(directory, exist_ok=True)
  options = {"jax_compilation_cache_dir": directory, "jax_persistent_cache_min_compile_time_secs": 0.5}
  previous = {k: getattr(jax.config, k) for k in options}
  names = ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS")
  saved_env = {k: os.environ.get(k) for k in names}
  for k, v in options.items():
    jax.config.update(k, v)
  os.environ.update(JAX_COMPILATION_CACHE_DIR=directory, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0.5")
  yield directory
  for k, v in previous.items():
    jax.config.update(k, v)
  for k, v in saved_env.items():
    if v is None:
      os.environ.pop(k, None)
    else:
      os.environ[k] = v


# The learnable sst2-format task (tests/data_fixtures.py: the label is written in the first word) at tiny
# sizes: 2 layers of width 32, length 32, batch 16, 4 epochs of 16 steps, a dev evaluation each epoch.
SST2_TEACHER = ["--config.model.num_layers=2", "--config.model.hidden_size=32", "--config.model.num_heads=2",
                "--config.model.intermediate_size=64", "--config.model.max_position_embeddings=32",
                "--config.data.max_seq_length=32", "--config.train.batch_size=16",
                "--config.train.eval_batch_size=32", "--config.train.log_every_steps=4",
                "--config.optimizer.learning_rate=3e-3", "--config.train.tensorboard=false", "--config.train.epochs=4"]


@pytest.fixture(scope="session")
def sst2_finetuned(tmp_path_factory):
  """One fine-tuned model of the first-word sst2 task for the tests that need one (fine-tuning's own,
  compression's teacher): (data_dir, workdir, the overrides of its run, data_dir included). Shared by the
  xdist workers of a run, so read it only: tests write into their own tmp_path."""
  import data_fixtures  # pylint: disable=import-outside-toplevel
  from bert_jax import cli  # pylint: disable=import-outside-toplevel
  root = _shared_tmp(tmp_path_factory) / "sst2-finetuned"  # built once per run, by whichever worker asks first
  root.mkdir(exist_ok=True)
  data, workdir = str(root / "data"), str(root / "workdir")
  overrides = SST2_TEACHER + [f"--config.data.data_dir={data}"]
  with open(root / "lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)  # the other worker waits here while the first one builds
    if not (root / "built").exists():
      shutil.rmtree(workdir, ignore_errors=True)  # what a failed build in the other worker left
      data_fixtures.write_first_word_sst2(data, n_dev=64)
      assert cli.main(["finetune", "--config", "configs/glue.py:sst2", "--workdir", workdir, *overrides]) == 0
      (root / "built").write_text("ok")
  return data, workdir, overrides
