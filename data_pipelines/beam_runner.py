"""Running bert_jax's Beam pipelines: the runner and its options from the command line, and a failed job as
one line.

`--runner` names the runner. DirectRunner takes `--workers` (1: in this process; N > 1: N worker
processes, Beam's multi_processing mode; 0: one per CPU). Every runner's own options pass through
unchanged, as `--beam-option KEY=VALUE` or as Beam's flags after `--`; they come after the defaults
set here, so the user's value wins. apache-beam is optional (`pip install 'bert_jax[beam]'`; Dataflow
needs `bert_jax[dataflow]`): this module imports it only when a pipeline is built.
"""
from __future__ import annotations

import contextlib
import importlib
import logging
import os
import re
import sys
import tempfile
import traceback

from bert_jax.data_pipelines.errors import DataError

RUNNERS = ("DirectRunner", "PrismRunner", "DataflowRunner", "FlinkRunner", "SparkRunner")
LOCAL_RUNNERS = ("DirectRunner", "PrismRunner")
_DATA_ERROR = re.compile(r"DataError: (.+?)(?: \[while running '[^']*'\])*$", re.MULTILINE)
_STEP = re.compile(r" ?\[while running '([^']*)'\]")
_ANY_ERROR = re.compile(r"^(\w[\w.]*(?:Error|Exception)): (.+?)(?: \[while running '([^']*)'\])*$", re.MULTILINE)


def import_beam():
  """apache_beam, or one line naming the extra that installs it."""
  root = logging.getLogger()
  level = root.level
  root.setLevel(logging.ERROR)  # its import warns about Google Cloud clients that only Dataflow needs
  try:
    return importlib.import_module("apache_beam")
  except ImportError as e:
    raise DataError(f"--runner needs the optional package 'apache_beam' ({e}); install it with "
                    "python3 -m pip install 'bert_jax[beam]' (Dataflow: 'bert_jax[dataflow]')") from None
  finally:
    root.setLevel(level)


def pipeline_args(runner: str, workers: int = 0, options: tuple[str, ...] = (),
                  flags: tuple[str, ...] = ()) -> list[str]:
  """Beam's command-line flags for `runner`: our defaults, then `--beam-option KEY=VALUE`s, then raw flags."""
  if runner not in RUNNERS:
    raise DataError(f"--runner={runner!r}; choose one of {', '.join(RUNNERS)}")
  args = [f"--runner={runner}"]
  if runner == "DirectRunner":
    count = workers or os.cpu_count() or 1
    mode = "in_memory" if count == 1 else "multi_processing"
    args += [f"--direct_num_workers={count}", f"--direct_running_mode={mode}"]
  if runner in LOCAL_RUNNERS:
    args.append("--default_sdk_harness_log_level=WARNING")  # worker processes: no INFO line per bundle
  for option in options:
    key, sep, value = option.partition("=")
    if not sep or not key.strip("-"):
      raise DataError(f"--beam-option {option!r}: write KEY=VALUE, e.g. --beam-option project=my-project")
    args.append(f"--{key.lstrip('-')}={value}")
  return args + list(flags)


def pipeline_options(args: list[str]):
  return import_beam().options.pipeline_options.PipelineOptions(args)


def failure_line(error: BaseException, what: str, log: str = "") -> tuple[str, bool]:
  """A failed job's exception (whose text holds the workers' tracebacks) -> (one line, whether it points to
  `log`): the DataError a worker raised, else the last error a worker raised and the step it ran."""
  text = str(error)
  if isinstance(error, DataError):  # raised in this process (an in-memory runner), its message tagged with the step
    return _STEP.sub("", text).strip(), False
  found = _DATA_ERROR.findall(text)
  if found:
    return found[-1], False
  errors = _ANY_ERROR.findall(text)
  if errors:  # a worker's traceback, as text
    kind, message, step = errors[-1]
  else:  # the worker's exception itself (an in-memory runner), its message tagged with the step
    last = next((line for line in reversed(text.splitlines()) if line.strip()), "")
    kind, step = type(error).__name__, "".join(_STEP.findall(last)[-1:])
    message = _STEP.sub("", last).strip()
  where = f" in step {step!r}" if step else ""
  return f"{what}: the Beam job failed{where}: {kind.rsplit('.', 1)[-1]}: {message}; see {log or 'its log'}", True


