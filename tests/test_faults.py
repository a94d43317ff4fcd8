"""The fault campaign of issue 19, kept alive: SIGKILL at several moments (one during an async save)
resumes to the uninterrupted run; divergence stops and keeps the finite checkpoint; a damaged
checkpoint, a full disk, another optimizer and an empty eval split each end in one line; a second run
on a busy workdir is locked out; a crafted .bin is refused."""
import asyncio
import errno
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from etils import epath
from orbax.checkpoint._src import asyncio_utils

from bert_jax import cli, orbax_faults, run_lock, workdir as workdir_lib
from bert_jax.errors import UserError
from bert_jax.training import checkpoint, finite, metrics, step as step_lib, trainer
from core_helpers import slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--config.data.max_seq_length=32", "--config.data.max_predictions_per_seq=5",
        "--config.train.batch_size=8", "--config.train.log_every_steps=1", "--config.train.eval_every_steps=0",
        "--config.data.shuffle_buffer=100", "--config.model.num_layers=1", "--config.model.hidden_size=32",
        "--config.model.intermediate_size=64", "--config.checkpoint.every_steps=2", "--config.train.tensorboard=false"]


SMALL = ["--config.data.max_seq_length=32", "--config.data.max_predictions_per_seq=5", "--config.train.batch_size=8",
         "--config.train.eval_batch_size=8", "--config.train.log_every_steps=1", "--config.train.eval_every_steps=0",
         "--config.model.num_layers=1", "--config.model.hidden_size=32", "--config.model.intermediate_size=64",
         "--config.checkpoint.every_steps=2", "--config.train.tensorboard=false"]
FAMILIES = {  # a tiny pretraining run of each family: its preset and overrides
    "bert": ("configs/bert.py:demo", TINY),
    "modernbert": ("configs/modernbert.py:tiny", SMALL + ["--config.train.batch_warmup_steps=0",
                                                          "--config.data.shuffle_buffer=100"]),
    "xlnet": ("configs/xlnet.py:tiny", SMALL + ["--config.xlnet.reuse_len=16", "--config.xlnet.mem_len=16"]),
}


def _config(*overrides, family="bert"):
  preset, tiny = FAMILIES[family]
  return trainer.load_run_config(preset, tiny + list(overrides))


def _rows(workdir, evals=False):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [r for r in map(json.loads, f) if bool(r.get("eval")) == evals]


def _steps(workdir):
  return sorted(int(d) for d in os.listdir(os.path.join(workdir, "checkpoints")) if d.isdigit())


def _truncate_arrays(step_dir):
  data_files = sorted(p for p in (step_dir / "state").rglob("*") if p.is_file() and "/d/" in str(p))
  assert data_files
  for path in data_files:
    path.write_bytes(path.read_bytes()[:10])


def _cli(workdir, *overrides, prelude="", timeout=400, family="bert", **env):
  """`bert-jax pretrain` in a fresh process (after `prelude`, Python run first in that process)."""
  code = prelude + "\nimport sys\nfrom bert_jax import cli\nsys.exit(cli.main(sys.argv[1:]))"
  preset, tiny = FAMILIES[family]
  command = [sys.executable, "-c", code, "pretrain", "--config", preset, "--workdir", str(workdir), *tiny, *overrides]
  return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                        env=dict(os.environ, PYTHONPATH=ROOT, **env))


@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
  """A finite 4-step run (checkpoints 2 and 4, one evaluation at 4), and the order of saves and evals."""
  workdir = tmp_path_factory.mktemp("healthy")
  order = []
  with pytest.MonkeyPatch.context() as m:
    save, evaluate = checkpoint.Checkpointer.save, trainer.evaluate
    m.setattr(checkpoint.Checkpointer, "save",
              lambda self, step, *a, **k: order.append(("save", step)) or save(self, step, *a, **k))
    m.setattr(trainer, "evaluate", lambda *a: order.append(("eval",)) or evaluate(*a))
    trainer.pretrain(_config("--config.train.num_steps=4", "--config.train.eval_every_steps=4",
                             "--config.train.eval_steps=1"), str(workdir))
  return workdir, order


def _copy(healthy, tmp_path):
  target = tmp_path / "run"
  shutil.copytree(healthy[0], target)
  return target


def test_a_checkpoint_is_saved_before_evaluating(healthy):
  assert healthy[1] == [("save", 2), ("save", 4), ("eval",)]


