"""A run's workdir, local or in a bucket (gs://...): its layout, and the files in it, through etils.epath.

  WORKDIR/config.json             the resolved config; data.vocab names the tokenizer copy beside it
  WORKDIR/<vocab.txt | *.model>   the tokenizer the run used (BPE: vocab.json + merges.txt)
  WORKDIR/params/                 a params checkpoint (bert_jax/params_checkpoint.py): what `convert` and
                                  `grow` write, and the parameters a fine-tuning run keeps
  WORKDIR/checkpoints/<step>/     pretraining's train state and input position (training/checkpoint.py)
  WORKDIR/state/<step>/           a paused fine-tuning run's train state and progress
  WORKDIR/run_config.json         fine-tuning: the config as given
  WORKDIR/metrics.jsonl           one JSON object per logged step and per evaluation ("eval": true)
  WORKDIR/events.out.tfevents.*   the same scalars for TensorBoard (train.tensorboard)
  WORKDIR/eval_results.json       fine-tuning's final dev metrics
  WORKDIR/finished.json           where a job that ran to its end stopped (training/loop.py)
  WORKDIR/previous-N/           a finished run's files, set aside by train.restart
  WORKDIR/predictions/            fine-tuning's prediction files
  WORKDIR/init_from/              a params checkpoint converted from a foreign `init_from` (a Hugging Face
                                  folder, an original TF checkpoint; bert_jax/pretrained.py)
A checkpoint step directory (WORKDIR/checkpoints/<step>) stands for its workdir: config.json is two
levels up.

Every path a user gives becomes an `epath.Path`: a URL (gs://bucket/run) stays a URL, which orbax,
TensorFlow's gfile and gcsfs read and write; a local path becomes absolute, as orbax requires.
epath serves gs:// through TensorFlow's gfile (a runtime dependency), or through gcsfs (the `[gcs]`
extra) with EPATH_USE_TF=false; orbax writes array data through tensorstore's own GCS driver.
Before a run touches a bucket, `check_bucket` asks once whether it is there and answers, with a bounded
wait: an unreachable bucket is one line naming it and the fix, not minutes of retries and a traceback
(and gcsfs's makedirs, which creates missing buckets, never runs on a bucket that does not exist).

Every file the project writes goes through the writers here (write_bytes/_text/_json, copy_file,
append_line, or atomic_path/atomic_open for a library that writes to a path): a local file is written
under a temporary name beside it and renamed into place, an object is uploaded whole, and a line is
appended whole or cut back. A failed write (a full disk, a read-only filesystem) leaves no partial file
and ends in one line (`write_error`) that names the file, says what is wrong where, and what to do.
"""
from __future__ import annotations

import contextlib
import errno
import functools
import importlib.util
import json
import logging
import os
import re
import tempfile
import threading
from typing import IO, Any, Iterator

from etils import epath

from bert_jax.errors import UserError, require

CONFIG = "config.json"
RUN_CONFIG = "run_config.json"
PARAMS = "params"
CHECKPOINTS = "checkpoints"
PAUSED = "state"
METRICS = "metrics.jsonl"
EVAL_RESULTS = "eval_results.json"
PREDICTIONS = "predictions"
FINISHED = "finished.json"
PREVIOUS = "previous-"
CONVERTED_INIT = "init_from"
BUCKET_PROBE_SECONDS = 30.0
_ACCESS_FIX = ("sign in with `gcloud auth application-default login` (or set GOOGLE_APPLICATION_CREDENTIALS "
               "to a service-account key) and check the network")


def is_url(path: epath.PathLike) -> bool:
  return "://" in os.fspath(path)


def path(location: epath.PathLike) -> epath.Path:
  """A user's path: URLs as they are, local paths absolute (never `$CWD/gs:/...`)."""
  if is_url(location):
    return epath.Path(location)
  return epath.Path(os.path.abspath(os.path.expanduser(os.fspath(location))))


def _epath_uses_tf() -> bool:
  """etils.epath's choice: gs:// through TensorFlow's gfile where TF is installed, unless EPATH_USE_TF
  is false; else through fsspec (gcsfs)."""
  return (os.environ.get("EPATH_USE_TF", "").lower() not in ("false", "no", "f", "0")
          and importlib.util.find_spec("tensorflow") is not None)


