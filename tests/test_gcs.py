"""Workdirs and corpora in a bucket, end to end against a GCS JSON API on 127.0.0.1 (gcp-storage-emulator,
started once for the module by tests/gcs_emulator.py): a pretraining run SIGKILLed after a checkpoint and
rerun ends with the losses and parameters of an uninterrupted run; fine-tuning from it (init_from) and
`convert` read and write there; no local `gs:` folder appears; a bucket that cannot be reached is one
line and exit 2, quickly.

orbax's arrays reach the emulator through tensorstore (TENSORSTORE_GCS_HTTP_URL), the workdir lock through
google-cloud-storage and every other file through etils.epath and gcsfs (both: STORAGE_EMULATOR_HOST;
epath: EPATH_USE_TF=false). TensorFlow's own GCS client cannot be pointed at an emulator, so these runs
write no TensorBoard events (train.tensorboard=false). The test reads the bucket back with its own gcsfs
client. Skipped where gcp-storage-emulator is not installed (the `test` extra has it, gcsfs and
google-cloud-storage).
"""
import json
import os
import subprocess
import sys
import tempfile
import time

import jax
import numpy as np
import pytest

pytest.importorskip("gcp_storage_emulator")

import gcsfs  # noqa: E402
from etils import epath  # noqa: E402

from bert_jax import cli, params_checkpoint, workdir  # noqa: E402
from bert_jax.data_pipelines import embedded  # noqa: E402
from bert_jax.training import trainer  # noqa: E402
from core_helpers import slow

_FSSPEC_REGISTRY = sys.modules["fsspec.registry"]._registry  # pylint: disable=protected-access  (fsspec.registry is read-only)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUCKET = "bert-jax-test"
MODEL = ["--config.model.num_layers=1", "--config.model.hidden_size=32", "--config.model.num_heads=2",
         "--config.model.intermediate_size=64", "--config.model.max_position_embeddings=32"]
PRETRAIN = [*MODEL, "--config.data.max_seq_length=32", "--config.data.max_predictions_per_seq=5",
            "--config.train.batch_size=8", "--config.train.log_every_steps=1", "--config.train.eval_every_steps=0",
            "--config.data.shuffle_buffer=100", "--config.train.num_steps=4", "--config.checkpoint.every_steps=2",
            "--config.checkpoint.async_save=false", "--config.train.tensorboard=false"]
FINETUNE = ["--config.data.max_seq_length=32", "--config.task.num_train=64", "--config.task.num_dev=32",
            "--config.train.batch_size=16", "--config.train.eval_batch_size=32", "--config.train.epochs=1",
            "--config.train.log_every_steps=2", "--config.train.tensorboard=false"]