def test_divergence_stops_and_keeps_the_last_finite_checkpoint(healthy, tmp_path):
  """lr 1e6 from a healthy step 4: the loss overflows within a few steps. Before the check the run went
  on to step 12 with exit 0, and checkpoints 8..12 (NaN) rotated the finite ones out."""
  workdir = _copy(healthy, tmp_path)
  with pytest.raises(finite.TrainingDiverged, match=r"not finite at step (\d+)") as info:
    trainer.pretrain(_config("--config.train.num_steps=12", "--config.optimizer.learning_rate=1e6",
                             "--config.checkpoint.keep=2"), str(workdir))
  diverged = int(re.search(r"at step (\d+)", str(info.value)).group(1))
  rows = _rows(workdir)
  assert [r["step"] for r in rows] == list(range(1, diverged))  # the non-finite step is not logged
  assert all(np.isfinite(r["loss"]) for r in rows)
  latest = _steps(workdir)[-1]
  assert latest < diverged and f"the latest checkpoint, step {latest}, is finite" in str(info.value)
  params, _ = checkpoint.load_params(str(workdir))  # refuses NaN params
  assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(params))


def test_nan_params_are_refused_on_load(tmp_path):
  config = {"model": {"hidden_size": 2}}
  checkpoint.save_params(str(tmp_path / "nan"), {"dense": {"kernel": np.array([[1.0, np.nan]], np.float32),
                                                           "bias": np.zeros(2, np.float32)}}, config)
  with pytest.raises(UserError, match=r"nan: parameters hold NaN or Inf \(\['dense'\]\['kernel'\]\)"):
    checkpoint.load_params(str(tmp_path / "nan"))


def _toy_step(state, batch, rng):
  """Loss = sum(w * x): gradient x, so a NaN in the batch makes loss and gradient NaN."""
  tx = optax.sgd(1.0)
  loss, grads = jax.value_and_grad(lambda w: jnp.sum(w * batch))(state.params)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  return (step_lib.TrainState(state.step + 1, optax.apply_updates(state.params, updates), opt_state),
          {"loss": loss, "grad_norm": optax.tree.norm(grads)})


@pytest.mark.parametrize("budget", [0, 1])
def test_skip_nonfinite_steps(budget, capsys):
  step = jax.jit(finite.guard_step(_toy_step, skip=budget > 0))
  state = step_lib.TrainState(jnp.int32(0), jnp.ones(2), optax.sgd(1.0).init(jnp.ones(2)))
  guard = finite.DivergenceGuard(budget)
  batches = [jnp.array([1.0, 2.0]), jnp.array([np.nan, 0.0]), jnp.array([0.5, 0.5]), jnp.array([np.inf, 0.0])]
  for number, batch in enumerate(batches[:3], 1):
    state, m = step(state, batch, None)
    guard.record(number, m)
  if not budget:
    with pytest.raises(finite.TrainingDiverged, match="not finite at step 2; .* step 1, is finite"):
      guard.check(last_saved=1)
    return
  assert guard.check(last_saved=None) == {2}
  np.testing.assert_allclose(state.params, [1 - 1 - 0.5, 1 - 2 - 0.5])  # step 2 left the params alone
  assert int(state.step) == 3
  assert "step 2: loss or gradient norm not finite; update skipped (1 of train.skip_nonfinite_steps=1)" in \
      capsys.readouterr().out
  state, m = step(state, batches[3], None)
  guard.record(4, m)
  with pytest.raises(finite.TrainingDiverged, match=r"more than train.skip_nonfinite_steps=1 .* at step 4"):
    guard.check_state(4, state, last_saved=None)


def test_resume_with_another_optimizer_is_refused_before_writing(healthy, tmp_path):
  workdir = _copy(healthy, tmp_path)
  before = (workdir / "config.json").read_text()
  with pytest.raises(UserError, match=r"checkpoints/4: the saved train state does not fit this config "
                                      r"\(optimizer.name: saved run 'adamw', this config 'lamb'\)"):
    trainer.pretrain(_config("--config.train.num_steps=6", "--config.optimizer.name=lamb"), str(workdir))
  assert (workdir / "config.json").read_text() == before


def test_a_paused_state_resumes_and_another_optimizer_is_refused_naming_it(tmp_path):
  """checkpoint.resume_paused, through which fine-tuning, MT-DNN and Sentence-BERT resume: the paused state
  and progress come back; a config whose optimizer state has other shapes is refused, naming the setting
  that differs from the run config the state was saved with."""
  config = ml_collections.ConfigDict({"checkpoint": {"keep": 1, "async_save": False}, "optimizer": {"name": "adamw"}})
  assert checkpoint.resume_paused(tmp_path, {}, config) is None
  ckpt = checkpoint.Checkpointer.paused(tmp_path, config.checkpoint)
  ckpt.save(3, {"w": np.arange(2, dtype=np.float32), "mu": np.ones(2, np.float32)}, force=True, progress={"best": 1})
  ckpt.close()
  workdir_lib.write_json(tmp_path / workdir_lib.RUN_CONFIG, config.to_dict())
  shape = jax.ShapeDtypeStruct((2,), np.float32)
  state, progress = checkpoint.resume_paused(tmp_path, {"w": shape, "mu": shape}, config)
  np.testing.assert_array_equal(state["w"], [0, 1])
  assert progress == {"best": 1}
  config.optimizer.name = "lamb"
  with pytest.raises(UserError, match=rf"{workdir_lib.PAUSED}/3: the saved train state does not fit this config "
                                      r"\(optimizer.name: saved run 'adamw', this config 'lamb'\)"):
    checkpoint.resume_paused(tmp_path, {"w": shape}, config)