class _OneBucketTypeLine(logging.Filter):
  """gcsfs asks for a bucket's type (the storage-control API) before its calls, caches only answers, and
  logs every failed lookup before falling back to its plain client: ~700 warnings in a short run where
  that API does not answer (an emulator; credentials without the permission). One per bucket stays."""

  _FAILED = re.compile(r"(?:Could not determine bucket type for bucket name (\S+?):|Error: Bucket (\S+) not found)")

  def __init__(self):
    super().__init__()
    self.seen: set[str] = set()

  def filter(self, record: logging.LogRecord) -> bool:
    failed = self._FAILED.match(record.getMessage())
    if failed is None:
      return True
    bucket = failed.group(1) or failed.group(2)
    if bucket in self.seen:
      return False
    self.seen.add(bucket)
    return True


logging.getLogger("gcsfs").addFilter(_OneBucketTypeLine())  # harmless where gcsfs never runs


def _bucket_exists(bucket: epath.Path, answer: list) -> None:
  try:
    answer.append(bucket.exists())
  except Exception as e:  # pylint: disable=broad-except  # any client's failure becomes one line below
    answer.append(e)


@functools.cache
def _check_bucket(bucket: str) -> None:
  if _epath_uses_tf():
    # Imported here, not in the probe's thread, which may be left behind when the bucket does not answer.
    from bert_jax.data_pipelines.tftools import tf  # pylint: disable=import-outside-toplevel
    tf()
  answer: list = []
  # The GCS clients retry a refused connection for minutes (gcsfs ~1 min, TF's gfile longer) and take
  # no bound on it, so the probe runs in a daemon thread and is abandoned after BUCKET_PROBE_SECONDS.
  probe = threading.Thread(target=_bucket_exists, args=(epath.Path(bucket), answer), daemon=True)
  probe.start()
  probe.join(BUCKET_PROBE_SECONDS)
  if not answer:
    raise UserError(f"{bucket}: no answer within {BUCKET_PROBE_SECONDS:.0f} s; {_ACCESS_FIX}")
  if isinstance(answer[0], ImportError):  # epath's fsspec backend: gcsfs is not installed
    require("gcsfs", "gcs", f"{bucket} without TensorFlow's gfile (EPATH_USE_TF=false, or no TensorFlow)")
  if isinstance(answer[0], Exception):
    reason = " ".join(str(answer[0]).split())[:200]
    raise UserError(f"{bucket}: cannot reach the bucket ({type(answer[0]).__name__}: {reason}); {_ACCESS_FIX}")
  if not answer[0]:
    raise UserError(f"{bucket}: no such bucket (or these credentials cannot see it); create it with "
                    f"`gcloud storage buckets create {bucket}`, or fix the path")


def check_bucket(location: epath.PathLike) -> None:
  """For a URL: its bucket exists and answers (asked once per bucket), else UserError naming the bucket
  and the fix. Local paths pass."""
  if is_url(location):
    scheme, rest = os.fspath(location).split("://", 1)
    _check_bucket(f"{scheme}://{rest.split('/', 1)[0]}")


def create(location: epath.PathLike, flag: str = "--workdir") -> epath.Path:
  """The directory at a user's path (`flag` names where it came from), created if missing (in a bucket
  that must already exist). A local one must be a directory this process can write: an empty path, a
  file, a read-only or full disk is one line naming it, before anything is written."""
  if not os.fspath(location).strip():
    raise UserError(f"{flag} is an empty path; name a directory (e.g. runs/demo)")
  directory = path(location)
  check_bucket(directory)
  if directory.exists() and not directory.is_dir():
    raise UserError(f"{flag} {directory} is a file; name a directory")
  try:
    directory.mkdir(parents=True, exist_ok=True)
    if not is_url(directory):
      with tempfile.TemporaryFile(dir=directory):  # a read-only directory passes mkdir, not this
        pass
  except OSError as e:
    raise write_error(directory, e, flag) from None
  return directory


def root(location: epath.PathLike) -> epath.Path:
  """The workdir (or params checkpoint) at `location`, or the one above a checkpoint step directory."""
  location = path(location)
  check_bucket(location)
  for candidate in (location, location.parent.parent):
    if (candidate / CONFIG).exists():
      return candidate
  raise UserError(f"{location}: no {CONFIG} found; expected a bert_jax workdir or params checkpoint")


def read_json(file: epath.PathLike) -> Any:
  file = epath.Path(file)
  try:
    return json.loads(file.read_text())
  except ValueError as e:
    raise UserError(f"{file}: not valid JSON ({e})") from None


