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
A checkpoint step directory (WORKDIR/checkpoints/<step>) stands for its workdir: config.json is two
levels up.

Every path a user gives becomes an `epath.Path`: a URL (gs://bucket/run) stays a URL, which orbax,
TensorFlow's gfile and gcsfs read and write; a local path becomes absolute, as orbax requires.
epath serves gs:// through TensorFlow's gfile (a runtime dependency), or through gcsfs (the `[gcs]`
extra) with EPATH_USE_TF=false; orbax writes array data through tensorstore's own GCS driver.
Before a run touches a bucket, `check_bucket` asks once whether it is there and answers, with a bounded
wait: an unreachable bucket is one line naming it and the fix, not minutes of retries and a traceback
(and gcsfs's makedirs, which creates missing buckets, never runs on a bucket that does not exist).
"""
from __future__ import annotations

import functools
import importlib.util
import json
import os
import threading
from typing import Any

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


def create(location: epath.PathLike) -> epath.Path:
  """The directory at a user's path, created if missing (in a bucket that must already exist)."""
  directory = path(location)
  check_bucket(directory)
  directory.mkdir(parents=True, exist_ok=True)
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


def write_json(file: epath.PathLike, value: Any, indent: int = 2) -> None:
  write_text(file, json.dumps(value, indent=indent, sort_keys=True, default=str))


def write_text(file: epath.PathLike, text: str) -> None:
  file = epath.Path(file)
  file.parent.mkdir(parents=True, exist_ok=True)
  file.write_text(text)


def read_config(location: epath.PathLike) -> dict:
  """config.json of a workdir, a params checkpoint, or the workdir above a step directory."""
  return read_json(root(location) / CONFIG)


def append_line(file: epath.PathLike, line: str) -> None:
  """Appends one line; object stores (gs://) have no append, so there the object is rewritten."""
  file = epath.Path(file)
  if is_url(file):
    previous = file.read_text() if file.exists() else ""
    file.write_text(previous + line + "\n")
    return
  with file.open("a") as f:
    f.write(line + "\n")


def copy_file(source: epath.PathLike, destination: epath.PathLike) -> None:
  source, destination = path(source), path(destination)
  if source != destination:
    destination.parent.mkdir(parents=True, exist_ok=True)
    destination.write_bytes(source.read_bytes())


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
