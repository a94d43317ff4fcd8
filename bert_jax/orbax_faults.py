"""How orbax's faults end: in the one line its caller raises, with nothing printed around it.

Two things stood between a fault and that line.

orbax runs each save, restore and metadata read as a coroutine on a fresh asyncio event loop
(`orbax.checkpoint._src.asyncio_utils.run_sync`), and closes the loop as soon as the coroutine ends.
When it ends in an error (a full disk, a damaged checkpoint), tensorstore still has the other arrays'
reads or writes in flight; each one that completes later calls back into the closed loop, and its
thread prints "RuntimeError: Event loop is closed" with a traceback: one per array, 75 to 140 of them
for a small model. `install` has the loop run until the tasks still on it have ended (their errors
collected, not raised) before it closes; a loop whose coroutine succeeded has none left, so nothing
changes there.

orbax (through absl) and asyncio also log each failed write of a full disk (or of a file past the size
limit, `ulimit -f`) as an error with a traceback, though the caller reports it; `install` drops those
records (`write_fault` tells them).
"""
from __future__ import annotations

import asyncio
import errno
import logging
from typing import Any, Coroutine

from orbax.checkpoint._src import asyncio_utils


def _run_until_idle(coro: Coroutine) -> Any:
  """orbax's `_run_sync_via_new_loop`, except that the loop closes only once no task is left on it."""
  loop = asyncio.new_event_loop()
  try:
    asyncio.set_event_loop(loop)
    return loop.run_until_complete(coro)
  finally:
    left = asyncio.all_tasks(loop)
    if left:
      loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
    asyncio.set_event_loop(None)
    loop.close()


_WRITE_FAULTS = {errno.ENOSPC: "No space left on device", errno.EFBIG: "File too large"}


def write_fault(error: BaseException | None) -> int | None:
  """ENOSPC (a full disk) or EFBIG (a file past the size limit, `ulimit -f`) when `error` or what caused
  it is one (orbax and tensorstore wrap it, sometimes as text); else None."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    code = getattr(error, "errno", None)
    if code in _WRITE_FAULTS:
      return code
    for code, text in _WRITE_FAULTS.items():
      if text in str(error):
        return code
    error = error.__cause__ or error.__context__
  return None


def no_space(error: BaseException | None) -> bool:
  """Whether `error` or what caused it is ENOSPC."""
  return write_fault(error) == errno.ENOSPC


class _DropWriteFaults(logging.Filter):
  """Drops absl's and asyncio's records of a full disk or a file size limit: the caller raises its own line."""

  def filter(self, record: logging.LogRecord) -> bool:
    return (write_fault(record.exc_info[1] if record.exc_info else None) is None
            and write_fault(Exception(record.getMessage())) is None)


_FILTER = _DropWriteFaults()


def install() -> None:
  """Idempotent; called where orbax is first used (bert_jax/params_checkpoint.py)."""
  asyncio_utils._run_sync_via_new_loop = _run_until_idle  # pylint: disable=protected-access
  for name in ("absl", "asyncio"):
    if _FILTER not in logging.getLogger(name).filters:
      logging.getLogger(name).addFilter(_FILTER)