# truncated arrays: weekly (the same fall-back as a missing manifest, issue 37's input; truncated arrays'
# failed restore is also test_every_checkpoint_damaged_starts_again_as_a_fresh_run's damage)
@pytest.mark.parametrize("damage", [pytest.param("truncated arrays", marks=slow), "no manifest"])
def test_damaged_checkpoint_falls_back_to_the_previous_step(healthy, tmp_path, capfd, damage):
  """Its warning is the only line besides the run's own: before, ~140 "Event loop is closed" tracebacks
  (orbax closed its loop while tensorstore's other reads were in flight) came with it."""
  workdir = _copy(healthy, tmp_path)
  if damage == "no manifest":  # the input of issue 37
    (workdir / "checkpoints/4/state/manifest.ocdbt").unlink()
  else:
    _truncate_arrays(workdir / "checkpoints/4")
  capfd.readouterr()
  result = trainer.pretrain(_config("--config.train.num_steps=5"), str(workdir))
  out, err = capfd.readouterr()
  assert "Traceback" not in out + err and "Event loop is closed" not in out + err, (out + err)[-3000:]
  assert f"warning: checkpoint {workdir}/checkpoints/4 cannot be restored" in out
  assert f"resumed from {workdir}/checkpoints/2" in out
  assert result["step"] == 5 and _steps(workdir) == [2, 4, 5]  # 4 saved again by the resumed run
  assert len(list((workdir / "checkpoints-damaged").iterdir())) == 1
  assert [r["step"] for r in _rows(workdir)] == [1, 2, 3, 4, 5]  # rows 3, 4 replaced, not doubled
  np.testing.assert_allclose([r["loss"] for r in _rows(workdir)][:4],
                             [r["loss"] for r in _rows(healthy[0])], rtol=1e-6)


def test_metrics_rows_after_the_resumed_step_are_dropped(tmp_path):
  path = epath.Path(tmp_path / "metrics.jsonl")
  with open(path, "w") as f:
    f.write('{"step": 1}\n{"step": 2, "eval": true}\n{"step": 3}\n{"step": 4')  # cut short by a kill
  metrics.drop_rows_after(path, 2)
  assert open(path).read() == '{"step": 1}\n{"step": 2, "eval": true}\n'


def test_empty_eval_split_is_found_at_start(tmp_path):
  with pytest.raises(UserError, match=r"evaluation split \(data.eval_fraction=1e-09 of the documents\) gives "
                                      r"no examples"):
    trainer.pretrain(_config("--config.train.num_steps=4", "--config.train.eval_every_steps=4",
                             "--config.data.eval_fraction=1e-9"), str(tmp_path))
  assert not (tmp_path / "checkpoints").exists() or not _steps(tmp_path)
  assert not (tmp_path / "metrics.jsonl").exists()


@pytest.fixture
def tmpfs(tmp_path):
  """mount(options) -> a fresh tmpfs at a new folder, unmounted after the test; skips where mounting is
  not permitted (it needs root or CAP_SYS_ADMIN)."""
  mounts = []

  def mount(options):
    folder = tmp_path / f"disk{len(mounts)}"
    folder.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True)
    if done.returncode:
      pytest.skip(f"cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN): {done.stderr.decode().strip()}")
    mounts.append(folder)
    return folder

  yield mount
  for folder in mounts:
    subprocess.run(["umount", str(folder)], check=True)


def test_disk_full_is_one_line_and_keeps_earlier_checkpoints(tmpfs, healthy, capfd):
  """A 5 MB disk holds one 3.2 MB checkpoint; before, the second save gave ~1,300 lines of traceback, and
  then still 9 "Event loop is closed" tracebacks (orbax closed its event loop with writes in flight)."""
  workdir = tmpfs("size=5m") / "run"
  capfd.readouterr()
  with pytest.raises(UserError) as info:
    trainer.pretrain(_config("--config.train.num_steps=6"), str(workdir))
  assert str(info.value) == (f"no space left in {workdir} while saving step 4; checkpoints up to step 2 are "
                             "intact; free space (or lower checkpoint.keep) and rerun the same command to resume")
  output = "".join(capfd.readouterr())
  assert "Traceback" not in output and "Event loop is closed" not in output, output[-3000:]
  assert _steps(workdir) == [2]
  assert not [p for p in os.listdir(workdir / "checkpoints") if "tmp" in p]
  params, _ = checkpoint.load_params(str(workdir))
  assert params["encoder"]