@pytest.fixture(scope="module", autouse=True)
def compilation_cache(tmp_path_factory):
  """The killed run (another process), its rerun and the uninterrupted reference compile the same steps:
  compile them once."""
  directory = str(tmp_path_factory.mktemp("xla_cache"))
  options = {"jax_compilation_cache_dir": directory, "jax_persistent_cache_min_compile_time_secs": 0.0}
  previous = {k: getattr(jax.config, k) for k in options}
  for k, v in options.items():
    jax.config.update(k, v)
  yield {"JAX_COMPILATION_CACHE_DIR": directory, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
  for k, v in previous.items():
    jax.config.update(k, v)


@pytest.fixture(scope="module")
def emulator():
  """The emulator's URL; it runs (in memory, bucket BUCKET created) for this module's tests."""
  proc = subprocess.Popen([sys.executable, os.path.join(REPO, "tests", "gcs_emulator.py"), BUCKET],
                          stdout=subprocess.PIPE, text=True)
  try:
    yield f"http://127.0.0.1:{int(proc.stdout.readline())}"
  finally:
    proc.terminate()
    proc.wait(timeout=30)


def _clear_caches():
  """etils, fsspec and the bucket check remember the backend, the client and the answer per process."""
  epath.gpath._is_tf_installed.cache_clear()  # pylint: disable=protected-access
  epath.backend.fsspec_backend._get_filesystem.cache_clear()  # pylint: disable=protected-access
  gcsfs.core.GCSFileSystem.clear_instance_cache()
  workdir._check_bucket.cache_clear()  # pylint: disable=protected-access


def _no_gs_folder(*roots):
  for root in roots:
    for directory, names, _ in os.walk(root):
      assert "gs:" not in names, f"a local folder {directory}/gs: appeared"


@pytest.fixture
def bucket_env(emulator, compilation_cache, monkeypatch, tmp_path):
  """This process and its children reach the emulator; cwd and TMPDIR are empty folders, checked after."""
  env = {"EPATH_USE_TF": "false", "STORAGE_EMULATOR_HOST": emulator, "TENSORSTORE_GCS_HTTP_URL": emulator,
         "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulator",  # tensorstore: no credential search
         # gcsfs (read at its import): no bucket-type lookups over gRPC, which the emulator does not serve
         "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
         "TMPDIR": str(tmp_path / "tmp"), "PYTHONPATH": REPO, **compilation_cache}
  (tmp_path / "tmp").mkdir()
  for key, value in env.items():
    monkeypatch.setenv(key, value)
  # In this process gcsfs is imported already: epath's gs:// gets its plain client, whatever gcsfs chose
  # at import (or another test registered).
  for protocol in ("gs", "gcs"):
    monkeypatch.setitem(_FSSPEC_REGISTRY, protocol, gcsfs.core.GCSFileSystem)
  monkeypatch.setattr(tempfile, "tempdir", None)
  monkeypatch.chdir(tmp_path)
  _clear_caches()
  yield env
  _clear_caches()
  _no_gs_folder(tmp_path, REPO)


@pytest.fixture
def bucket(emulator):
  """The test's own view of the bucket: a gcsfs client without listing caches."""
  return gcsfs.core.GCSFileSystem(endpoint_url=emulator, token="anon", cache_timeout=0, skip_instance_cache=True)


def _rows(text):
  """Train losses by step; a step logged twice (before a kill and again after resuming) keeps the last."""
  return {r["step"]: r["loss"] for r in map(json.loads, text.splitlines()) if not r.get("eval")}


def _pretrain_args(workdir_url, data):
  return ["pretrain", "--config", "configs/bert.py:demo", "--workdir", workdir_url, *PRETRAIN, *data]


@slow  # an end-to-end chain; its parts are tested in the suite (BERT_JAX_SLOW_TESTS=1)
def test_a_pretraining_run_in_a_bucket_resumes_after_sigkill_and_fine_tunes_from_there(bucket_env, bucket,
                                                                                       tmp_path, capsys):
  corpus, vocab = embedded.ensure_embedded()
  bucket.put(corpus, f"{BUCKET}/corpus/corpus.txt")
  bucket.put(vocab, f"{BUCKET}/corpus/vocab.txt")
  run = f"gs://{BUCKET}/run"
  args = _pretrain_args(run, [f"--config.data.corpus=gs://{BUCKET}/corpus/corpus.txt",
                              f"--config.data.vocab=gs://{BUCKET}/corpus/vocab.txt"])
  killed = subprocess.Popen([sys.executable, "-m", "bert_jax.cli", *args], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
  deadline = time.time() + 300
  # orbax marks a finished checkpoint in a bucket with commit_success.txt; after step 2's, the run still
  # has two steps and a synchronous save (seconds against the emulator) to go.
  while time.time() < deadline and killed.poll() is None and not bucket.exists(
      f"{BUCKET}/run/checkpoints/2/commit_success.txt"):
    time.sleep(0.25)
  killed.kill()
  output = killed.communicate(timeout=60)[0].decode()
  assert killed.returncode == -9, output[-3000:]
  # The killed run's lease on the workdir (run_lock.py) still runs, but it died on this machine: a rerun
  # takes it over at once instead of waiting LEASE_SECONDS.
  capsys.readouterr()
  assert cli.main(args) == 0  # the rerun
  output = capsys.readouterr().out
  assert f"{run}: the run that held it (host {os.uname().nodename}, pid {killed.pid}, started " in output
  assert f"resumed from {run}/checkpoints/2\n" in output, output[-3000:]
  # The same run, uninterrupted and local (after the others: their compilations are cached by now).
  straight = trainer.pretrain(trainer.load_run_config(
      "configs/bert.py:demo",
      PRETRAIN + [f"--config.data.corpus={corpus}", f"--config.data.vocab={vocab}"]), str(tmp_path / "straight"))
  assert straight["step"] == 4
  expected = _rows((tmp_path / "straight" / "metrics.jsonl").read_text())
  got = _rows(bucket.cat(f"{BUCKET}/run/metrics.jsonl").decode())
  assert sorted(got) == sorted(expected) == [1, 2, 3, 4]
  np.testing.assert_allclose([got[s] for s in expected], list(expected.values()), rtol=1e-5)
  assert json.loads(bucket.cat(f"{BUCKET}/run/config.json"))["data"]["vocab"] == "vocab.txt"
  assert bucket.cat(f"{BUCKET}/run/vocab.txt") == open(vocab, "rb").read()
  assert not bucket.glob(f"{BUCKET}/run/events.out.tfevents.*") and not bucket.exists(f"{BUCKET}/run/run.lock")
  a, _ = params_checkpoint.load_params(str(tmp_path / "straight"))
  b, _ = params_checkpoint.load_params(run)
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-6), a, b)
  _fine_tune_from(run, bucket)


