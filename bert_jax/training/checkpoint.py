"""Train-state checkpoints: the state and what a resumed run needs besides it, saved together with orbax.

  DIRECTORY/<step>/state      TrainState (orbax StandardSave, sharded arrays)
  DIRECTORY/<step>/data       pretraining: each process's input position (data_state.process*.json)
  DIRECTORY/<step>/progress   fine-tuning: best score, evaluations without improvement (JSON)

Pretraining keeps them in WORKDIR/checkpoints, a paused fine-tuning run in WORKDIR/state
(bert_jax/workdir.py). Params checkpoints (`init_from`, `convert`, `grow`) are
bert_jax/params_checkpoint.py; its functions are named here too for the callers of this module.
Where a pretraining run starts from is decided in one place, `trainer.restore_or_init`: its own
latest checkpoint, else `config.init_from`, else a fresh init.
"""
from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import tempfile
import time
from typing import Any

import jax
import ml_collections
import orbax.checkpoint as ocp
from etils import epath

from bert_jax import orbax_faults, workdir
from bert_jax.data_pipelines.errors import DataError
from bert_jax.errors import UserError
from bert_jax.params_checkpoint import (check_shapes, load_params, load_params_into,  # noqa: F401
                                        save_params, whole_array_writes)
from bert_jax.ops import finite


class DataPositionHandler(ocp.CheckpointHandler):
  """Saves an input iterator's position: each process writes its own file into the item directory."""

  def save(self, directory: epath.Path, args: "DataPositionSave"):
    args.iterator.save(os.fspath(directory))

  def restore(self, directory: epath.Path, args: "DataPositionRestore"):
    args.iterator.restore(os.fspath(directory))
    return args.iterator


@ocp.args.register_with_handler(DataPositionHandler, for_save=True)
@dataclasses.dataclass
class DataPositionSave(ocp.args.CheckpointArgs):
  iterator: Any


@ocp.args.register_with_handler(DataPositionHandler, for_restore=True)
@dataclasses.dataclass
class DataPositionRestore(ocp.args.CheckpointArgs):
  iterator: Any


# The items a checkpoint may hold besides the state: (save args, restore args) from the value.
_ITEMS = {"data": (DataPositionSave, DataPositionRestore),
          "progress": (ocp.args.JsonSave, lambda _: ocp.args.JsonRestore())}

_SHAPE_KEYS = ("objective", "vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
               "max_position_embeddings", "type_vocab_size", "embedding_size", "share_layers",
               "sentence_head", "scan_layers", "mlm_head", "use_pooler")


def _model_dict(config: ml_collections.ConfigDict | dict) -> dict:
  d = config.to_dict() if isinstance(config, ml_collections.ConfigDict) else dict(config)
  return {"objective": d.get("objective", "bert"), **d["model"]}


def check_same_model(location: epath.PathLike, config: ml_collections.ConfigDict) -> None:
  """A workdir holding a checkpoint of another model is an error, not a silent shape crash."""
  file = workdir.path(location) / workdir.CONFIG
  if not file.exists():
    return
  saved, current = _model_dict(workdir.read_json(file)), _model_dict(config)
  diffs = [f"model.{k}: checkpoint {saved.get(k)!r} vs config {current.get(k)!r}"
           for k in _SHAPE_KEYS if saved.get(k) != current.get(k)]
  if diffs:
    raise UserError(f"workdir {location} holds a checkpoint of a different model ({'; '.join(diffs)}); "
                    "use another --workdir, or match the config")


