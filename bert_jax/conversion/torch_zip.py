"""Reads a PyTorch `pytorch_model.bin` (the zip format of torch.save) with numpy, executing no pickled code.

The pickle inside names classes it wants constructed; a restricted unpickler allows only the few that
rebuild a tensor from raw storage bytes and the OrderedDict holding them. Anything else (arbitrary
code in a malicious file) is refused.

Every size the file declares is checked against what it stores before anything is allocated, so memory
stays within a small multiple of the file's size: a storage's element count against its zip member's
size (a member that inflates to gigabytes is refused from its header, and zipfile inflates no member
past the size its header declares: one whose header lies fails its CRC), a tensor's offset, size and stride against its
storage, and a tensor's element count against its storage's (torch.save writes each view's whole
storage, so a view larger than its storage is an `expand`ed tensor, which weights never are, or a
crafted file).
"""
from __future__ import annotations

import collections
import io
import pickle
import zipfile
from typing import BinaryIO

import ml_dtypes
import numpy as np

from bert_jax.errors import UserError

# data.pkl holds only the tensors' names and views: some hundred bytes per tensor.
MAX_PICKLE_BYTES = 64 << 20
_STORAGE_DTYPES = {
    "FloatStorage": np.float32, "DoubleStorage": np.float64, "HalfStorage": np.float16,
    "BFloat16Storage": ml_dtypes.bfloat16, "LongStorage": np.int64, "IntStorage": np.int32,
    "ShortStorage": np.int16, "CharStorage": np.int8, "ByteStorage": np.uint8, "BoolStorage": np.bool_,
}


def _is_count(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _rebuild_tensor(storage, offset, size, stride, *unused):
  """The tensor viewing `storage`, after checking that every element it claims lies inside it.

  The pickle is untrusted: without this check a crafted size or stride makes as_strided read process
  memory past the storage (a crash, or heap bytes copied into the weights).
  """
  if not isinstance(storage, np.ndarray) or storage.ndim != 1:
    raise UserError(f"a tensor is built from {type(storage).__name__}, not a storage")
  if not (isinstance(size, (tuple, list)) and isinstance(stride, (tuple, list))):
    raise UserError(f"a tensor has size {size!r} and stride {stride!r}, not tuples")
  size, stride = tuple(size), tuple(stride)
  if not (_is_count(offset) and len(size) == len(stride) and all(map(_is_count, size + stride))):
    raise UserError(f"a tensor has an invalid view (offset {offset!r}, size {size}, stride {stride}); "
                    "negative or non-integer sizes and strides are refused")
  if 0 not in size:
    last = offset + sum((n - 1) * s for n, s in zip(size, stride))
    if last >= storage.size:
      raise UserError(f"a tensor of size {size} (offset {offset}, stride {stride}) reaches element {last} "
                      f"of a storage holding {storage.size}: the file is damaged or crafted")
    elements = int(np.prod(size, dtype=object))
    if elements > storage.size:
      raise UserError(f"a tensor of size {size} (stride {stride}) has {elements} elements over a storage "
                      f"holding {storage.size}: it would take {elements * storage.dtype.itemsize:,} bytes "
                      "from fewer stored; the file is crafted (weights are never expanded views)")
  itemsize = storage.dtype.itemsize
  view = np.lib.stride_tricks.as_strided(storage[offset:], shape=size,
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
    self.storages: dict[str, np.ndarray] = {}

  def find_class(self, module, name):
    if module == "torch" and name in _STORAGE_DTYPES:
      return np.dtype(_STORAGE_DTYPES[name])
    if (module, name) not in _ALLOWED:
      raise UserError(f"{self.source}: refusing to unpickle {module}.{name} (only tensors are read); "
                      "convert the file to model.safetensors")
    return _ALLOWED[(module, name)]

  def persistent_load(self, pid):
    if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
      raise UserError(f"{self.source}: unknown persistent record {str(pid)[:80]}")
    _, dtype, key, _, numel = pid
    if not (isinstance(dtype, np.dtype) and isinstance(key, str) and _is_count(numel)):
      raise UserError(f"{self.source}: malformed storage record {str(pid)[:80]}")
    if key in self.storages:
      if self.storages[key].dtype != dtype:
        raise UserError(f"{self.source}: storage {key} is read as {self.storages[key].dtype} and as {dtype}")
      return self.storages[key]
    self.storages[key] = np.frombuffer(self._read_member(f"{self.root}/data/{key}", numel * dtype.itemsize,
                                                         f"storage {key} ({numel} x {dtype})"), dtype=dtype)
    return self.storages[key]

  def _read_member(self, name: str, size: int, what: str) -> bytes:
    """The `size` bytes of zip member `name`, which must declare exactly that many."""
    info = self.archive.getinfo(name)
    if info.file_size != size:
      raise UserError(f"{self.source}: {what} should take {size:,} bytes, but its zip member {name} "
                      f"declares {info.file_size:,} (stored in {info.compress_size:,}): the file is damaged or "
                      "crafted")
    return _read_declared(self.archive, info)


def _read_declared(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> bytes:
  """A member's bytes, inflated in steps bounded by its declared size (zipfile's read() without a size
  asks zlib for a 2 GiB buffer at once); a member holding more fails its CRC at the declared end."""
  with archive.open(info) as f:
    return f.read(info.file_size)


def load_torch_zip(path: str, data: BinaryIO | None = None) -> dict[str, np.ndarray]:
  """{name: array} of a state dict saved by torch.save (zip format, PyTorch >= 1.6).

  data: the archive as a file object (one fetched from a bucket); by default `path` is opened.
  """
  try:
    with zipfile.ZipFile(path if data is None else data) as archive:
      pickles = [n for n in archive.namelist() if n.endswith("/data.pkl")]
      if len(pickles) != 1:
        raise UserError(f"{path}: not a torch.save archive (no data.pkl)")
      root = pickles[0][:-len("/data.pkl")]
      byteorder = f"{root}/byteorder"
      if byteorder in archive.namelist() and archive.open(byteorder).read(16) != b"little":
        raise UserError(f"{path}: big-endian tensors are not supported")
      if archive.getinfo(pickles[0]).file_size > MAX_PICKLE_BYTES:
        raise UserError(f"{path}: its {pickles[0]} declares {archive.getinfo(pickles[0]).file_size:,} bytes, "
                        f"more than a state dict's index ever takes ({MAX_PICKLE_BYTES:,}): the file is crafted")
      index = io.BytesIO(_read_declared(archive, archive.getinfo(pickles[0])))
      state = _Unpickler(index, archive, root, path).load()
  except UserError as e:
    raise UserError(str(e) if str(e).startswith(path) else f"{path}: {e}") from None
  except (zipfile.BadZipFile, EOFError, OSError, pickle.UnpicklingError, KeyError, ValueError,
          TypeError) as e:
    raise UserError(f"{path}: cannot read the PyTorch checkpoint ({type(e).__name__}: {e}); the file "
                    "is truncated or not a torch.save zip archive (legacy pre-1.6 files: re-save them)") from None
  if not isinstance(state, dict):
    raise UserError(f"{path}: holds a {type(state).__name__}, not a state dict of tensors")
  others = [str(k) for k, v in state.items() if not (isinstance(k, str) and isinstance(v, np.ndarray))]
  if others:
    raise UserError(f"{path}: entries that are not named tensors: {', '.join(others[:6])}")
  return dict(state)