def _fine_tune_from(pretrained: str, bucket):
  """Fine-tuning from the pretrained workdir in the bucket writes its own workdir there, which is a checkpoint:
  evaluating it again gives the same numbers."""
  ft = f"gs://{BUCKET}/ft"
  assert cli.main(["finetune", "--config", "configs/glue.py:embedded", "--workdir", ft, *FINETUNE,
                   f"--config.init_from={pretrained}"]) == 0
  files = {path[len(f"{BUCKET}/ft/"):] for path in bucket.find(f"{BUCKET}/ft")}
  assert {"config.json", "run_config.json", "vocab.txt", "metrics.jsonl", "eval_results.json",
          "predictions/EMBEDDED.dev.tsv"} <= files, sorted(files)
  assert any(f.startswith("params/") for f in files) and not any(f.startswith("state/") for f in files)
  assert bucket.cat(f"{BUCKET}/ft/vocab.txt") == bucket.cat(f"{BUCKET}/run/vocab.txt")
  results = json.loads(bucket.cat(f"{BUCKET}/ft/eval_results.json"))
  assert cli.main(["finetune", "--config", "configs/glue.py:embedded", "--workdir", f"{ft}-eval", *FINETUNE,
                   f"--config.init_from={ft}", "--config.eval_only=true"]) == 0
  assert json.loads(bucket.cat(f"{BUCKET}/ft-eval/eval_results.json")) == results


def test_convert_reads_and_writes_the_bucket(bucket_env, bucket, tmp_path):
  """HF (in the bucket) -> bert_jax (in the bucket) -> HF (in the bucket): the weights come back unchanged."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  from test_conversion_hf import build_hf  # pylint: disable=import-outside-toplevel
  model = build_hf("bert")
  model.save_pretrained(tmp_path / "hf")
  (tmp_path / "hf" / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
                                                       + [f"w{i}" for i in range(95)]) + "\n")
  bucket.put(str(tmp_path / "hf"), f"{BUCKET}/hf-in", recursive=True)
  assert cli.main(["convert", "--from", "hf", f"gs://{BUCKET}/hf-in", f"gs://{BUCKET}/native"]) == 0
  assert cli.main(["convert", "--to", "hf", f"gs://{BUCKET}/native", f"gs://{BUCKET}/hf-out"]) == 0
  bucket.get(f"{BUCKET}/hf-out", str(tmp_path / "hf-out"), recursive=True)
  assert (tmp_path / "hf-out" / "vocab.txt").read_text() == (tmp_path / "hf" / "vocab.txt").read_text()
  back = transformers.BertForPreTraining.from_pretrained(tmp_path / "hf-out")
  original, restored = model.state_dict(), back.state_dict()
  for name, tensor in original.items():
    torch.testing.assert_close(restored[name], tensor, rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("case", ["no bucket", "no credentials", "no answer"])
def test_an_unreachable_bucket_is_one_line(bucket_env, bucket, monkeypatch, capsys, case):
  name = "bert-jax-test-no-such-bucket"
  if case == "no credentials":
    # The default client (TF's gfile) outside the emulator, with no credentials to find.
    for key in ("EPATH_USE_TF", "STORAGE_EMULATOR_HOST", "GOOGLE_APPLICATION_CREDENTIALS"):
      monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("NO_GCE_CHECK", "true")
  if case == "no answer":
    name = BUCKET
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9")  # nothing listens on port 9
    monkeypatch.setattr(workdir, "BUCKET_PROBE_SECONDS", 3.0)
  _clear_caches()
  start = time.time()
  code = cli.main(["pretrain", "--config", "configs/bert.py:demo", "--workdir", f"gs://{name}/run", *PRETRAIN])
  err = capsys.readouterr().err.strip()
  assert code == 2 and len(err.splitlines()) == 1 and f"gs://{name}:" in err and "gcloud" in err, err
  assert time.time() - start < 60
  if case == "no bucket":
    assert "no such bucket" in err and not bucket.exists(name)  # not created on the way
  if case == "no answer":
    assert "no answer within 3 s" in err


KILL_WHILE_COMMITTING = """
import os, signal
from orbax.checkpoint._src.path import atomicity
finalize = atomicity.CommitFileTemporaryPath.finalize
async def finalize_or_die(self, *args, **kwargs):
  if f"{self._final_path.parent.name}/{self._final_path.name}" == os.environ["KILL_AT"]:
    os.kill(os.getpid(), signal.SIGKILL)  # every object of the step's state written, none committed
  return await finalize(self, *args, **kwargs)