class Checkpointer:
  """Saves (state, items) per step in `directory`, keeps the last `keep`, restores any step.

  items: names from _ITEMS ("data": an input iterator, "progress": a JSON-able dict).

  Faults end in one line, not an orbax traceback: a step that cannot be restored (a deleted or
  truncated file, or a NaN state saved before the divergence check existed) is moved aside to
  DIRECTORY-damaged/ and `restore_latest` falls back to the previous step, with a warning; a full disk
  while saving names the step and the last intact one, and removes the partial step
  (*.orbax-checkpoint-tmp*).

  A save cut short (SIGKILL, a lost VM) leaves a partial step: locally a *.orbax-checkpoint-tmp*
  directory, in a bucket a step directory without commit_success.txt. Neither counts as a step; both are
  removed (with a line naming them) when the next run opens the directory, before it saves anything: in
  a bucket, saving the same step again over the leftover objects would have tensorstore rewrite an OCDBT
  manifest it did not write.
  """

  def __init__(self, directory: epath.PathLike, *, keep: int, async_save: bool,
               items: tuple[str, ...] = ("data",)):
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=async_save,
                                           cleanup_tmp_directories=True)
    self.directory = workdir.path(directory)
    self.items, self.keep = items, keep
    whole_array_writes()
    if jax.process_index() == 0 and self.directory.exists():
      for partial in ocp.path.step.all_temporary_paths(self.directory):
        print(f"removing {partial.get()}: the partial checkpoint of a save that was cut short", flush=True)
    self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=("state",) + items)
    self._unconfirmed: int | None = None  # the step of a save that may still be in flight
    self._broken = False

  @classmethod
  def for_pretraining(cls, location: epath.PathLike, cfg: ml_collections.ConfigDict) -> "Checkpointer":
    return cls(workdir.path(location) / workdir.CHECKPOINTS, keep=cfg.keep, async_save=cfg.async_save)

  @classmethod
  def paused(cls, location: epath.PathLike, cfg: ml_collections.ConfigDict) -> "Checkpointer":
    """Where a fine-tuning-style job (fine-tuning, MT-DNN, Sentence-BERT) keeps its train state and
    progress until it finishes: WORKDIR/paused."""
    return cls(workdir.path(location) / workdir.PAUSED, keep=cfg.keep, async_save=cfg.async_save,
               items=("progress",))

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(self, step: int, state: Any, *, force: bool = False, **items: Any) -> bool:
    args = {name: _ITEMS[name][0](items[name]) for name in self.items}
    if self._unconfirmed is not None:  # orbax waits for it inside save(): wait here, so a failure names its step
      self.wait()
    with self._saving(step):
      saved = self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state), **args),
                                force=force)
    self._unconfirmed = step if saved else self._unconfirmed
    return saved

  def restore(self, step: int, abstract_state: Any, **items: Any) -> dict[str, Any]:
    """{"state": the state in abstract_state's shardings, **items}; pass the input iterator as data=."""
    args = {name: _ITEMS[name][1](items.get(name)) for name in self.items}
    restored = self.manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state), **args))
    return {name: restored[name] for name in ("state",) + self.items}

  def restore_latest(self, abstract_state: Any, **items: Any) -> tuple[dict[str, Any], int] | None:
    """(restore's dict, step) of the latest step that restores to a finite state, or None.

    A step that fails is moved aside with a warning and the previous one is tried. A step's input
    position is restored with its state, so a failed step may have moved the iterator given as data=:
    the step restored sets it again, and when none is left it goes back to where it was (a run that
    starts over reads a fresh run's batches).
    """
    data = items.get("data") if "data" in self.items else None
    with tempfile.TemporaryDirectory() as before:
      if data is not None:
        data.save(before)
      for step in sorted(self.manager.all_steps(), reverse=True):
        try:
          restored = self.restore(step, abstract_state, **items)
          if not finite.tree_is_finite(restored["state"]):
            raise ValueError("the saved state holds NaN or Inf (a diverged run)")
          return restored, step
        except (UserError, DataError):
          raise
        except Exception as e:  # pylint: disable=broad-except  # any orbax/tensorstore read failure
          self._set_aside(step, e)
      if data is not None:
        data.restore(before)
    return None

  def _set_aside(self, step: int, error: Exception) -> None:
    damaged = self.directory.parent / f"{self.directory.name}-damaged"
    target = damaged / f"{step}-{int(time.time())}"
    reason = (str(error).strip().splitlines() or [""])[-1][:300]
    problem = f"checkpoint {self.directory / str(step)} cannot be restored ({type(error).__name__}: {reason})"
    if jax.process_count() > 1:  # the hosts would race to move it; one command by hand is safer
      raise UserError(f"{problem}; move it aside (mkdir -p {damaged} && mv {self.directory / str(step)} "
                      f"{target}) and rerun to resume from the previous step")
    damaged.mkdir(parents=True, exist_ok=True)
    (self.directory / str(step)).rename(target)
    self.manager.reload()
    print(f"warning: {problem}; moved it to {target}, falling back to the previous step", flush=True)

  def check_resumable(self, step: int, abstract_state: Any, saved_config: dict | None,
                      config: ml_collections.ConfigDict) -> None:
    """UserError (raised before a run writes anything) when `step`'s saved state does not fit
    `abstract_state`, naming the optimizer settings that differ from the saved run's config."""
    handler = ocp.StandardCheckpointHandler()
    try:
      tree = handler.metadata(self.directory / str(step) / "state")
    except Exception:  # pylint: disable=broad-except  # unreadable metadata: restore_latest reports it
      return
    finally:
      handler.close()
    saved, wanted = _leaf_shapes(tree), _leaf_shapes(abstract_state)
    if saved == wanted:
      return
    missing, extra = sorted(set(wanted) - set(saved)), sorted(set(saved) - set(wanted))
    reshaped = [k for k in wanted if k in saved and saved[k] != wanted[k]]
    before, now = (saved_config or {}).get("optimizer", {}), config.optimizer.to_dict()
    diffs = [f"optimizer.{k}: saved run {before[k]!r}, this config {now[k]!r}"
             for k in sorted(now) if k in before and before[k] != now[k]]
    detail = "; ".join(diffs) if diffs else (
        f"{len(missing)} entries missing, {len(extra)} unexpected, {len(reshaped)} of another shape, "
        f"e.g. {'/'.join(map(str, (missing or extra or reshaped)[0]))}")
    raise UserError(f"{self.directory / str(step)}: the saved train state does not fit this config "
                    f"({detail}); resume with the saved run's settings, or use another --workdir")

  @contextlib.contextmanager
  def _saving(self, step: int):
    try:
      yield
    except Exception as e:  # pylint: disable=broad-except  # orbax wraps the OSError in its own errors
      fault = orbax_faults.write_fault(e)
      if fault is None:
        raise
      self._broken = True
      failed = min(s for s in (self._unconfirmed, step) if s is not None)
      with contextlib.suppress(Exception):  # let orbax's other writer threads end before cleaning up
        self.manager.wait_until_finished()
      self._remove_partial_steps()
      intact = max((s for s in _complete_steps(self.directory) if s < failed), default=None)
      kept = f"checkpoints up to step {intact} are intact" if intact is not None else "no checkpoint was saved"
      if fault == errno.EFBIG:
        raise UserError(f"a file of step {failed} in {self.directory} grew past the file size limit (ulimit -f) "
                        f"while saving it; {kept}; raise the limit (ulimit -f unlimited) and rerun the same "
                        "command to resume") from None
      raise UserError(f"no space left in {self.directory.parent} while saving step {failed}; {kept}; free "
                      "space (or lower checkpoint.keep) and rerun the same command to resume") from None

  def wait(self) -> None:
    with self._saving(self._unconfirmed or 0):
      self.manager.wait_until_finished()
    self._unconfirmed = None

  def keep_newest(self) -> None:
    """Deletes the steps beyond the newest `keep`: orbax deletes the oldest after committing a new step,
    so a kill in between leaves one more, which a run resumed at its end (saving nothing) would keep."""
    for step in sorted(self.manager.all_steps())[:-self.keep]:
      self.manager.delete(step)

  def _remove_partial_steps(self) -> None:
    for leftover in self.directory.glob("*.orbax-checkpoint-tmp*"):
      leftover.rmtree(missing_ok=True)

  def close(self) -> None:
    if self._broken:  # after a failed save, orbax's close raises the same error again
      with contextlib.suppress(Exception):
        self.manager.close()
      self._remove_partial_steps()
      return
    with self._saving(self._unconfirmed or 0):
      self.manager.close()


