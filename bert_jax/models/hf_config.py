"""A Hugging Face config.json read field by field, each as the type bert_jax expects: every family's
translation (`HFNames.read_config`, models/records/) reads through `HFConfig`, so a wrongly typed field
(`"hidden_size": "64"`) is one line naming the file, the field and the type, not a TypeError deep in a
config class.

JSON null is the field's default where it has one (transformers writes `"pad_token_id": null`,
`"mem_len": null`); a required field that is absent or null is refused. A float field takes an integer
(`"hidden_dropout_prob": 0`); an integer field takes no float, a bool no 0/1.
"""
from __future__ import annotations

import numbers
from typing import Any, Mapping

from bert_jax.errors import UserError

REQUIRED = object()  # the default of a field that must be there
_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string", list: "a list",
          dict: "an object"}


def _json_type(value: Any) -> str:
  """What JSON calls `value`'s type, in words."""
  if value is None:
    return "null"
  kind = next((k for k in (bool, int, float, str, list, dict) if isinstance(value, k)), None)
  return {**_NAMES, bool: "a boolean", float: "a float"}.get(kind, type(value).__name__)


def _is(value: Any, kind: type) -> bool:
  if kind is int:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)
  if kind is float:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)
  return isinstance(value, kind)


class HFConfig(Mapping):
  """config.json's fields (a read-only mapping of the raw values) with typed getters: `int`, `float`,
  `str`, `bool`, `list`, `dict` (key, default); without a default the field is required. `file` names
  the file in every message."""

  def __init__(self, values: Any, file: str):
    if not isinstance(values, dict):
      raise UserError(f"{file}: holds {_json_type(values)}, not a JSON object of config fields")
    self._values = values
    self.file = file

  def __getitem__(self, key: str) -> Any:
    return self._values[key]

  def __iter__(self):
    return iter(self._values)

  def __len__(self) -> int:
    return len(self._values)

  def typed(self, key: str, kind: type, default: Any = REQUIRED) -> Any:
    """config.json's `key` as `kind` (int, float, str, bool, list or dict); its default when absent or null."""
    value = self._values.get(key)
    if value is None:
      if default is REQUIRED:
        raise UserError(f"{self.file}: lacks {key} ({_NAMES[kind]})" if key not in self._values else
                        f"{self.file}: {key} is null; expected {_NAMES[kind]}")
      return default
    if not _is(value, kind):
      raise UserError(f"{self.file}: {key} is {value!r} ({_json_type(value)}); expected {_NAMES[kind]}")
    return float(value) if kind is float else value

  def int(self, key: str, default: Any = REQUIRED) -> int:
    return self.typed(key, int, default)

  def float(self, key: str, default: Any = REQUIRED) -> float:
    return self.typed(key, float, default)

  def str(self, key: str, default: Any = REQUIRED) -> str:
    return self.typed(key, str, default)

  def bool(self, key: str, default: Any = REQUIRED) -> bool:
    return self.typed(key, bool, default)

  def list(self, key: str, default: Any = REQUIRED) -> list:
    return self.typed(key, list, default)

  def dict(self, key: str, default: Any = REQUIRED) -> dict:
    return self.typed(key, dict, default)


def of(values: Any, file: str) -> HFConfig:
  """`values` as an HFConfig (kept as it is when it already is one)."""
  return values if isinstance(values, HFConfig) else HFConfig(values, file)