def test_disk_full_at_start_up_is_one_line_and_leaves_no_partial_file(tmpfs, capsys):
  """A 64 KB disk: before, a traceback and a truncated vocab.txt (65 KB)."""
  workdir = tmpfs("size=64k") / "run"
  assert cli.main(["pretrain", "--config", "configs/bert.py:demo", "--workdir", str(workdir), *TINY]) == 2
  assert capsys.readouterr().err.splitlines() == [
      f"bert-jax pretrain: error: cannot write {workdir}/vocab.txt: the disk is full (no space left on the device "
      f"holding {workdir}); free space there, or choose a directory on another disk, and rerun"]
  assert [p.name for p in workdir.iterdir()] == ["checkpoints"] and not list((workdir / "checkpoints").iterdir())


def test_a_read_only_workdir_is_one_line(tmpfs, capsys):
  disk = tmpfs("size=1m,ro")
  for workdir in (disk, disk / "run"):  # an existing folder, and one that cannot be made
    assert cli.main(["pretrain", "--config", "configs/bert.py:demo", "--workdir", str(workdir)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"bert-jax pretrain: error: --workdir: cannot write {workdir}: {disk} is on a read-only filesystem; "
        "choose a writable directory"]


def test_a_failed_write_leaves_the_old_file_or_none(tmp_path, monkeypatch):
  """Files are written under a temporary name and renamed; metrics rows are appended whole or cut back."""
  target = tmp_path / "config.json"
  workdir_lib.write_json(target, {"old": 1})
  full = OSError(errno.ENOSPC, "No space left on device")
  with pytest.raises(UserError, match=f"cannot write {target}: the disk is full"):
    with workdir_lib.atomic_open(target) as f:
      f.write('{"new": ')
      raise full
  assert json.loads(target.read_text()) == {"old": 1} and sorted(os.listdir(tmp_path)) == ["config.json"]
  rows = tmp_path / "metrics.jsonl"
  workdir_lib.append_line(rows, '{"step": 1}')
  monkeypatch.setattr(os, "write", lambda fd, data: os.pwrite(fd, data[:5], os.fstat(fd).st_size))  # a short write
  with pytest.raises(UserError, match=f"cannot write {rows}: the disk is full"):
    workdir_lib.append_line(rows, '{"step": 2}')
  assert rows.read_text() == '{"step": 1}\n'


def test_orbax_loops_finish_their_work_before_closing():
  """What tensorstore does when one of a restore's reads fails: the other reads complete later, from their
  own threads, into the loop orbax ran the restore on. orbax closed that loop as soon as the first read
  failed, and each late read printed "RuntimeError: Event loop is closed"."""
  late, threads = [], []

  async def read(loop, fail):
    if fail:
      raise ValueError("a damaged array")
    future = loop.create_future()

    def complete():
      time.sleep(0.2)
      try:
        loop.call_soon_threadsafe(future.set_result, "bytes")
        late.append("delivered")
      except RuntimeError as e:
        late.append(str(e))

    threads.append(threading.Thread(target=complete))
    threads[-1].start()
    return await future

  async def restore():
    loop = asyncio.get_running_loop()
    return await asyncio.gather(read(loop, False), read(loop, True))

  with pytest.raises(ValueError, match="a damaged array"):
    asyncio_utils.run_sync(restore())
  for thread in threads:  # the late read's thread records its outcome after handing the result over
    thread.join()
  assert late == ["delivered"]


def test_no_space_is_recognised_through_wrapping():
  try:
    try:
      raise OSError(errno.ENOSPC, "No space left on device")
    except OSError as e:
      raise RuntimeError("orbax: save failed") from e
  except RuntimeError as wrapped:
    assert orbax_faults.no_space(wrapped)
  assert not orbax_faults.no_space(ValueError("shape mismatch"))


def test_a_second_run_is_locked_out(tmp_path, capsys):
  """A holder killed with SIGKILL leaves nothing stale; a live holder (another process) locks a second run
  (here the CLI in this process) out in seconds."""
  hold = ("import sys, time\nfrom bert_jax import run_lock\nwith run_lock.hold(sys.argv[1]):\n"
          "  print('held', flush=True)\n  time.sleep(600)\n")
  env = dict(os.environ, PYTHONPATH=ROOT)
  holder = subprocess.Popen([sys.executable, "-c", hold, str(tmp_path)], stdout=subprocess.PIPE, env=env, cwd=ROOT)
  try:
    assert holder.stdout.readline() == b"held\n"
    started = time.time()
    capsys.readouterr()
    code = cli.main(["pretrain", "--config", FAMILIES["bert"][0], "--workdir", str(tmp_path), *TINY,
                     "--config.train.num_steps=2"])
    err = capsys.readouterr().err
    assert code == 2, err[-3000:]
    assert time.time() - started < 120
    assert err.strip().splitlines() == [
        f"bert-jax pretrain: error: workdir {tmp_path} is in use by another run (host {os.uname().nodename}, "
        f"pid {holder.pid}, started " + err.split("started ")[1].split(")")[0] + "); wait for it to "
        "finish or stop it, or use another --workdir"]
    assert not (tmp_path / "config.json").exists()
  finally:
    holder.send_signal(signal.SIGKILL)
    holder.wait()
  with run_lock.hold(str(tmp_path)):
    pass


class _FakeBlob:
  """google-cloud-storage Blob semantics that the lease relies on: generation preconditions."""

  class Failed(Exception):
    pass

  def __init__(self):
    self.data, self.generation = None, None

  def upload_from_string(self, data, if_generation_match):
    if (self.generation or 0) != if_generation_match:
      raise self.Failed()
    self.data, self.generation = data, (self.generation or 0) + 1

  def reload(self):
    pass

  def download_as_bytes(self, if_generation_match):
    assert if_generation_match == self.generation
    return self.data.encode()

  def delete(self, if_generation_match):
    if self.generation != if_generation_match:
      raise self.Failed()
    self.data, self.generation = None, None


def test_gcs_lease_excludes_until_it_expires():
  blob, now = _FakeBlob(), [1000.0]
  first = run_lock.LeaseLock("gs://b/run", blob, _FakeBlob.Failed, lease_seconds=60, clock=lambda: now[0])
  second = run_lock.LeaseLock("gs://b/run", blob, _FakeBlob.Failed, lease_seconds=60, clock=lambda: now[0])
  first.try_acquire()
  now[0] += 50
  assert first.renew()  # expires at 1110 now
  now[0] += 59
  with pytest.raises(UserError, match=f"workdir gs://b/run is in use by another run \\(host .*, pid {os.getpid()}"):
    second.try_acquire()
  now[0] += 2  # the first holder stopped renewing: its lease ran out
  second.try_acquire()
  assert not first.renew()  # the first holder finds out at its next renewal
  second.release()
  assert blob.data is None


def test_a_lease_whose_holder_died_on_this_machine_is_taken_at_once(capsys):
  """The killed run's record names its process space and pid: where both say it is gone, the lease is over.
  A holder elsewhere (another space) keeps its lease until it expires, alive or not."""
  dead = subprocess.Popen([sys.executable, "-c", "pass"])
  dead.wait()
  here = run_lock._process_space()  # pylint: disable=protected-access
  for space, taken in ((here, True), ("another-machine/1", False)):
    blob = _FakeBlob()
    blob.upload_from_string(json.dumps({"host": "h", "pid": dead.pid, "space": space, "started": "t",
                                        "expires": time.time() + 100}), if_generation_match=0)
    lock = run_lock.LeaseLock("gs://b/run", blob, _FakeBlob.Failed)
    if taken:
      lock.try_acquire()
      assert json.loads(blob.data)["pid"] == os.getpid()
      assert capsys.readouterr().out == (f"gs://b/run: the run that held it (host h, pid {dead.pid}, started t) "
                                         "has ended on this machine; taking over its lease\n")
    else:
      with pytest.raises(UserError, match=f"in use by another run \\(host h, pid {dead.pid}, started t, lease"):
        lock.try_acquire()


def test_the_lock_file_goes_with_the_run(tmp_path):
  with run_lock.hold(str(tmp_path)):
    assert json.loads((tmp_path / run_lock.LOCK_FILE).read_text())["pid"] == os.getpid()
    with pytest.raises(UserError, match="is in use by another run"):
      run_lock.LocalLock(str(tmp_path)).acquire()
  assert not (tmp_path / run_lock.LOCK_FILE).exists()
  with run_lock.hold(str(tmp_path)):  # and the next run makes a new one
    assert (tmp_path / run_lock.LOCK_FILE).exists()


def test_crafted_bin_is_refused(tmp_path):
  pytest.importorskip("torch")
  from test_conversion_hf import _float_view, write_crafted_bin  # pylint: disable=import-outside-toplevel
  from bert_jax.conversion.torch_zip import load_torch_zip  # pylint: disable=import-outside-toplevel
  path = str(tmp_path / "pytorch_model.bin")
  write_crafted_bin(path, {"w": _float_view("0", 4, 0, (2_000_000_000,), (1,))},
                    {"0": np.arange(4, dtype=np.float32)})
  with pytest.raises(UserError, match="reaches element 1999999999 of a storage holding 4"):
    load_torch_zip(path)


KILL_AT = """
import os, signal, time
from bert_jax.training import checkpoint, loop, trainer
where, _, step = os.environ["KILL_AT"].partition(":")
def die(*args, **kwargs):
  os.kill(os.getpid(), signal.SIGKILL)
if where == "save":  # while the step's state is being written, its directory still tmp
  save = checkpoint.DataPositionHandler.save
  def save_or_die(self, directory, args):
    if os.path.basename(os.path.dirname(os.fspath(directory))).startswith(step + "."):
      die()
    return save(self, directory, args)
  checkpoint.DataPositionHandler.save = save_or_die
elif where == "eval":  # in this process's first evaluation, once the checkpoint of its step is committed
  def evaluate_and_die(*args):
    while not os.path.isdir(os.path.join(os.environ["KILL_WORKDIR"], "checkpoints", step)):
      time.sleep(0.05)
    die()
  trainer.evaluate = evaluate_and_die
elif where == "finish":  # after the last checkpoint and evaluation, before finished.json
  loop.write_finished = die
"""
# Each kill, and the checkpoints and evaluation rows after it (None: the step's evaluation may have been
# logged while its async save was still writing).
KILLS = (("save:2", [], None), ("eval:2", [2], []), ("save:4", [2], None), ("eval:4", [2, 4], [2]),
         ("finish", [2, 4], [2, 4]))


@slow  # an end-to-end chain per family; its parts are tested in the suite (BERT_JAX_SLOW_TESTS=1)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_sigkill_at_several_moments_resumes_to_the_uninterrupted_run(family, tmp_path):
  """Killed while the first checkpoint (step 2, an async save) is being written, during the evaluation of
  step 2, while the last checkpoint is written, during the last evaluation, and before finished.json: the
  resumed run ends with the uninterrupted run's parameters, metrics rows (each step once; before, rows
  3 and 4 were logged twice, a killed evaluation's row was lost, and a run killed before finished.json
  ended without its final metrics) and final record."""
  run = ("--config.train.num_steps=4", "--config.train.eval_every_steps=2", "--config.train.eval_steps=1")
  reference, killed = tmp_path / "reference", tmp_path / "killed"
  expected = trainer.pretrain(_config(*run, family=family), str(reference))
  for moment, steps, evals in KILLS:
    done = _cli(killed, *run, prelude=KILL_AT, family=family, KILL_AT=moment, KILL_WORKDIR=str(killed))
    assert done.returncode == -signal.SIGKILL, (moment, done.stdout[-2000:], done.stderr[-3000:])
    assert _steps(killed) == steps, moment
    assert evals is None or [r["step"] for r in _rows(killed, evals=True)] == evals, moment
  done = _cli(killed, *run, family=family)
  assert done.returncode == 0, done.stderr[-3000:]
  assert f"resumed from {killed}/checkpoints/4" in done.stdout
  assert _steps(killed) == [2, 4] and not [p for p in os.listdir(killed / "checkpoints") if "tmp" in p]
  for evals in (False, True):
    assert [r["step"] for r in _rows(killed, evals)] == [r["step"] for r in _rows(reference, evals)]
    np.testing.assert_allclose([r["loss"] for r in _rows(killed, evals)], [r["loss"] for r in _rows(reference, evals)],
                               rtol=1e-6)
  finished = json.loads((killed / "finished.json").read_text())
  assert finished["train"]["loss"] == _rows(killed)[-1]["loss"]
  assert finished["eval"] == {k: v for k, v in _rows(killed, True)[-1].items() if k not in ("step", "eval")}
  np.testing.assert_allclose(finished["eval"]["loss"], expected["eval"]["loss"], rtol=1e-6)
  a, _ = checkpoint.load_params(str(reference))
  b, _ = checkpoint.load_params(str(killed))
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-6), a, b)


