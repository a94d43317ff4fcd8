"""Test setup: 8 host CPU devices for mesh tests (set before JAX starts), TF kept off accelerators, and one
persistent XLA compilation cache per session, so that runs differing only in workdir or seed (and the
processes tests start, which inherit it) compile each program once."""
import os

import pytest

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("JAX_PLATFORMS", "cpu")


@pytest.fixture(scope="session", autouse=True)
def compilation_cache(tmp_path_factory):
  import jax  # pylint: disable=import-outside-toplevel
  directory = str(tmp_path_factory.mktemp("xla_cache"))
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