def _key_names(path) -> tuple:
  return tuple(getattr(k, "key", getattr(k, "idx", getattr(k, "name", None))) for k in path)


def _leaf_shapes(tree: Any) -> dict[tuple, tuple]:
  """{key path as names: shape}, alike for a saved tree's metadata and an abstract state."""
  return {_key_names(p): tuple(x.shape) for p, x in jax.tree_util.tree_leaves_with_path(tree)}


def _complete_steps(directory: epath.Path) -> list[int]:
  return [int(p.name) for p in directory.iterdir() if p.name.isdigit()] if directory.exists() else []


def resume_paused(location: epath.PathLike, abstract_state: Any,
                  config: ml_collections.ConfigDict) -> tuple[Any, dict] | None:
  """A fine-tuning-style job's paused (state, progress) in `location`, checked against the run config it
  was saved with (WORKDIR/run_config.json, which the job rewrites only after this); None when there is
  none."""
  run_dir = workdir.path(location)
  if not (run_dir / workdir.PAUSED).exists():
    return None
  ckpt = Checkpointer.paused(run_dir, config.checkpoint)
  try:
    step, saved = ckpt.latest_step(), run_dir / workdir.RUN_CONFIG
    if step is None:
      return None
    ckpt.check_resumable(step, abstract_state, workdir.read_json(saved) if saved.exists() else None, config)
    restored = ckpt.restore_latest(abstract_state)
  finally:
    ckpt.close()
  if restored is None:
    return None
  print(f"resumed from {ckpt.directory / str(restored[1])}", flush=True)
  return restored[0]["state"], dict(restored[0]["progress"])