@contextlib.contextmanager
def _stderr_to_log(runner: str):
  """A local runner's workers (processes that inherit file descriptor 2) and the runner itself log every
  failure with its traceback: that goes to a log file instead. Yields its path ('' for remote runners,
  which keep their own logs); `run` removes it unless the job failed without a DataError's one line."""
  if runner not in LOCAL_RUNNERS:
    yield ""
    return
  fd, path = tempfile.mkstemp(prefix="bert_jax-beam-", suffix=".log")
  sys.stderr.flush()
  saved = os.dup(2)
  os.dup2(fd, 2)
  try:
    yield path
  finally:
    sys.stderr.flush()
    os.dup2(saved, 2)
    os.close(saved)
    os.close(fd)


def runner_of(args: list[str]) -> str:
  beam = import_beam()
  return pipeline_options(args).view_as(beam.options.pipeline_options.StandardOptions).runner


def check_reachable(args: list[str], paths: dict[str, list[str]]) -> None:
  """A remote runner's workers read and write through URLs (gs://...), not this machine's files."""
  runner = runner_of(args)
  if runner in LOCAL_RUNNERS:
    return
  for flag, values in paths.items():
    local = [v for v in values if "://" not in v]
    if local:
      raise DataError(f"{flag} {local[0]} is on this machine, which {runner}'s workers cannot read or write; "
                      "put it in a bucket and pass its gs:// path")


def build(args: list[str], build_fn):
  """A pipeline under the options `args`, built by build_fn(pipeline) (not run)."""
  pipeline = import_beam().Pipeline(options=pipeline_options(args))
  build_fn(pipeline)
  return pipeline


def _interrupt_in(error: BaseException) -> KeyboardInterrupt | None:
  """The KeyboardInterrupt (Ctrl-C, or SIGTERM as cli/data.py raises it) behind `error`, if any: a step that
  raises one comes out of an in-process runner as a RuntimeError naming it."""
  seen = set()
  while error is not None and id(error) not in seen:
    if isinstance(error, KeyboardInterrupt):
      return error
    seen.add(id(error))
    error = error.__cause__ or error.__context__
  return None


def run(args: list[str], build_fn, what: str) -> None:
  """Builds the pipeline and runs it to the end; a failure anywhere (a worker's DataError, any other worker
  error, a runner that cannot start) is one DataError."""
  beam = import_beam()
  line, keep_log, log = "", False, ""
  try:
    with _stderr_to_log(runner_of(args)) as log:
      try:
        state = build(args, build_fn).run().wait_until_finish()
      except Exception as e:  # pylint: disable=broad-except  # whatever a runner raises, one line
        interrupt = _interrupt_in(e)
        if interrupt is not None:  # Ctrl-C or SIGTERM (cli/data.py) in a step, re-raised by Beam as an error
          raise interrupt from None
        line, keep_log = failure_line(e, what, log)
        if keep_log and log:  # the workers' tracebacks are in the exception's text, whoever logged them
          with open(log, "a", encoding="utf-8") as f:
            f.write("".join(traceback.format_exception(e)))
  except BaseException:  # Ctrl-C or SIGTERM (cli/data.py) stopped the job: its log is of no use
    if log:
      os.remove(log)
    raise
  if log and not keep_log:
    os.remove(log)
  if line:
    raise DataError(line)
  if state != beam.runners.runner.PipelineState.DONE:
    raise DataError(f"{what}: the Beam job ended {state}; see the runner's log")
