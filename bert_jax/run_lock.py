"""One run per workdir: an exclusive lock, taken before a run writes anything and held until it ends.

A second run on a busy workdir stops at once with one line naming the holder (host, pid, start
time), instead of both runs replacing each other's checkpoints and interleaving their metrics.

Local paths (and NFS, where Linux maps flock to POSIX locks): `fcntl.flock` on WORKDIR/run.lock,
which holds the holder's host, pid and start time. The kernel releases the lock when the holding
process ends, however it ends (SIGKILL, OOM kill, a crash): a lock is never stale, and a file left
behind by a killed run means nothing by itself. A run that ends (or fails) removes the file while it
still holds the lock; a run that locked a file just removed that way finds it gone from the path and
locks the new one instead. Data worker processes are spawned, not forked, so they never inherit the
lock.

Object stores (gs://...): object storage has no locks, so WORKDIR/run.lock is a lease, held by
compare-and-swap on the object's generation (google-cloud-storage preconditions; the `gcs` extra).
A run creates the object only if it does not exist, then rewrites it every LEASE_SECONDS / 4 with
a new expiry, each write conditional on the generation it last wrote. Guarantee: while the holder
keeps renewing, no other run can take the lock; a holder that dies (SIGKILL, a lost VM) blocks the
workdir until its lease expires (at most LEASE_SECONDS), after which the next run takes over by a
conditional write. A run started on the machine where the holder died need not wait: the lock records
the holder's process space (the running kernel's boot id and its pid namespace), and where that is the
new run's own and the holder's pid is gone, the lease is over. A holder that cannot renew for longer
than the lease (frozen, partitioned from GCS) may lose the lock to a new run; its next renewal fails
and it prints a warning on stderr. The guarantee is mutual exclusion of healthy holders, not fencing
of a frozen one's writes.

Only process 0 of a multi-host run takes the lock: the hosts of one run share the workdir.
"""
from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import socket
import sys
import threading
import time
from typing import Any, Iterator

from bert_jax import workdir as workdir_lib
from bert_jax.errors import UserError, require

LOCK_FILE = "run.lock"
LEASE_SECONDS = 120.0


def _process_space() -> str | None:
  """This process's kernel boot and pid namespace: where another holder's pid means the same process."""
  try:
    with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
      return f"{f.read().strip()}/{os.stat('/proc/self/ns/pid').st_ino}"
  except OSError:
    return None


