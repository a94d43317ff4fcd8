"""Loading `configs/<family>.py:<arg>` files and applying `--config.a.b=value` overrides.

The config file is a plain Python module with `get_config(arg) -> ml_collections.ConfigDict`. Paths are
resolved against the working directory first and then against the installed project, so
`--config configs/bert.py:tiny` works from the repo root and from anywhere after `pip install -e .`.
"""
from __future__ import annotations

import ast
import difflib
import importlib.util
import math
import os
import traceback
from typing import Any, Sequence

import ml_collections

from bert_jax.errors import UserError

_PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PACKAGE_ROOT = os.path.dirname(os.path.abspath(__file__))  # holds configs/ in a non-editable install


def _resolve_path(path: str) -> str:
  """The config file: as given, else under the project checkout, else under the installed package."""
  folders = list(dict.fromkeys(os.path.abspath(d) for d in (os.getcwd(), _PROJECT_ROOT, _PACKAGE_ROOT)))
  for candidate in [path] + [os.path.join(d, path) for d in folders[1:]]:
    if os.path.isfile(candidate):
      return candidate
  raise UserError(f"config file {path!r} not found (looked in {', '.join(folders)}); "
                  "pass e.g. --config configs/bert.py:tiny")


def load_config_file(spec: str) -> ml_collections.ConfigDict:
  """`path/to/file.py[:arg]` -> the ConfigDict its `get_config(arg)` returns (unlocked)."""
  path, _, arg = spec.partition(":")
  path = _resolve_path(path)
  module_spec = importlib.util.spec_from_file_location(
      f"bert_jax_config_{abs(hash(path))}", path)
  module = importlib.util.module_from_spec(module_spec)
  try:
    module_spec.loader.exec_module(module)
  except SyntaxError as e:
    raise UserError(f"{e.filename or path}, line {e.lineno}: {e.msg} (a syntax error in the config file)") from None
  except Exception as e:  # pylint: disable=broad-except  # any error in the user's file: name where
    raise UserError(f"{_where(e, path)}: {type(e).__name__}: {e} (while loading the config file)") from None
  if not callable(getattr(module, "get_config", None)):
    raise UserError(f"{path}: defines no get_config(arg) function")
  try:
    return module.get_config(arg) if arg else module.get_config()
  except KeyError as e:
    raise UserError(f"{path}: unknown preset {arg!r}; {e.args[0] if e.args else ''}") from None
  except UserError:
    raise
  except Exception as e:  # pylint: disable=broad-except
    raise UserError(f"{_where(e, path)}: {type(e).__name__}: {e} (in get_config)") from None


def _where(error: Exception, path: str) -> str:
  """`path, line N` of the deepest traceback frame inside the config file."""
  lines = [frame.lineno for frame in traceback.extract_tb(error.__traceback__)
           if os.path.abspath(frame.filename) == os.path.abspath(path)]
  return f"{path}, line {lines[-1]}" if lines else path


def _parse_value(text: str, current: Any) -> Any:
  """Parses `text` as the type of the value it replaces (strings stay verbatim)."""
  if isinstance(current, str):
    return text
  if isinstance(current, bool):
    lowered = text.lower()
    if lowered in ("true", "1", "yes"):
      return True
    if lowered in ("false", "0", "no"):
      return False
    raise ValueError(f"expected true/false, got {text!r}")
  try:
    value = ast.literal_eval(text)
  except (ValueError, SyntaxError):
    if current is None:
      return text
    raise ValueError(f"cannot parse {text!r} as {type(current).__name__}") from None
  if isinstance(current, float) and isinstance(value, int) and not isinstance(value, bool):
    value = float(value)
  if isinstance(current, tuple) and isinstance(value, list):
    value = tuple(value)
  if current is not None and not isinstance(value, type(current)):
    raise ValueError(f"expected {type(current).__name__}, got {text!r}")
  if isinstance(value, float) and not math.isfinite(value):  # 1e309 parses as inf: no field means that
    raise ValueError(f"{text!r} is {value}; expected a finite number")
  return value


def _did_you_mean(config: ml_collections.ConfigDict, key: str) -> str:
  """' (did you mean config.a.b?)' for the closest existing dotted key, or ''."""
  def flat(node, prefix=""):
    for name, value in node.items():
      yield from flat(value, f"{prefix}{name}.") if isinstance(value, ml_collections.ConfigDict) else [prefix + name]
  close = difflib.get_close_matches(key, list(flat(config)), n=1, cutoff=0.6)
  if not close:  # a right leaf under a wrong section: train.learning_rate -> optimizer.learning_rate
    leaf = key.rsplit(".", 1)[-1]
    close = [k for k in flat(config) if k.rsplit(".", 1)[-1] == leaf][:1]
  return f" (did you mean config.{close[0]}?)" if close else ""


def apply_overrides(config: ml_collections.ConfigDict, overrides: Sequence[str]) -> None:
  """Applies `--config.a.b=value` (or `a.b=value`) strings; unknown keys are errors."""
  for item in overrides:
    key, sep, text = item.removeprefix("--").removeprefix("config.").partition("=")
    if not sep:
      raise UserError(f"override {item!r} has no value; write --config.{key}=VALUE")
    *parents, leaf = key.split(".")
    node = config
    for i, part in enumerate(parents):
      if not isinstance(node, ml_collections.ConfigDict) or part not in node:
        raise UserError(f"unknown config key {'.'.join(parents[:i + 1])!r} in {item!r}"
                        f"{_did_you_mean(config, key)}")
      node = node[part]
    if not isinstance(node, ml_collections.ConfigDict) or leaf not in node:
      known = ", ".join(sorted(node.keys())) if isinstance(node, ml_collections.ConfigDict) else ""
      raise UserError(f"unknown config key {key!r}{_did_you_mean(config, key)}; known keys here: {known}")
    try:
      value = _parse_value(text, node[leaf])
    except ValueError as e:
      raise UserError(f"bad value for config.{key}: {e}") from None
    with node.ignore_type():
      node[leaf] = value


def load_config(spec: str, overrides: Sequence[str] = ()) -> ml_collections.ConfigDict:
  """Loads, overrides and locks a config: afterwards a typo'd key raises instead of adding a key.

  spec: `FILE:PRESET` as `--config` takes it (`configs/bert.py:demo`; a file of the working directory, the
  checkout or the installed package); overrides: `--config.SECTION.KEY=VALUE` strings, as on the command
  line. A misspelled key or a bad value raises UserError naming it.
  """
  config = load_config_file(spec)
  apply_overrides(config, overrides)
  _masked_positions(config, overrides)
  config.lock()
  return config


def _masked_positions(config: ml_collections.ConfigDict, overrides: Sequence[str]) -> None:
  """data.max_predictions_per_seq: 0 becomes the rate's count at the length (data_pipelines/masking.py), so every
  reader of the config sees it. A preset's own number was chosen for its length and rate: with either overridden
  and it left as it was, a number that would cut the rate is one line instead of a silently lower rate."""
  data = config.get("data")
  if not isinstance(data, ml_collections.ConfigDict) or not {"mask_rate", "max_predictions_per_seq"} <= set(data):
    return
  from bert_jax.data_pipelines import masking  # pylint: disable=import-outside-toplevel  # (no TensorFlow)
  changed = {item.removeprefix("--").removeprefix("config.").partition("=")[0] for item in overrides}
  if not data.max_predictions_per_seq:
    data.max_predictions_per_seq = masking.predictions_per_seq(data)
  elif "data.max_predictions_per_seq" not in changed and changed & {"data.max_seq_length", "data.mask_rate"}:
    masking.check_predictions(data)

