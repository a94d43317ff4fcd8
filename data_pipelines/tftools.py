"""The one place TensorFlow is imported (every module that needs it calls `tf()`, and `tf_module(name)`
for a package that imports TensorFlow itself): lazily, with GPUs hidden so TF never grabs memory JAX
needs. Also where a corpus or vocabulary at a URL is opened."""
import contextlib
import functools
import importlib
import importlib.abc
import io
import os
import sys

from etils import epath


@contextlib.contextmanager
def _quiet_native_stderr():
  """Drops what C++ writes to fd 2 meanwhile (absl/oneDNN/CUDA start-up notes that ignore TF_CPP_MIN_LOG_LEVEL)."""
  sys.stderr.flush()
  saved = os.dup(2)
  devnull = os.open(os.devnull, os.O_WRONLY)
  try:
    os.dup2(devnull, 2)
    yield
  finally:
    os.dup2(saved, 2)
    os.close(saved)
    os.close(devnull)


class _KerasHidden(ImportError, ValueError):
  """Raised for keras while TensorFlow starts: an ImportError to `import`, a ValueError to the
  `importlib.util.find_spec` with which TensorFlow looks for it; both it takes as "no Keras"."""


class _HideKeras(importlib.abc.MetaPathFinder):

  def find_spec(self, name, path=None, target=None):
    if name == "keras" or name.startswith("keras."):
      raise _KerasHidden(f"{name} is not imported while TensorFlow starts (bert_jax/data_pipelines/tftools.py)")


@contextlib.contextmanager
def _without_keras():
  """TensorFlow imports Keras 3 as it starts, for `tf.keras` and SavedModel's Keras optimizers, and Keras was
  ~40% of TensorFlow's import: 9.5-11.6 s with it, 5.1-6.9 s without (3 alternating imports each on 2 busy
  cores, 2026-11-29). `tf.keras` still imports it when first used: a training run with TensorBoard on does,
  through clu's TensorBoard writer (tensorboard's hparams plugin subclasses a Keras callback; training/metrics.py
  imports clu's writers only then); processes that only build rows (data workers, `data preview`, `predict`),
  runs with train.tensorboard=false and processes other than 0 no longer do. Not hidden where this process
  imported Keras already."""
  if "keras" in sys.modules:
    yield
    return
  finder = _HideKeras()
  sys.meta_path.insert(0, finder)
  try:
    yield
  finally:
    sys.meta_path.remove(finder)


@functools.cache
def tf():
  # The CLI sets TF_CPP_MIN_LOG_LEVEL=3 unless the user chose a level: then TF's start-up notes go too.
  quiet = os.environ.get("TF_CPP_MIN_LOG_LEVEL") == "3"
  with _quiet_native_stderr() if quiet else contextlib.nullcontext(), _without_keras():
    import tensorflow  # pylint: disable=import-outside-toplevel
    try:
      tensorflow.config.set_visible_devices([], "GPU")
      tensorflow.config.list_logical_devices()  # initialise devices now, while the notes are dropped
    except RuntimeError:  # devices already initialised by an earlier TF user in this process
      pass
  return tensorflow


@functools.cache
def tf_module(name: str):
  """A module of a package built on TensorFlow (tensorflow_datasets, tensorflow_text, clu's writers),
  imported after `tf()`, so TensorFlow starts here with its accelerators hidden and its notes quiet."""
  tf()
  return importlib.import_module(name)


class _RawURLFile(io.RawIOBase):
  """A file opened through etils.epath as a raw stream: gfile's and gcsfs's file objects have no
  `readline(size)`, which the corpus reader needs to bound a line; io.BufferedReader over this has."""

  def __init__(self, f):
    super().__init__()
    self._f = f

  def readable(self) -> bool:
    return True

  def seekable(self) -> bool:
    return True

  def readinto(self, buffer) -> int:
    data = self._f.read(len(buffer))
    buffer[:len(data)] = data
    return len(data)

  def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
    self._f.seek(offset, whence)
    return self._f.tell()

  def tell(self) -> int:
    return self._f.tell()

  def close(self) -> None:
    if not self.closed:
      self._f.close()
    super().close()


def open_binary(path: str):
  """A file to read: local paths through the builtin `open` (much faster per line); URLs (gs://, ...)
  through etils.epath (TF's gfile, or gcsfs with EPATH_USE_TF=false)."""
  if "://" in path:
    return io.BufferedReader(_RawURLFile(epath.Path(path).open("rb")), buffer_size=1 << 20)
  return open(path, "rb")  # pylint: disable=consider-using-with


def open_text(path: str, encoding: str = "utf-8", newline: str | None = None):
  """A text file to read (a fine-tuning data file), local or at a URL."""
  return io.TextIOWrapper(open_binary(path), encoding=encoding, newline=newline)


def glob(pattern: str) -> list[str]:
  """The files and directories matching a glob; URLs through etils.epath, local paths through gfile."""
  if "://" not in pattern:
    return tf().io.gfile.glob(pattern)
  parts = pattern.split("/")
  first = next((i for i, part in enumerate(parts) if any(c in part for c in "*?[")), len(parts))
  base = epath.Path("/".join(parts[:first]))
  if first == len(parts):
    return [pattern] if base.exists() else []
  return sorted(os.fspath(p) for p in base.glob("/".join(parts[first:])))


def isdir(path: str) -> bool:
  return epath.Path(path).is_dir() if "://" in path else tf().io.gfile.isdir(path)
