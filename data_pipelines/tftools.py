"""The one place TensorFlow is imported: lazily, with GPUs hidden so TF never grabs memory JAX needs."""
import functools


@functools.cache
def tf():
  import tensorflow  # pylint: disable=import-outside-toplevel
  try:
    tensorflow.config.set_visible_devices([], "GPU")
  except RuntimeError:  # devices already initialised by an earlier TF user in this process
    pass
  return tensorflow


def open_binary(path: str, mode: str = "rb"):
  """Local paths through the builtin `open` (much faster per line); URLs (gs://, ...) through gfile."""
  if "://" in path:
    return tf().io.gfile.GFile(path, mode)
  return open(path, mode)  # pylint: disable=consider-using-with,unspecified-encoding
