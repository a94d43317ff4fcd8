"""Reads a PyTorch `pytorch_model.bin` (the zip format of torch.save) with numpy, executing no pickled code.

The pickle inside names classes it wants constructed; a restricted unpickler allows only the few that
rebuild a tensor from raw storage bytes and the OrderedDict holding them. Anything else (arbitrary
code in a malicious file) is refused.
"""
from __future__ import annotations

import collections
import pickle
import zipfile

import ml_dtypes
import numpy as np

from bert_jax.errors import UserError

_STORAGE_DTYPES = {
    "FloatStorage": np.float32, "DoubleStorage": np.float64, "HalfStorage": np.float16,
    "BFloat16Storage": ml_dtypes.bfloat16, "LongStorage": np.int64, "IntStorage": np.int32,
    "ShortStorage": np.int16, "CharStorage": np.int8, "ByteStorage": np.uint8, "BoolStorage": np.bool_,
}


def _rebuild_tensor(storage, offset, size, stride, *unused):
  itemsize = storage.dtype.itemsize
  view = np.lib.stride_tricks.as_strided(storage[offset:], shape=tuple(size),
                                         strides=tuple(s * itemsize for s in stride))
  return view.copy()


def _rebuild_parameter(data, *unused):
  return data


_ALLOWED = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
}


class _Unpickler(pickle.Unpickler):

  def __init__(self, file, archive: zipfile.ZipFile, root: str, source: str):
    super().__init__(file)
    self.archive, self.root, self.source = archive, root, source

  def find_class(self, module, name):
    if module == "torch" and name in _STORAGE_DTYPES:
      return np.dtype(_STORAGE_DTYPES[name])
    if (module, name) not in _ALLOWED:
      raise UserError(f"{self.source}: refusing to unpickle {module}.{name} (only tensors are read); "
                      "convert the file to model.safetensors")
    return _ALLOWED[(module, name)]

  def persistent_load(self, pid):
    kind, dtype, key, _, numel = pid
    if kind != "storage":
      raise UserError(f"{self.source}: unknown persistent record {kind!r}")
    data = self.archive.read(f"{self.root}/data/{key}")
    storage = np.frombuffer(data, dtype=dtype)
    if storage.size < numel:
      raise UserError(f"{self.source}: storage {key} holds {storage.size} of {numel} elements "
                      "(truncated file?)")
    return storage


def load_torch_zip(path: str) -> dict[str, np.ndarray]:
  """{name: array} of a state dict saved by torch.save (zip format, PyTorch >= 1.6)."""
  try:
    with zipfile.ZipFile(path) as archive:
      pickles = [n for n in archive.namelist() if n.endswith("/data.pkl")]
      if len(pickles) != 1:
        raise UserError(f"{path}: not a torch.save archive (no data.pkl)")
      root = pickles[0][:-len("/data.pkl")]
      byteorder = f"{root}/byteorder"
      if byteorder in archive.namelist() and archive.read(byteorder) != b"little":
        raise UserError(f"{path}: big-endian tensors are not supported")
      with archive.open(pickles[0]) as f:
        state = _Unpickler(f, archive, root, path).load()
  except UserError:
    raise
  except (zipfile.BadZipFile, EOFError, OSError, pickle.UnpicklingError, KeyError, ValueError) as e:
    raise UserError(f"{path}: cannot read the PyTorch checkpoint ({type(e).__name__}: {e}); the file "
                    "is truncated or not a torch.save zip archive (legacy pre-1.6 files: re-save them)") from None
  if not isinstance(state, dict):
    raise UserError(f"{path}: holds a {type(state).__name__}, not a state dict of tensors")
  return dict(state)
