"""Parameters on disk: writing a params checkpoint, reading one (or a workdir's latest train state).

A *params checkpoint* (what `bert-jax convert` and `bert-jax grow` write, what a fine-tuning run keeps,
and what `init_from` accepts) is a directory with config.json, params/ (orbax, the params tree) and the
tokenizer files. A pretraining workdir or a checkpoint step directory serves as one too: its params
are the `params` of the latest train state.

`load_params_into` restores straight into the target's shardings (each host reads only its shards);
`load_params` restores the whole tree onto one device, for conversion and inspection; `check_intact`
reads a checkpoint whole before a job writes anything. Every reader here ends a damaged checkpoint
(arrays cut short, _METADATA or other files missing) or one holding NaN in one line naming it (UserError),
whichever command reads it.

A *delta* checkpoint (fine-tuning with train.mode=adapters) holds only the parameters that trained;
config.json's `base_checkpoint` names the checkpoint that holds the rest. Every reader here completes
it from there, so a delta serves wherever a full checkpoint does (init_from, predict, conversion).
"""
from __future__ import annotations

import contextlib
import errno
import logging
import os
from typing import Any, Callable, Iterable

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from bert_jax import orbax_faults, workdir
from bert_jax.errors import UserError
from bert_jax.ops import finite, lowbit


BASE = "base_checkpoint"
MULTITASK_HEADS = "task_heads"  # a multi-task (MT-DNN) checkpoint's heads by task (finetune/multitask.py)
orbax_faults.install()


def one_task(params: dict, config: dict, task: str | None, source: str) -> tuple[dict, dict]:
  """A multi-task checkpoint (finetune/multitask.py: the heads under task_heads, config.json's task.heads)
  as the single-task checkpoint of `task` (its head as `head`, its task block as `task`), so predict and
  export read it as a fine-tuning workdir; any other checkpoint as it is, when no task is asked for."""
  heads = (config.get("task") or {}).get("heads")
  if heads is None or MULTITASK_HEADS not in params:
    if task:
      raise UserError(f"{source} is not a multi-task checkpoint (bert-jax finetune --config configs/mtdnn.py): "
                      "--task takes one")
    return params, config
  if task not in heads:
    raise UserError(f"{source} is a multi-task checkpoint: choose its task with --task NAME, one of {sorted(heads)}"
                    + (f" (not {task!r})" if task else ""))
  block = {k: v for k, v in config["mtdnn"]["tasks"][task].items() if k != "data_dir"}
  config = {**config, "task": {**block, **heads[task]}}
  return {**{k: v for k, v in params.items() if k != MULTITASK_HEADS}, "head": params[MULTITASK_HEADS][task]}, config


def whole_array_writes() -> None:
  """With one process, orbax writes each array whole rather than one slice per device holding a copy.

  orbax's replica-parallel writes split a replicated array among the hosts that hold a copy. With one
  process there is no one to share with, and it only slices each array per local device, one eager op
  per array and device: on 8 CPU devices, 5.7 s of a 4-step tiny run's first save (0.08 s without), and
  4.0-4.7 MB on disk for 3.3 MB of arrays. Several processes keep orbax's default. Call after
  jax.distributed is initialised (it asks jax.process_count()), before saving."""
  wanted = jax.process_count() > 1
  if getattr(ocp.type_handlers.get_type_handler(jax.Array), "_use_replica_parallel", None) == wanted:
    return
  absl_log = logging.getLogger("absl")  # orbax warns of the override: ours, and said above
  level = absl_log.level
  absl_log.setLevel(logging.ERROR)
  try:
    ocp.type_handlers.register_type_handler(
        jax.Array, ocp.type_handlers.ArrayHandler(use_replica_parallel=wanted), override=True)
  finally:
    absl_log.setLevel(level)


def save_params(directory: epath.PathLike, params: Any, config: dict,
                tokenizer_files: dict[str, str] | None = None) -> None:
  """Writes a params checkpoint: config.json, params/ and the tokenizer files {name: source path}.
  A delta's config carries BASE: the location of the checkpoint with the other parameters."""
  directory = workdir.create(directory, "the output directory")
  whole_array_writes()
  try:
    with ocp.StandardCheckpointer() as ckptr:  # with several processes, all of them call this
      ckptr.save(directory / workdir.PARAMS, params, force=True)
  except Exception as e:  # pylint: disable=broad-except  # orbax wraps the OSError in its own errors
    fault = orbax_faults.write_fault(e)
    if fault is None:
      raise
    for partial in directory.glob(f"{workdir.PARAMS}*"):
      partial.rmtree(missing_ok=True)
    raise workdir.write_error(directory / workdir.PARAMS, OSError(fault, os.strerror(fault))) from None
  if jax.process_index() == 0:
    workdir.write_json(directory / workdir.CONFIG, config)
    workdir.write_tokenizer(directory, tokenizer_files)