def test_finetune_and_sweep_take_the_workdir_lock(tmp_path):
  from bert_jax.config_utils import load_config  # pylint: disable=import-outside-toplevel
  from bert_jax.finetune import sweep, trainer as finetune_trainer  # pylint: disable=import-outside-toplevel
  config = load_config("configs/glue.py:embedded", [])
  with run_lock.hold(str(tmp_path)):
    for entry in (finetune_trainer.finetune, sweep.sweep):
      with pytest.raises(UserError, match=f"workdir {tmp_path} is in use by another run \\(host .*, pid "
                                          f"{os.getpid()}, started "):
        entry(config, str(tmp_path))


def _hf_bert(directory, **sizes):
  """A random transformers BertForPreTraining saved with the embedded vocabulary: a Hugging Face folder."""
  transformers = pytest.importorskip("transformers")
  torch = pytest.importorskip("torch")
  from bert_jax.data_pipelines import embedded  # pylint: disable=import-outside-toplevel
  torch.manual_seed(0)
  model = transformers.BertForPreTraining(transformers.BertConfig(**sizes)).eval()
  model.save_pretrained(directory)
  shutil.copy(embedded.ensure_embedded()[1], directory / "vocab.txt")
  return model


HF_TINY = dict(vocab_size=8192, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)


