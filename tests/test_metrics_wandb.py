"""train.wandb: the scalars and config a run writes to TensorBoard and metrics.jsonl also go to Weights & Biases.

Offline (WANDB_MODE=offline), so nothing leaves the machine: the run's records are read back from the
offline run folder's transaction log (WORKDIR/wandb/offline-run-*/run-<id>.wandb), a LevelDB-style log of
wandb's protobuf Records, with a reader written here.
"""
import glob
import json
import struct

import numpy as np
import pytest

from bert_jax.errors import UserError
from bert_jax.training import metrics

wandb = pytest.importorskip("wandb")
from wandb.proto import wandb_internal_pb2  # noqa: E402


def _records(path: str) -> list:
  """The Records of a .wandb file: a 7-byte file header, then 32 KiB blocks of chunks, each with a 7-byte
  header (crc32, length, kind: 1 full, 2 first, 3 middle, 4 last); a block's tail under 7 bytes is padding."""
  data, block, pos = open(path, "rb").read(), 32768, 7
  records, pending = [], b""
  while pos + 7 <= len(data):
    left = block - pos % block
    _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
    if left < 7 or (length == 0 and kind == 0):
      pos += left
      continue
    pending += data[pos + 7:pos + 7 + length]
    pos += 7 + length
    if kind in (1, 4):
      record = wandb_internal_pb2.Record()
      record.ParseFromString(pending)
      records.append(record)
      pending = b""
  return records


def test_scalars_and_config_reach_the_offline_run(tmp_path, monkeypatch):
  monkeypatch.setenv("WANDB_MODE", "offline")
  monkeypatch.setenv("WANDB_SILENT", "true")
  logger = metrics.MetricsLogger(tmp_path, num_steps=4, start_step=0, tensorboard=False, wandb="bert-jax-test")
  logger.write_hparams({"train": {"batch_size": 8, "wandb": "bert-jax-test"}, "model": {"hidden_size": 32}})
  for step in (2, 4):
    logger.log_train(step, [{"loss": np.float32(step + 0.5), "learning_rate": np.float32(0.1)}] * 2, 128)
  logger.log_eval(4, {"loss": 1.25, "accuracy": 0.75})
  logger.close()
  wandb.teardown()  # the wandb service writes the log after finish() returns; teardown waits for it
  runs = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "run-*.wandb"))
  assert len(runs) == 1
  records = _records(runs[0])
  history = [{item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in r.history.item}
             for r in records if r.WhichOneof("record_type") == "history"]
  by_step = {}
  for row in history:
    by_step.setdefault(row["_step"], {}).update({k: v for k, v in row.items() if not k.startswith("_")})
  rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  for row in rows:  # every metrics.jsonl number, under its TensorBoard tag
    prefix = "eval/" if row.get("eval") else "train/"
    for key, value in row.items():
      if key not in ("step", "eval"):
        assert by_step[row["step"]][prefix + key] == pytest.approx(value), (row["step"], key)
  assert by_step[2]["train/loss"] == 2.5 and by_step[4]["eval/accuracy"] == 0.75
  config = {item.key: json.loads(item.value_json) for r in records if r.WhichOneof("record_type") == "config"
            for item in r.config.update}
  assert config["train.batch_size"] == 8 and config["model.hidden_size"] == 32


def test_a_missing_wandb_names_the_extra(tmp_path, monkeypatch):
  monkeypatch.setitem(__import__("sys").modules, "wandb", None)
  with pytest.raises(UserError, match=r"bert_jax\[wandb\]"):
    metrics.WandbWriter("p", tmp_path)
