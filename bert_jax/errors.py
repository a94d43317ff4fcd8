"""The one exception type the CLI turns into a single readable line instead of a traceback."""
from __future__ import annotations

import importlib
from types import ModuleType


class UserError(ValueError):
  """Bad input from the user: a config key, a path, a shape. The message names the problem and the fix."""


def require(module: str, extra: str, purpose: str) -> ModuleType:
  """Imports an optional dependency, or raises UserError naming the extra that installs it."""
  try:
    return importlib.import_module(module)
  except ImportError as e:
    raise UserError(f"{purpose} needs the optional package {module.split('.')[0]!r} ({e}); install it with "
                    f"python3 -m pip install 'bert_jax[{extra}]'") from None