def _assert_holds_the_hf_weights(params, model):
  state = model.state_dict()
  np.testing.assert_array_equal(params["embeddings"]["word_embeddings"]["embedding"],
                                state["bert.embeddings.word_embeddings.weight"].numpy())
  np.testing.assert_array_equal(params["encoder"]["layers"]["attention"]["query"]["kernel"][0],
                                state["bert.encoder.layer.0.attention.self.query.weight"].numpy().T.reshape(32, 2, 16))


def test_a_hugging_face_init_from_is_converted_once_into_the_workdir(tmp_path, capsys):
  """Before: KeyError: 'model'. What pretraining's restore_or_init then loads is the HF model's weights."""
  from bert_jax import pretrained  # pylint: disable=import-outside-toplevel
  model = _hf_bert(tmp_path / "hf", **HF_TINY)
  config, workdir = _config(f"--config.init_from={tmp_path / 'hf'}"), epath.Path(tmp_path / "run")
  converted = pretrained.native_init_from(config, workdir)
  assert converted.init_from == f"{workdir}/init_from" and config.init_from == str(tmp_path / "hf")
  assert capsys.readouterr().out.splitlines()[-1] == (
      f"init_from={tmp_path / 'hf'} is a Hugging Face folder: converted it to {workdir}/init_from (as "
      f"`bert-jax convert --from hf {tmp_path / 'hf'} {workdir}/init_from` does)")
  abstract = step_lib.build_train_setup(converted).abstract_state.params
  _assert_holds_the_hf_weights(jax.device_get(checkpoint.load_params_into(converted.init_from, abstract)), model)
  assert pretrained.native_init_from(config, workdir).init_from == converted.init_from
  assert "converted" not in capsys.readouterr().out  # a rerun finds it