def _holder() -> dict:
  return {"host": socket.gethostname(), "pid": os.getpid(), "space": _process_space(),
          "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}


def _died_here(text: str) -> bool:
  """Whether the holder recorded in `text` ran in this process space and has ended."""
  try:
    info = json.loads(text)
    if _process_space() is None or info.get("space") != _process_space():
      return False
    os.kill(int(info["pid"]), 0)
  except ProcessLookupError:
    return True
  except (ValueError, KeyError, TypeError, AttributeError, OSError):
    pass
  return False


def _busy(workdir: str, holder: str) -> UserError:
  return UserError(f"workdir {workdir} is in use by another run ({holder}); wait for it to finish or stop "
                   "it, or use another --workdir")


def _describe(text: str) -> str:
  try:
    info = json.loads(text)
    return f"host {info['host']}, pid {info['pid']}, started {info['started']}"
  except (ValueError, KeyError, TypeError):
    return "holder unknown"


class LocalLock:
  """flock on WORKDIR/run.lock; released by the kernel when the process ends."""

  def __init__(self, workdir: str):
    self.workdir = workdir
    self._fd: int | None = None

  @property
  def path(self) -> str:
    return os.path.join(self.workdir, LOCK_FILE)

  def acquire(self) -> None:
    fd = None
    try:
      while fd is None:
        fd = self._lock_file()
      os.ftruncate(fd, 0)
      os.pwrite(fd, json.dumps(_holder()).encode(), 0)
    except OSError as e:
      raise workdir_lib.write_error(self.path, e) from None
    self._fd = fd

  def _lock_file(self) -> int | None:
    """The locked descriptor of the file now at self.path; None when a releasing holder removed it
    between our open and our flock (then another run may lock a new file there: try again)."""
    os.makedirs(self.workdir, exist_ok=True)
    fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      holder = self._read_holder(fd)
      os.close(fd)
      raise _busy(self.workdir, holder) from None
    try:
      if os.stat(self.path).st_ino == os.fstat(fd).st_ino:
        return fd
    except FileNotFoundError:
      pass
    os.close(fd)
    return None

  @staticmethod
  def _read_holder(fd: int) -> str:
    # The holder writes its details just after locking: give it a moment.
    for _ in range(20):
      text = os.pread(fd, 4096, 0).decode(errors="replace")
      if text:
        return _describe(text)
      time.sleep(0.05)
    return "holder unknown"

  def release(self) -> None:
    """Removes the file, then drops the lock (closing the descriptor drops the flock)."""
    if self._fd is not None:
      with contextlib.suppress(FileNotFoundError):
        os.unlink(self.path)
      os.close(self._fd)
      self._fd = None


class LeaseLock:
  """A lease on an object-store object: `blob` has google-cloud-storage's Blob interface."""

  def __init__(self, workdir: str, blob: Any, precondition_failed: type[Exception],
               lease_seconds: float = LEASE_SECONDS, clock=time.time):
    self.workdir, self._blob, self._failed = workdir, blob, precondition_failed
    self.lease_seconds, self._clock = lease_seconds, clock
    self._generation: int | None = None
    self._stop = threading.Event()
    self._renewer: threading.Thread | None = None

  def _write(self, if_generation_match: int) -> None:
    record = {**_holder(), "expires": self._clock() + self.lease_seconds}
    self._blob.upload_from_string(json.dumps(record), if_generation_match=if_generation_match)
    self._generation = self._blob.generation

  def try_acquire(self) -> None:
    """Takes the lease, or raises UserError naming the holder whose lease is still running."""
    try:
      self._write(if_generation_match=0)
      return
    except self._failed:
      pass
    self._blob.reload()
    generation = self._blob.generation
    text = self._blob.download_as_bytes(if_generation_match=generation).decode(errors="replace")
    try:
      expires = float(json.loads(text)["expires"])
    except (ValueError, KeyError, TypeError):
      expires = 0.0  # an unreadable lock object holds nothing
    if expires > self._clock():
      if not _died_here(text):
        raise _busy(self.workdir, _describe(text) + f", lease until {time.ctime(expires)}")
      print(f"{self.workdir}: the run that held it ({_describe(text)}) has ended on this machine; taking "
            "over its lease", flush=True)
    try:
      self._write(if_generation_match=generation)
    except self._failed:
      raise _busy(self.workdir, "another run took the expired lease just now") from None

  def renew(self) -> bool:
    """Extends the lease; False when it was lost (another run took it after it expired)."""
    try:
      self._write(if_generation_match=self._generation)
      return True
    except self._failed:
      print(f"warning: the lock on {self.workdir} was taken by another run after this run's lease "
            "expired; two runs may now write to this workdir", file=sys.stderr, flush=True)
      return False

  def acquire(self) -> None:
    self.try_acquire()
    self._renewer = threading.Thread(target=self._renew_loop, daemon=True)
    self._renewer.start()

  def _renew_loop(self) -> None:
    while not self._stop.wait(self.lease_seconds / 4):
      if not self.renew():
        return

  def release(self) -> None:
    self._stop.set()
    if self._renewer is not None:
      self._renewer.join()
    if self._generation is not None:
      with contextlib.suppress(self._failed):
        self._blob.delete(if_generation_match=self._generation)
      self._generation = None


def _gcs_lock(workdir: str) -> LeaseLock:
  storage = require("google.cloud.storage", "gcs", "a workdir lock on gs://")
  exceptions = require("google.api_core.exceptions", "gcs", "a workdir lock on gs://")
  bucket, _, prefix = workdir[len("gs://"):].partition("/")
  name = f"{prefix.rstrip('/')}/{LOCK_FILE}" if prefix else LOCK_FILE
  return LeaseLock(workdir, storage.Client().bucket(bucket).blob(name), exceptions.PreconditionFailed)


def make_lock(workdir: str) -> LocalLock | LeaseLock:
  location = os.fspath(workdir)
  if location.startswith("gs://"):
    return _gcs_lock(location)
  if "://" in location:
    raise UserError(f"workdir {location}: only local paths and gs:// are supported")
  return LocalLock(os.path.abspath(location))


@contextlib.contextmanager
def hold(workdir: str, process_index: int = 0) -> Iterator[None]:
  """Holds the workdir's lock for the duration of the block (process 0 only)."""
  if process_index != 0:
    yield
    return
  lock = make_lock(workdir)
  lock.acquire()
  try:
    yield
  finally:
    lock.release()
