"""The workdir layer: a gs:// workdir stays a URL all the way to orbax and the files (a fake bucket in
memory stands in for GCS), and params checkpoints restore straight into the target's shardings."""
import io
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
import pytest
from etils import epath
from fsspec.implementations.memory import MemoryFileSystem
from jax.sharding import NamedSharding, PartitionSpec

from bert_jax import params_checkpoint, workdir
from bert_jax.errors import UserError
from bert_jax.training import checkpoint, metrics, trainer
from core_helpers import xla_flags


class _Bucket(MemoryFileSystem):
  """gs://bucket/key as /bucket/key in memory: what gcsfs is to epath, without a network."""
  protocol = ("gs", "gcs")
  store: dict = {}
  pseudo_dirs = [""]

  @classmethod
  def _strip_protocol(cls, path):
    return super()._strip_protocol(str(path).replace("gs://", "/", 1))


def _clear_caches():
  """epath decides TF or fsspec once per process, and the bucket check answers once per bucket."""
  epath.gpath._is_tf_installed.cache_clear()  # pylint: disable=protected-access
  epath.backend.fsspec_backend._get_filesystem.cache_clear()  # pylint: disable=protected-access
  workdir._check_bucket.cache_clear()  # pylint: disable=protected-access


@pytest.fixture
def bucket(monkeypatch, tmp_path):
  """epath's gs:// goes through fsspec to the in-memory bucket; the working directory is empty."""
  monkeypatch.setenv("EPATH_USE_TF", "false")
  for name in _Bucket.protocol:
    monkeypatch.setitem(sys.modules["fsspec.registry"]._registry, name, _Bucket)  # pylint: disable=protected-access
  _clear_caches()
  _Bucket.store.clear()
  monkeypatch.chdir(tmp_path)
  yield _Bucket()
  _clear_caches()
  assert not os.listdir(tmp_path), "a local folder appeared for a gs:// path"


def test_paths_stay_urls_and_local_paths_become_absolute(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert os.fspath(workdir.path("gs://b/run")) == "gs://b/run"
  assert os.fspath(workdir.path("gs://b/run") / "checkpoints") == "gs://b/run/checkpoints"
  assert os.fspath(workdir.path("runs/x")) == str(tmp_path / "runs" / "x")


def test_run_files_go_to_the_bucket(bucket):
  run = workdir.path("gs://b/run")
  vocab = workdir.path("gs://b/vocab/vocab.txt")
  vocab.parent.mkdir(parents=True, exist_ok=True)
  vocab.write_text("[PAD]\n[UNK]\n")
  config = ml_collections.ConfigDict({"data": {"vocab": "gs://b/vocab/vocab.txt"}, "model": {"x": 1}})
  trainer._write_run_files(config, run, os.fspath(vocab))  # pylint: disable=protected-access
  assert json.loads(bucket.cat("gs://b/run/config.json"))["data"]["vocab"] == "vocab.txt"
  assert bucket.cat("gs://b/run/vocab.txt") == b"[PAD]\n[UNK]\n"
  assert workdir.read_config("gs://b/run/checkpoints/7") == {"data": {"vocab": "vocab.txt"}, "model": {"x": 1}}
  assert workdir.vocab_file("gs://b/run", workdir.read_config("gs://b/run")) == run / "vocab.txt"
  logger = metrics.MetricsLogger(run, num_steps=2, start_step=0, tensorboard=False)
  for step in (1, 2):
    logger.log_train(step, [{"loss": jnp.float32(step), "learning_rate": jnp.float32(0.1)}], 8)
  logger.log_eval(2, {"loss": 0.5})
  logger.close()
  rows = [json.loads(line) for line in bucket.cat("gs://b/run/metrics.jsonl").decode().splitlines()]
  assert [(r["step"], r.get("eval", False), r["loss"]) for r in rows] == [(1, False, 1.0), (2, False, 2.0),
                                                                          (2, True, 0.5)]


def test_checkpointer_hands_orbax_the_url(bucket, monkeypatch):
  seen = []
  monkeypatch.setattr(ocp, "CheckpointManager", lambda directory, **kw: seen.append(directory))
  cfg = ml_collections.ConfigDict({"keep": 1, "async_save": False})
  checkpoint.Checkpointer.for_pretraining("gs://b/run", cfg)
  assert [os.fspath(d) for d in seen] == ["gs://b/run/checkpoints"]


def _tree(scale):
  return {"encoder": {"kernel": np.arange(16, dtype=np.float32).reshape(8, 2) * scale},
          "head": {"bias": np.full(8, scale, np.float32)}}


def test_load_params_into_restores_into_shardings(tmp_path, capsys):
  params_checkpoint.save_params(tmp_path / "ckpt", _tree(2.0), {"model": {}})
  mesh = jax.make_mesh((8,), ("data",))
  split = NamedSharding(mesh, PartitionSpec("data"))
  fresh = jax.device_put({**_tree(1.0), "new": {"w": np.ones(8, np.float32)}}, split)
  loaded = params_checkpoint.load_params_into(tmp_path / "ckpt", fresh, keep=("encoder", "new"))
  np.testing.assert_array_equal(loaded["encoder"]["kernel"], _tree(2.0)["encoder"]["kernel"])
  assert loaded["encoder"]["kernel"].sharding == split
  # "head": not kept; "new": not in the checkpoint
  assert loaded["head"]["bias"] is fresh["head"]["bias"] and loaded["new"]["w"] is fresh["new"]["w"]
  assert "no weights for ['new']" in capsys.readouterr().out
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, jnp.bfloat16, sharding=split), _tree(1.0))
  restored = params_checkpoint.load_params_into(tmp_path / "ckpt", abstract)
  assert restored["head"]["bias"].dtype == jnp.bfloat16 and restored["head"]["bias"].sharding == split
  np.testing.assert_array_equal(np.asarray(restored["head"]["bias"], np.float32), [2.0] * 8)
  wrong = {"encoder": {"kernel": jax.ShapeDtypeStruct((8, 3), jnp.float32)}}
  with pytest.raises(UserError, match=r"checkpoint \(8, 2\) vs model \(8, 3\)"):
    params_checkpoint.load_params_into(tmp_path / "ckpt", wrong)