@pytest.mark.skipif(not os.environ.get("BERT_JAX_SLOW_TESTS"), reason="BERT_JAX_SLOW_TESTS=1: a pretraining run")
def test_pretraining_from_a_hugging_face_folder(tmp_path, capsys):
  """The learning rate is 0 at step 1 (warm-up), so the step-1 checkpoint holds the HF weights exactly."""
  model = _hf_bert(tmp_path / "hf", **HF_TINY)
  workdir = tmp_path / "run"
  trainer.pretrain(_config("--config.train.num_steps=1", f"--config.init_from={tmp_path / 'hf'}"), str(workdir))
  assert f"initialised from {workdir}/init_from" in capsys.readouterr().out
  _assert_holds_the_hf_weights(checkpoint.load_params(str(workdir))[0], model)


# Fine-tuning from a Hugging Face folder (converted once into the workdir, the lock released at the end):
# test_finetune_predict.py's test_embedded_task, whose run starts from one.


def test_every_checkpoint_damaged_starts_again_as_a_fresh_run(healthy, tmp_path, capsys):
  """Each failed restore had moved the input iterator to that step's saved position (its data item is
  restored with the state): the run that started again from step 1 read other batches than a fresh run."""
  workdir = _copy(healthy, tmp_path)
  (workdir / "finished.json").unlink()
  for step in _steps(workdir):
    _truncate_arrays(workdir / "checkpoints" / str(step))
  result = trainer.pretrain(_config("--config.train.num_steps=4", "--config.train.eval_every_steps=4",
                                    "--config.train.eval_steps=1"), str(workdir))
  assert result["step"] == 4 and "resumed from" not in capsys.readouterr().out
  assert len(list((workdir / "checkpoints-damaged").iterdir())) == 2
  for evals in (False, True):
    np.testing.assert_allclose([r["loss"] for r in _rows(workdir, evals)],
                               [r["loss"] for r in _rows(healthy[0], evals)], rtol=1e-6)


@slow  # two tiny pretraining runs per family (BERT's is the test above)
@pytest.mark.parametrize("family", ["modernbert", "xlnet"])
def test_damaged_checkpoints_start_again_or_fall_back_with_their_input_position(family, tmp_path, capsys):
  """Every checkpoint damaged: the run starts again as a fresh run (the input iterator back at its start);
  only the newest damaged: it resumes from the previous step with that step's input position."""
  workdir = tmp_path / "run"
  config = _config("--config.train.num_steps=4", family=family)
  trainer.pretrain(config, str(workdir))
  fresh = [r["loss"] for r in _rows(workdir)]
  for damaged in ([2, 4], [4]):
    (workdir / "finished.json").unlink()
    for step in damaged:
      _truncate_arrays(workdir / "checkpoints" / str(step))
    capsys.readouterr()
    trainer.pretrain(config, str(workdir))
    out = capsys.readouterr().out
    assert ("resumed from" not in out) if damaged == [2, 4] else (f"resumed from {workdir}/checkpoints/2" in out)
    assert _steps(workdir) == [2, 4]
    np.testing.assert_allclose([r["loss"] for r in _rows(workdir)], fresh, rtol=1e-6)


HEALTHY = ("--config.train.num_steps=4", "--config.train.eval_every_steps=4", "--config.train.eval_steps=1")


def _without_rows(workdir, drop):
  lines = (workdir / "metrics.jsonl").read_text().splitlines(keepends=True)
  (workdir / "metrics.jsonl").write_text("".join(line for line in lines if not drop(json.loads(line))))


