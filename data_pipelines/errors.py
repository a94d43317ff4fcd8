"""Errors the input side raises for bad input: the message names the file or field and the fix."""


class DataError(ValueError):
  """An unusable corpus, vocabulary or data setting."""