def test_load_params_reads_a_checkpoint_of_other_devices(tmp_path):
  """A train state saved sharded over this process's 8 devices (a pod's checkpoint, in small) loads with
  load_params, params only, as NumPy, in a process with one device."""
  split = NamedSharding(jax.make_mesh((8,), ("data",)), PartitionSpec("data"))
  state = {"params": jax.device_put(_tree(3.0), split), "opt_state": jax.device_put(np.ones(8, np.float32), split)}
  with ocp.StandardCheckpointer() as ckptr:
    ckptr.save(tmp_path / "run" / "checkpoints" / "5" / "state", state)
  workdir.write_json(tmp_path / "run" / "config.json", {"model": {}})
  code = ("import sys, numpy as np; from bert_jax import params_checkpoint; import jax; assert jax.device_count() == 1;"
          "p, _ = params_checkpoint.load_params(sys.argv[1]); print(sorted(p), type(p['head']['bias']).__name__,"
          "float(p['encoder']['kernel'].sum()))")
  env = dict(os.environ, XLA_FLAGS=xla_flags(1), JAX_PLATFORMS="cpu")
  done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "run")], capture_output=True, text=True,
                        env=env, timeout=300, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  assert done.stdout.split("\n")[-2] == f"['encoder', 'head'] ndarray {3.0 * sum(range(16))}"


def test_url_files_read_by_line_through_tf_gfile(tmp_path):
  """The corpus reader's readline(size) and seek on a file that TF's gfile opens (the client real
  buckets use by default), here on a local file."""
  from bert_jax.data_pipelines import tftools  # pylint: disable=import-outside-toplevel
  (tmp_path / "c.txt").write_bytes(b"first line\nsecond\n\nthird")
  raw = tftools._RawURLFile(tftools.tf().io.gfile.GFile(str(tmp_path / "c.txt"), "rb"))  # pylint: disable=protected-access
  with io.BufferedReader(raw) as f:
    assert f.readline(5) == b"first" and f.readline(100) == b" line\n" and f.tell() == 11
    f.seek(18)
    assert list(f) == [b"\n", b"third"]