@contextlib.contextmanager
def _reading(location: epath.PathLike):
  """orbax's and tensorstore's errors while reading the checkpoint at `location` as one line naming it."""
  try:
    yield
  except (UserError, MemoryError):
    raise
  except Exception as e:  # pylint: disable=broad-except  # FileNotFoundError, tensorstore's ValueError, ...
    cause = " ".join(str(e).split()) or type(e).__name__
    cause = cause if len(cause) <= 160 else cause[:157] + "..."
    raise UserError(f"{location}: the checkpoint cannot be read ({cause}): a damaged or incomplete copy (files "
                    "missing or cut short)? copy it again, or give another checkpoint") from None


def _latest_step_dir(managed: epath.Path) -> epath.Path:
  with _reading(managed.parent):
    manager = ocp.CheckpointManager(managed)
    step = manager.latest_step()
    manager.close()
  if step is None:
    raise UserError(f"{managed.parent}: the workdir has no checkpoint yet")
  return managed / str(step)


def params_location(location: epath.PathLike) -> tuple[epath.Path, tuple[str, ...]]:
  """The orbax tree that holds the params at `location`, and the params' key path inside it."""
  location = workdir.path(location)
  if (location / workdir.PARAMS).exists():
    return location / workdir.PARAMS, ()
  step_dir = location
  for managed in (workdir.CHECKPOINTS, workdir.PAUSED):
    if (location / managed).exists():
      step_dir = _latest_step_dir(location / managed)
      break
  if not (step_dir / "state").exists():
    raise UserError(f"{location}: neither params/ nor checkpoints/<step>/state found")
  return step_dir / "state", ("params",)


def _subtree(tree: Any, keys: tuple[str, ...]) -> Any:
  for key in keys:
    tree = tree[key]
  return tree


def base_checkpoint(location: epath.PathLike) -> str | None:
  """The checkpoint that completes the delta checkpoint at `location`; None for a full checkpoint."""
  location = workdir.path(location)
  if not (location / workdir.PARAMS).exists():
    return None
  base = workdir.read_config(location).get(BASE)
  if base and not workdir.path(base).exists():
    raise UserError(f"{location} holds only the parameters its fine-tuning trained (adapters); the rest "
                    f"are in {base}, which is not there: put that checkpoint back at that path")
  return base or None


def _overlay(base: dict, delta: dict) -> dict:
  """base with delta's leaves put in (nested dicts)."""
  out = dict(base)
  for key, value in delta.items():
    out[key] = _overlay(out.get(key, {}), value) if isinstance(value, dict) else value
  return out


def _completed(base: dict, delta: dict) -> dict:
  """A delta's parameters with its frozen ones put in from its base's params.

  Each top-level module of the fine-tuned model holds something that trained (a LayerNorm, the pooler,
  the head), so the delta's top-level keys are the model's: the base's others (its pretraining heads,
  a pooler the task's head does not read) are no part of it.
  """
  return _overlay({key: value for key, value in base.items() if key in delta}, delta)


def _restore_on_host(tree_path: epath.Path, keys: tuple[str, ...]) -> Any:
  """The subtree at `keys` (the params of a train state; nothing else is read) as NumPy arrays, whatever
  devices and shardings saved it: a pod's checkpoint loads on a laptop and on a slice of another shape."""
  wanted = _subtree(_saved_tree(tree_path), keys)
  with ocp.PyTreeCheckpointer() as ckptr:
    item = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype), wanted)  # the structure; no buffers
    restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), wanted)
    for key in reversed(keys):
      item, restore_args = {key: item}, {key: restore_args}
    restored = ckptr.restore(tree_path, args=ocp.args.PyTreeRestore(item=item, restore_args=restore_args,
                                                                     partial_restore=True))
  return _subtree(restored, keys)