def write_error(file: epath.PathLike, error: OSError, flag: str = "") -> UserError:
  """The one line for a failed write: what was written (and the flag that named it), where, what to do."""
  where = file if os.path.isdir(file) else os.path.dirname(os.fspath(file))
  head = f"{flag + ': ' if flag else ''}cannot write {file}"
  if error.errno in (errno.ENOSPC, errno.EDQUOT):
    return UserError(f"{head}: the disk is full (no space left on the device holding {where}); free space "
                     "there, or choose a directory on another disk, and rerun")
  if error.errno == errno.EFBIG:
    return UserError(f"{head}: a file grew past the file size limit (ulimit -f); raise the limit (ulimit -f "
                     "unlimited) and rerun")
  if error.errno == errno.EROFS:
    return UserError(f"{head}: {where} is on a read-only filesystem; choose a writable directory")
  if error.errno in (errno.EACCES, errno.EPERM):
    return UserError(f"{head}: permission denied in {where}; choose a directory you can write, or fix its "
                     "permissions")
  return UserError(f"{head} ({error.strerror or error}); check {where}")


def _temp_beside(file: epath.Path) -> epath.Path:
  return file.parent / f".{file.name}.tmp-{os.getpid()}-{threading.get_ident()}"


@contextlib.contextmanager
def atomic_path(file: epath.PathLike) -> Iterator[str]:
  """A temporary local path for a writer that needs one (savefig, np.savez, a TFRecordWriter); when the
  block ends without error it becomes `file` (renamed; uploaded for a URL), otherwise it is removed.
  Readers never see a half-written `file`, and a failed write leaves nothing."""
  file = epath.Path(file)
  with _translating(file):
    if is_url(file):
      with tempfile.TemporaryDirectory() as local:
        staged = os.path.join(local, file.name)
        yield staged
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_bytes(epath.Path(staged).read_bytes())  # one upload: an object appears whole or not
      return
    file.parent.mkdir(parents=True, exist_ok=True)
    staged = _temp_beside(file)
    try:
      yield os.fspath(staged)
      os.replace(staged, file)
    finally:
      staged.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_open(file: epath.PathLike, mode: str = "w") -> Iterator[IO]:
  """`open(file, mode)` ("w" or "wb") through atomic_path."""
  with atomic_path(file) as staged, open(staged, mode, encoding=None if "b" in mode else "utf-8") as f:
    yield f


@contextlib.contextmanager
def _translating(file: epath.Path) -> Iterator[None]:
  try:
    yield
  except OSError as e:
    raise write_error(file, e) from None


def write_bytes(file: epath.PathLike, data: bytes) -> None:
  """Writes `file` whole or not at all (see atomic_path)."""
  with atomic_open(file, "wb") as f:
    f.write(data)


def write_text(file: epath.PathLike, text: str) -> None:
  write_bytes(file, text.encode("utf-8"))


def write_json(file: epath.PathLike, value: Any, indent: int = 2) -> None:
  write_text(file, json.dumps(value, indent=indent, sort_keys=True, default=str))


def read_config(location: epath.PathLike) -> dict:
  """config.json of a workdir, a params checkpoint, or the workdir above a step directory."""
  return read_json(root(location) / CONFIG)


def append_line(file: epath.PathLike, line: str) -> None:
  """Appends one line whole or not at all: a local file is cut back to its old length when the write
  fails; object stores (gs://) have no append, so there the object is rewritten."""
  file = epath.Path(file)
  if is_url(file):
    previous = file.read_text() if file.exists() else ""
    write_text(file, previous + line + "\n")
    return
  data = (line + "\n").encode("utf-8")
  with _translating(file):
    fd = os.open(file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    size = os.fstat(fd).st_size
    try:
      if os.write(fd, data) != len(data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    except OSError:
      os.ftruncate(fd, size)
      raise
    finally:
      os.close(fd)


def copy_file(source: epath.PathLike, destination: epath.PathLike) -> None:
  source, destination = path(source), path(destination)
  if source != destination:
    write_bytes(destination, source.read_bytes())


def write_tokenizer(directory: epath.PathLike, files: dict[str, str] | None) -> None:
  """Copies the tokenizer files {name in the workdir: source path} into `directory`."""
  for name, source in (files or {}).items():
    copy_file(source, path(directory) / name)


def vocab_file(location: epath.PathLike, config: dict) -> epath.Path | None:
  """The vocabulary config.json's data.vocab names: the copy beside config.json, else the path itself."""
  vocab = config.get("data", {}).get("vocab", "")
  if not vocab:
    return None
  beside = root(location) / epath.Path(vocab).name
  if beside.exists():
    return beside
  if path(vocab).exists():
    return path(vocab)
  raise UserError(f"{location}: {CONFIG} names vocabulary {vocab!r}, which is neither beside it nor "
                  "at that path")
