"""The TensorBoard events a run writes, read back as TensorBoard reads them, hold the scalars of its
metrics.jsonl: the same tags (`train/<name>`, `eval/<name>`), the same steps, the same values (to float32,
the precision of an event's tensor)."""
import json
import os

import numpy as np
import pytest
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.util import tensor_util

from bert_jax.training import trainer
from core_helpers import slow

TINY = ["--config.data.max_seq_length=32", "--config.data.max_predictions_per_seq=5",
        "--config.train.batch_size=8", "--config.data.shuffle_buffer=100", "--config.model.num_layers=1",
        "--config.model.hidden_size=32", "--config.model.intermediate_size=64",
        "--config.checkpoint.every_steps=0", "--config.train.log_every_steps=1", "--config.train.num_steps=4",
        "--config.train.eval_every_steps=2", "--config.train.eval_steps=1"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  """A 4-step tiny pretraining with TensorBoard on: train rows at 1-4, evaluations at 2 and 4."""
  workdir = tmp_path_factory.mktemp("tensorboard")
  trainer.pretrain(trainer.load_run_config("configs/bert.py:demo", TINY), str(workdir))
  return workdir


def _jsonl_scalars(workdir) -> dict[str, dict[int, float]]:
  """{tag: {step: value}} of metrics.jsonl, tagged as the logger tags TensorBoard's scalars."""
  scalars = {}
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    for row in map(json.loads, f):
      prefix = "eval" if row.pop("eval", False) else "train"
      step = row.pop("step")
      for name, value in row.items():
        scalars.setdefault(f"{prefix}/{name}", {})[step] = value
  return scalars


def _event_scalars(workdir) -> dict[str, dict[int, float]]:
  """{tag: {step: value}} of the run's event files, through TensorBoard's own reader."""
  events = event_accumulator.EventAccumulator(str(workdir), size_guidance={event_accumulator.TENSORS: 0})
  events.Reload()
  scalars = {}
  for tag in events.Tags()[event_accumulator.TENSORS]:
    for event in events.Tensors(tag):
      value = tensor_util.make_ndarray(event.tensor_proto)
      if value.shape == () and value.dtype.kind == "f":  # scalars, not the hparams plugin's summaries
        assert event.step not in scalars.setdefault(tag, {}), (tag, event.step)
        scalars[tag][event.step] = float(value)
  return scalars


@slow  # its own tiny pretraining with TensorBoard on (~30 s of CPU); weekly, to keep the suite within 15 min
def test_every_scalar_of_metrics_jsonl_is_in_tensorboard(run):
  jsonl, events = _jsonl_scalars(run), _event_scalars(run)
  assert sorted(jsonl["train/loss"]) == [1, 2, 3, 4] and sorted(jsonl["eval/loss"]) == [2, 4]
  assert {"train/mlm_accuracy", "train/learning_rate", "train/steps_per_sec", "eval/mlm_accuracy"} <= set(jsonl)
  assert sorted(events) == sorted(jsonl)
  for tag, rows in jsonl.items():
    assert sorted(events[tag]) == sorted(rows), tag
    for step, value in rows.items():
      assert events[tag][step] == np.float32(value), (tag, step, events[tag][step], value)