def load_params(location: epath.PathLike) -> tuple[Any, dict]:
  """(params, config) from a params checkpoint, a workdir (latest step) or a step directory; int8
  weights (an int8 checkpoint) come back as float32 on their int8 grid."""
  config = workdir.read_config(location)
  tree_path, keys = params_location(location)
  with _reading(location):
    params = _restore_on_host(tree_path, keys)
  finite.check_params_finite(params, str(location))
  if config.get("quantization"):  # `bert-jax quantize`'s int8 or packed weights, back on their grid in float32
    params = lowbit.dequantize_params(params)
  base = base_checkpoint(location)
  return (params if base is None else _completed(load_params(base)[0], params)), config


def _saved_tree(tree_path: epath.Path) -> Any:
  """The saved tree's metadata. Read through the handler: a Checkpointer would also look for the step's
  _CHECKPOINT_METADATA, which a CheckpointManager keeps one level up, and log a warning for each read."""
  handler = ocp.PyTreeCheckpointHandler()
  try:
    return handler.metadata(epath.Path(tree_path)).tree
  finally:
    handler.close()


def _own_metadata(location: epath.PathLike) -> Any:
  tree_path, keys = params_location(location)
  with _reading(location):
    return jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype), _subtree(_saved_tree(tree_path), keys))


def check_intact(location: epath.PathLike, what: str) -> dict:
  """The config.json of the checkpoint at `location`, once its parameters have all been read and found
  finite: a job checks what it will read (`what`: the setting that names it) before it writes anything.
  The arrays are read on the host and dropped; the job reads them again where it needs them."""
  try:
    return load_params(location)[1]
  except UserError as e:
    raise UserError(f"{what}: {e}") from None


def params_metadata(location: epath.PathLike) -> Any:
  """The checkpoint's params tree with jax.ShapeDtypeStruct leaves: shapes and dtypes, no data read."""
  base = base_checkpoint(location)
  own = _own_metadata(location)
  return own if base is None else _completed(params_metadata(base), own)


def _flat(tree: Any) -> dict[str, Any]:
  return {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_leaves_with_path(tree)}


def check_shapes(params: Any, abstract: Any, source: str) -> None:
  """Raises UserError naming every missing, unexpected or mis-shaped parameter."""
  flat, want = _flat(params), _flat(abstract)
  problems = [f"missing {k}" for k in want if k not in flat]
  problems += [f"unexpected {k}" for k in flat if k not in want]
  problems += [f"{k}: checkpoint {tuple(flat[k].shape)} vs model {tuple(want[k].shape)}"
               for k in want if k in flat and tuple(flat[k].shape) != tuple(want[k].shape)]
  if problems:
    shown = "; ".join(problems[:6]) + (f"; ... {len(problems) - 6} more" if len(problems) > 6 else "")
    raise UserError(f"{source} does not fit the model: {shown}")


def _nest(flat_items: Iterable[tuple[tuple, Any]]) -> dict:
  """{key path: leaf} -> the nested dict of those leaves (params trees are nested dicts)."""
  tree: dict = {}
  for key_path, leaf in flat_items:
    node = tree
    for key in key_path[:-1]:
      node = node.setdefault(key.key, {})
    node[key_path[-1].key] = leaf
  return tree


def load_params_into(location: epath.PathLike, target: Any, keep: Iterable[str] | None = None,
                     wanted: Callable[[str], bool] = lambda name: True) -> Any:
  """`target` with the parameters the checkpoint at `location` has, restored into target's shardings.

  target: the model's params tree; its leaves (arrays, or jax.ShapeDtypeStruct with shardings) give
  each restored array's shape, dtype and sharding. keep: the top-level names to take from the
  checkpoint (default: all). A kept parameter the checkpoint lacks (a head it was saved without) keeps
  the target's value, a fresh init: stdout says how many tensors loaded and which start fresh; an
  abstract one is an error, and so is a checkpoint holding none of them (another family's). Parameters
  only the checkpoint has are not read; a shape mismatch is an error naming the tensor and both shapes.
  wanted: which leaves (by jax.tree_util.keystr name) to restore at all; the others keep target's value.
  """
  keep = None if keep is None else set(keep)
  leaves = _selected(target, keep, wanted)
  if leaves:
    _check_fit(location, _flat(params_metadata(location)), leaves)
  return _load_into(location, target, keep, wanted)