atomicity.CommitFileTemporaryPath.finalize = finalize_or_die
import sys
from bert_jax import cli
sys.exit(cli.main(sys.argv[1:]))
"""


@slow  # a killed run and its rerun in the emulated bucket: ~50 s on 2 cores
def test_a_run_killed_in_the_middle_of_a_save_resumes_from_the_last_complete_checkpoint(bucket_env, bucket, tmp_path,
                                                                                        capsys):
  """SIGKILL while step 4's state is being committed (an async save, as by default): its objects are in the
  bucket, its commit_success.txt is not. The rerun, started at once, takes over the dead run's lease,
  removes the partial step (before: tensorstore wrote the OCDBT manifest over the leftover objects), resumes
  from step 2, and logs the steps after it exactly as the killed run did."""
  corpus, vocab = embedded.ensure_embedded()
  run = f"gs://{BUCKET}/killed-in-save"
  args = [*_pretrain_args(run, [f"--config.data.corpus={corpus}", f"--config.data.vocab={vocab}"]),
          "--config.checkpoint.async_save=true", "--config.train.num_steps=6"]
  done = subprocess.run([sys.executable, "-c", KILL_WHILE_COMMITTING, *args], cwd=tmp_path, capture_output=True,
                        text=True, timeout=400, env=dict(os.environ, KILL_AT="4/state"))
  assert done.returncode == -9, done.stderr[-3000:]
  prefix = f"{BUCKET}/killed-in-save/checkpoints/4/"
  step4 = [p[len(prefix):] for p in bucket.find(prefix)]
  assert "state/manifest.ocdbt" in step4 and not {"commit_success.txt", "state/commit_success.txt"} & set(step4), step4
  before = _rows(bucket.cat(f"{BUCKET}/killed-in-save/metrics.jsonl").decode())
  assert sorted(before)[:4] == [1, 2, 3, 4]  # steps 5 and 6 may run while step 4 commits in the background
  capsys.readouterr()
  assert cli.main(args) == 0
  output = capsys.readouterr().out
  assert "has ended on this machine; taking over its lease" in output
  assert (f"removing {run}/checkpoints/4: the partial checkpoint of a save that was cut short\n"
          f"resumed from {run}/checkpoints/2\n") in output, output[-3000:]
  after = _rows(bucket.cat(f"{BUCKET}/killed-in-save/metrics.jsonl").decode())
  assert sorted(after) == [1, 2, 3, 4, 5, 6]
  np.testing.assert_allclose([after[s] for s in sorted(before)], [before[s] for s in sorted(before)], rtol=1e-6)
  assert bucket.exists(f"{BUCKET}/killed-in-save/checkpoints/4/commit_success.txt")
  assert bucket.exists(f"{BUCKET}/killed-in-save/checkpoints/6/commit_success.txt")


GCSFS_CALLS = """
import sys
from etils import epath
from bert_jax import workdir
directory = epath.Path(sys.argv[1])
for i in range(12):
  workdir.write_text(directory / f"f{i}.txt", "x")
  assert (directory / f"f{i}.txt").exists() and (directory / f"f{i}.txt").read_text() == "x"
