"""Checkpoints: the train state and the input position, saved together with orbax.

Layout of a workdir:
  WORKDIR/config.json                     the resolved config of the run
  WORKDIR/checkpoints/<step>/state        TrainState (orbax StandardSave, sharded arrays)
  WORKDIR/checkpoints/<step>/data         each process's input position (data_state.process*.json)

A *params checkpoint* (what `bert-jax convert` and `bert-jax grow` write, and what `init_from` also
accepts) is a directory with `config.json` and `params/` (orbax StandardSave of the params tree),
plus the tokenizer files when known.

Where a run starts from is decided in one place, `restore_or_init`: its own latest checkpoint, else
`config.init_from`, else a fresh init.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax
import ml_collections
import orbax.checkpoint as ocp
from etils import epath

from bert_jax.errors import UserError


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


def _model_dict(config: ml_collections.ConfigDict | dict) -> dict:
  d = config.to_dict() if isinstance(config, ml_collections.ConfigDict) else dict(config)
  return {"objective": d.get("objective", "bert"), **d["model"]}


def check_same_model(workdir: str, config: ml_collections.ConfigDict) -> None:
  """A workdir holding a checkpoint of another model is an error, not a silent shape crash."""
  path = os.path.join(workdir, "config.json")
  if not os.path.exists(path):
    return
  with open(path) as f:
    saved = _model_dict(json.load(f))
  current = _model_dict(config)
  shape_keys = ("objective", "vocab_size", "hidden_size", "num_layers", "num_heads",
                "intermediate_size", "max_position_embeddings", "type_vocab_size", "embedding_size",
                "share_layers", "sentence_head", "scan_layers", "mlm_head", "use_pooler")
  diffs = [f"model.{k}: checkpoint {saved.get(k)!r} vs config {current.get(k)!r}"
           for k in shape_keys if saved.get(k) != current.get(k)]
  if diffs:
    raise UserError(f"workdir {workdir} holds a checkpoint of a different model ({'; '.join(diffs)}); "
                    "use another --workdir, or match the config")


class Checkpointer:
  """Periodic async saves of (state, data position), keep-last-N, restore the latest."""

  def __init__(self, workdir: str, cfg: ml_collections.ConfigDict):
    options = ocp.CheckpointManagerOptions(max_to_keep=cfg.keep,
                                           enable_async_checkpointing=cfg.async_save)
    self.manager = ocp.CheckpointManager(os.path.abspath(os.path.join(workdir, "checkpoints")),
                                         options=options, item_names=("state", "data"))

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(self, step: int, state: Any, data_iterator: Any, *, force: bool = False) -> bool:
    return self.manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), data=DataPositionSave(data_iterator)), force=force)

  def restore(self, step: int, abstract_state: Any, data_iterator: Any) -> Any:
    restored = self.manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state), data=DataPositionRestore(data_iterator)))
    return restored.state

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.close()


def save_params(directory: str, params: Any, config: dict, tokenizer_files: dict[str, str] | None = None
                ) -> None:
  """Writes a params checkpoint: config.json, params/ and the tokenizer files {name: source path}."""
  directory = os.path.abspath(directory)
  os.makedirs(directory, exist_ok=True)
  with ocp.StandardCheckpointer() as ckptr:
    ckptr.save(os.path.join(directory, "params"), params, force=True)
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump(config, f, indent=2, sort_keys=True)
  for name, source in (tokenizer_files or {}).items():
    with open(source, "rb") as src, open(os.path.join(directory, name), "wb") as dst:
      dst.write(src.read())


def _restore_tree(path: str, abstract: Any | None) -> Any:
  with ocp.StandardCheckpointer() as ckptr:
    if abstract is None:
      return ckptr.restore(path)
    return ckptr.restore(path, abstract)


def load_params(path: str, abstract_params: Any | None = None) -> tuple[Any, dict]:
  """Params and config from a params checkpoint, a workdir (latest step) or a step directory.

  With `abstract_params` (jax.ShapeDtypeStruct leaves, optionally with shardings) the arrays are
  restored into those shapes and shardings; mismatches are reported by name.
  """
  path = os.path.abspath(path)
  config_path = next((p for p in (os.path.join(path, "config.json"),
                                  os.path.join(path, os.pardir, os.pardir, "config.json"))
                      if os.path.exists(p)), None)
  if config_path is None:
    raise UserError(f"{path}: no config.json found; expected a bert_jax workdir or params checkpoint")
  with open(config_path) as f:
    config = json.load(f)
  if os.path.isdir(os.path.join(path, "params")):
    saved = _restore_tree(os.path.join(path, "params"), None)
  else:
    step_dir = path
    if os.path.isdir(os.path.join(path, "checkpoints")):
      manager = ocp.CheckpointManager(os.path.join(path, "checkpoints"))
      step = manager.latest_step()
      manager.close()
      if step is None:
        raise UserError(f"{path}: the workdir has no checkpoint yet")
      step_dir = os.path.join(path, "checkpoints", str(step))
    if not os.path.isdir(os.path.join(step_dir, "state")):
      raise UserError(f"{path}: neither params/ nor checkpoints/<step>/state found")
    saved = _restore_tree(os.path.join(step_dir, "state"), None)["params"]
  if abstract_params is not None:
    check_shapes(saved, abstract_params, path)
    saved = jax.tree.map(lambda x, a: jax.device_put(x.astype(a.dtype), getattr(a, "sharding", None)),
                         saved, abstract_params)
  return saved, config


def check_shapes(params: Any, abstract: Any, source: str) -> None:
  """Raises UserError naming every missing, unexpected or mis-shaped parameter."""
  flat = {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_leaves_with_path(params)}
  want = {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_leaves_with_path(abstract)}
  problems = [f"missing {k}" for k in want if k not in flat]
  problems += [f"unexpected {k}" for k in flat if k not in want]
  problems += [f"{k}: checkpoint {tuple(flat[k].shape)} vs model {tuple(want[k].shape)}"
               for k in want if k in flat and tuple(flat[k].shape) != tuple(want[k].shape)]
  if problems:
    shown = "; ".join(problems[:6]) + (f"; ... {len(problems) - 6} more" if len(problems) > 6 else "")
    raise UserError(f"{source} does not fit the model: {shown}")


def load_params_into(path: str, init_params: Any) -> Any:
  """`init_params` with every parameter the checkpoint at `path` has, placed in the same shardings.

  Parameters the checkpoint lacks (a head it was saved without) keep their fresh init and are named
  on stdout; parameters only the checkpoint has (a head this model does not use) are dropped; a shape
  mismatch is an error naming the tensor and both shapes.
  """
  saved, _ = load_params(path)
  flat_saved = {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_leaves_with_path(saved)}
  leaves = [(jax.tree_util.keystr(k), k, v) for k, v in jax.tree_util.tree_leaves_with_path(init_params)]
  mismatched = [f"{name}: checkpoint {tuple(flat_saved[name].shape)} vs model {tuple(v.shape)}"
                for name, _, v in leaves
                if name in flat_saved and tuple(flat_saved[name].shape) != tuple(v.shape)]
  if mismatched:
    raise UserError(f"{path} does not fit the model: {'; '.join(mismatched[:6])}")
  fresh = sorted({jax.tree_util.keystr(k[:1]) for name, k, _ in leaves if name not in flat_saved})
  if fresh:
    print(f"{path}: no weights for {', '.join(fresh)}; those start from a fresh init", flush=True)

  def pick(key_path, leaf):
    value = flat_saved.get(jax.tree_util.keystr(key_path))
    if value is None:
      return leaf
    return jax.device_put(value.astype(leaf.dtype), leaf.sharding)

  return jax.tree_util.tree_map_with_path(pick, init_params)
