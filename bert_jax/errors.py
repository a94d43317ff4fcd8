"""The one exception type the CLI turns into a single readable line instead of a traceback."""


class UserError(ValueError):
  """Bad input from the user: a config key, a path, a shape. The message names the problem and the fix."""