print(sum(1 for _ in directory.iterdir()))
"""


def test_gcsfs_says_once_that_it_cannot_tell_the_bucket_type(bucket_env, tmp_path):
  """gcsfs with its zonal/hierarchical support on (its default) asks the storage-control API, which the
  emulator lacks, before its calls: before, one warning per call (~700 in a short run)."""
  done = subprocess.run([sys.executable, "-c", GCSFS_CALLS, f"gs://{BUCKET}/bucket-type"], cwd=tmp_path,
                        capture_output=True, text=True, timeout=300,
                        env=dict(os.environ, GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT="true"))
  assert done.returncode == 0 and done.stdout.split() == ["12"], done.stderr[-3000:]
  warnings = [line for line in done.stderr.splitlines() if "bucket type" in line]
  assert len(warnings) == 1 and f"bucket name {BUCKET}" in warnings[0], done.stderr[-3000:]


def _eval_rows(text):
  return {r["step"]: r["loss"] for r in map(json.loads, text.splitlines()) if r.get("eval")}


@slow  # six runs in the emulated bucket: several minutes on 2 cores
def test_a_run_killed_at_random_moments_ends_as_the_uninterrupted_run(bucket_env, bucket, tmp_path):
  """The fault campaign's chaos run, smaller: SIGKILL five times at random moments (a random number of
  metrics rows in, then a random fraction of a second: in a step, a save, an evaluation, the finish) of one
  run with async saves and evaluations, then run it to its end. Every logged loss (train and eval) is the
  uninterrupted local run's, each step is logged once, and no partial or extra checkpoint is left."""
  corpus, vocab = embedded.ensure_embedded()
  run, prefix = f"gs://{BUCKET}/chaos", f"{BUCKET}/chaos"
  settings = ["--config.train.num_steps=8", "--config.train.eval_every_steps=2", "--config.train.eval_steps=1",
              "--config.checkpoint.async_save=true", "--config.checkpoint.keep=2"]
  args = [*_pretrain_args(run, [f"--config.data.corpus={corpus}", f"--config.data.vocab={vocab}"]), *settings]
  rng = np.random.default_rng(int(os.environ.get("BERT_JAX_CHAOS_SEED", "0")))

  def rows():
    return len(bucket.cat(f"{prefix}/metrics.jsonl").splitlines()) if bucket.exists(f"{prefix}/metrics.jsonl") else 0

  for _ in range(5):
    target = rows() + int(rng.integers(0, 4))  # of 12 rows in all: 8 train, 4 eval
    killed = subprocess.Popen([sys.executable, "-m", "bert_jax.cli", *args], cwd=tmp_path, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT)
    deadline = time.time() + 300
    while time.time() < deadline and killed.poll() is None and rows() < target:
      time.sleep(0.1)
    time.sleep(rng.uniform(0, 1.5))
    killed.kill()
    output = killed.communicate(timeout=60)[0].decode()
    assert killed.returncode in (-9, 0), output[-3000:]
  done = subprocess.run([sys.executable, "-m", "bert_jax.cli", *args], cwd=tmp_path, capture_output=True, text=True,
                        timeout=400)
  assert done.returncode == 0, done.stderr[-3000:]
  straight = tmp_path / "straight"
  trainer.pretrain(trainer.load_run_config("configs/bert.py:demo", PRETRAIN + settings + [
      f"--config.data.corpus={corpus}", f"--config.data.vocab={vocab}"]), str(straight))
  text, expected = bucket.cat(f"{prefix}/metrics.jsonl").decode(), (straight / "metrics.jsonl").read_text()
  assert [(r["step"], bool(r.get("eval"))) for r in map(json.loads, text.splitlines())] == [
      (r["step"], bool(r.get("eval"))) for r in map(json.loads, expected.splitlines())]
  for read in (_rows, _eval_rows):
    got, want = read(text), read(expected)
    np.testing.assert_allclose([got[s] for s in sorted(want)], [want[s] for s in sorted(want)], rtol=1e-5)
  steps = sorted(p.rsplit("/", 1)[1] for p in bucket.ls(f"{prefix}/checkpoints"))
  assert steps == ["6", "8"], steps
  assert all(bucket.exists(f"{prefix}/checkpoints/{s}/commit_success.txt") for s in steps)
  finished = json.loads(bucket.cat(f"{prefix}/finished.json"))
  assert finished["eval"]["loss"] == pytest.approx(_eval_rows(expected)[8], rel=1e-5)