def _selected(target: Any, keep: set[str] | None, wanted: Callable[[str], bool]) -> list[tuple[str, tuple, Any]]:
  """(name, key path, leaf) of target's leaves under the `keep` modules that `wanted` accepts."""
  return [(jax.tree_util.keystr(k), k, v) for k, v in jax.tree_util.tree_leaves_with_path(target)
          if (keep is None or k[0].key in keep) and wanted(jax.tree_util.keystr(k))]


def _check_fit(location: epath.PathLike, saved: dict[str, Any], leaves: list[tuple[str, tuple, Any]]) -> None:
  """UserError when the checkpoint's tensors (`saved`) cannot fill `leaves` (name, key path, leaf): quantized,
  a shape that differs, none of them there, or an abstract one missing; a line naming those that start fresh."""
  if any(name.endswith(("['qvalue']", "['packed']")) for name in saved):
    raise UserError(f"{location} holds quantized weights (bert-jax quantize): predict with it, and fine-tune, "
                    "distill or quantize from the float model it was made from")
  mismatched = [f"{name}: checkpoint {tuple(saved[name].shape)} vs model {tuple(v.shape)}"
                for name, _, v in leaves if name in saved and tuple(saved[name].shape) != tuple(v.shape)]
  if mismatched:
    raise UserError(f"{location} does not fit the model: {'; '.join(mismatched[:6])}")
  modules: dict[str, list[int]] = {}  # top-level module: [tensors missing, tensors]
  for name, k, _ in leaves:
    counts = modules.setdefault(jax.tree_util.keystr(k[:1]), [0, 0])
    counts[0] += name not in saved
    counts[1] += 1
  missing = sum(m for m, _ in modules.values())
  if missing == len(leaves):
    theirs = sorted({name.split("]")[0] + "]" for name in saved})
    raise UserError(f"{location} holds none of the model's {len(leaves)} parameter tensors (the model's modules: "
                    f"{', '.join(modules)}; the checkpoint's: {', '.join(theirs)}): it is a checkpoint of another "
                    "model family or layout")
  if not missing:
    return
  fresh = [key if m == n else f"{key} ({m} of {n} tensors)" for key, (m, n) in sorted(modules.items()) if m]
  if any(isinstance(v, jax.ShapeDtypeStruct) for _, _, v in leaves):
    raise UserError(f"{location} does not fit the model: no weights for {', '.join(fresh)}")
  print(f"{location}: {len(leaves) - missing} of {len(leaves)} parameter tensors loaded; no weights for "
        f"{', '.join(fresh)}: those {missing} start from a fresh init", flush=True)


def _load_into(location: epath.PathLike, target: Any, keep: set[str] | None,
               wanted: Callable[[str], bool]) -> Any:
  """load_params_into for the leaves whose names `wanted` accepts: a delta's own leaves from it, the
  others from its base."""
  base = base_checkpoint(location)
  if base is None:
    return _restore_into(location, target, keep, wanted)
  own = set(_flat(_own_metadata(location)))
  target = _load_into(base, target, keep, lambda name: wanted(name) and name not in own)
  return _restore_into(location, target, keep, lambda name: wanted(name) and name in own)


def _restore_into(location: epath.PathLike, target: Any, keep: set[str] | None,
                  wanted: Callable[[str], bool]) -> Any:
  """The leaves `wanted` accepts that the checkpoint at `location` itself holds (load_params_into has
  checked that they fit)."""
  saved = _flat(_own_metadata(location))
  leaves = _selected(target, keep, wanted)
  items = _nest((k, jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=getattr(v, "sharding", None)))
                for name, k, v in leaves if name in saved)
  if not items:
    return target
  tree_path, keys = params_location(location)
  for key in reversed(keys):
    items = {key: items}
  with _reading(location), ocp.PyTreeCheckpointer() as ckptr:
    restored = ckptr.restore(tree_path, args=ocp.args.PyTreeRestore(
        item=items, restore_args=ocp.checkpoint_utils.construct_restore_args(items), partial_restore=True))
  restored = _subtree(restored, keys)
  finite.check_params_finite(restored, str(location))
  flat_restored = _flat(restored)
  return jax.tree_util.tree_map_with_path(
      lambda k, v: flat_restored.get(jax.tree_util.keystr(k), v), target)