# before finished.json: weekly (the resume after the last checkpoint is the same path; only the files left differ)
@pytest.mark.parametrize("killed", ["before the last evaluation", pytest.param("before finished.json", marks=slow)])
def test_a_run_killed_after_its_last_checkpoint_ends_as_the_uninterrupted_run(healthy, tmp_path, killed):
  """Before, the rerun ran nothing and wrote finished.json with no train or eval metrics, losing the final
  evaluation, and kept the step orbax had not yet deleted (steps 1..4 with checkpoint.keep=3)."""
  workdir = _copy(healthy, tmp_path)
  finished = json.loads((workdir / "finished.json").read_text())
  (workdir / "finished.json").unlink()
  for step in (1, 3):  # orbax deletes the oldest step after committing the newest: killed in between
    shutil.copytree(workdir / "checkpoints/2", workdir / f"checkpoints/{step}")
  if killed == "before the last evaluation":
    _without_rows(workdir, lambda row: row.get("eval"))
  result = trainer.pretrain(_config(*HEALTHY), str(workdir))
  assert result["train"] == finished["train"] and result["train"]["loss"] == _rows(healthy[0])[-1]["loss"]
  np.testing.assert_allclose(result["eval"]["loss"], finished["eval"]["loss"], rtol=1e-6)
  assert json.loads((workdir / "finished.json").read_text()).keys() == finished.keys()
  assert _rows(workdir) == _rows(healthy[0]) and len(_rows(workdir, evals=True)) == 1
  np.testing.assert_allclose(_rows(workdir, evals=True)[0]["loss"], _rows(healthy[0], evals=True)[0]["loss"],
                             rtol=1e-6)
  assert _steps(workdir) == [2, 3, 4]


def test_an_evaluation_cut_short_is_done_again_on_resume(healthy, tmp_path):
  """Killed during the evaluation of step 2, after its checkpoint: the rerun resumed at step 2 and went on
  without that evaluation's row."""
  workdir = _copy(healthy, tmp_path)
  (workdir / "finished.json").unlink()
  shutil.rmtree(workdir / "checkpoints/4")
  _without_rows(workdir, lambda row: row["step"] > 2)
  trainer.pretrain(_config(*HEALTHY, "--config.train.eval_every_steps=2"), str(workdir))
  rows = [(r["step"], bool(r.get("eval"))) for r in map(json.loads, open(workdir / "metrics.jsonl"))]
  assert rows == [(1, False), (2, False), (2, True), (3, False), (4, False), (4, True)]
  np.testing.assert_allclose(_rows(workdir, evals=True)[1]["loss"], _rows(healthy[0], evals=True)[0]["loss"],
                             rtol=1e-6)


def test_a_file_size_limit_while_saving_is_one_line_and_leaves_no_partial_step(healthy, tmp_path, capfd):
  """`ulimit -f` below a checkpoint's array file (about 1 MB here): each write past it fails with EFBIG (Python
  ignores SIGXFSZ). Before, an orbax traceback, and a *.orbax-checkpoint-tmp* folder left behind."""
  workdir = _copy(healthy, tmp_path)
  (workdir / "finished.json").unlink()
  soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
  capfd.readouterr()
  resource.setrlimit(resource.RLIMIT_FSIZE, (500_000, hard))
  try:
    with pytest.raises(UserError) as info:
      trainer.pretrain(_config("--config.train.num_steps=6"), str(workdir))
  finally:
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
  assert str(info.value) == (f"a file of step 6 in {workdir}/checkpoints grew past the file size limit (ulimit -f) "
                             "while saving it; checkpoints up to step 4 are intact; raise the limit (ulimit -f "
                             "unlimited) and rerun the same command to resume")
  output = "".join(capfd.readouterr())
  assert "Traceback" not in output and "Event loop is closed" not in output, output[-3000:]
  assert _steps(workdir) == [2, 4] and not [p for p in os.listdir(workdir / "checkpoints") if "tmp" in p]


def test_a_file_size_limit_on_other_writes_is_one_line_and_leaves_nothing(tmp_path):
  """A params checkpoint (fine-tuning's params/, convert) and a workdir's own files (config.json, metrics):
  before, the params save was an orbax traceback and a file was "cannot write ... (File too large)"."""
  weights = {"w": np.random.default_rng(0).standard_normal(300_000).astype(np.float32)}  # 1.2 MB, incompressible
  soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
  resource.setrlimit(resource.RLIMIT_FSIZE, (500_000, hard))
  try:
    with pytest.raises(UserError) as params:
      checkpoint.save_params(str(tmp_path / "model"), weights, {})
    with pytest.raises(UserError) as file:
      workdir_lib.write_bytes(tmp_path / "big.bin", b"x" * 600_000)
  finally:
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
  limit = "a file grew past the file size limit (ulimit -f); raise the limit (ulimit -f unlimited) and rerun"
  assert str(params.value) == f"cannot write {tmp_path}/model/params: {limit}"
  assert str(file.value) == f"cannot write {tmp_path}/big.bin: {limit}"
  assert os.listdir(tmp_path / "model") == [] and os.listdir(tmp_path) == ["model"]
