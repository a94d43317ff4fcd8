"""The one run driver's rules (training/driver.py), with a toy learner (no model): its parameter w moves by 1 a
step, its score is -|w - 3|. The starting evaluation is recorded, never kept; keep-best keeps step 3's w and
early stopping ends the run after `patience` worse evaluations; with no evaluation while training the final
parameters are still evaluated once; the paused state is removed at the end and finished.json says where the
run ended."""
import json

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from bert_jax.training import checkpoint, driver, partitioning
from bert_jax.training.step import TrainState

MESH = partitioning.make_mesh(ml_collections.ConfigDict({"data": -1, "fsdp": 1, "tensor": 1}), jax.devices()[:1])


@jax.jit
def _step(state, batch):
  params = {"w": state.params["w"] + jnp.sum(batch["x"])}
  loss = jnp.abs(params["w"] - 3.0)
  return (TrainState(state.step + 1, params, state.opt_state),
          {"loss": loss, "grad_norm": loss, "learning_rate": loss, "finite": jnp.isfinite(loss)})


class _Setup:
  mesh, num_steps = MESH, 8
  abstract_state = TrainState(jax.ShapeDtypeStruct((), jnp.int32), {"w": jax.ShapeDtypeStruct((), jnp.float32)}, ())

  @staticmethod
  def make_state(params):
    return TrainState(jnp.int32(0), params, ())


class ToyLearner:
  """The whole Learner interface: batches, step, evaluation, what params/ holds."""
  setup, steps_per_epoch, tokens_per_step, score_name = _Setup(), 8, 1, "closeness"

  def __init__(self, config, run_dir, evaluates_start=False):
    self.config, self.run_dir, self.evaluates_start = config, run_dir, evaluates_start
    self.evaluated = []  # the w of each evaluation

  def initial_params(self):
    return {"w": jnp.float32(0.0)}

  def batches(self, start, end):
    for _ in range(start, end):
      yield {"x": np.ones((1, 1), np.float32)}

  def step(self, state, batch):
    return _step(state, batch)

  def evaluate(self, params):
    w = float(params["w"])
    self.evaluated.append(w)
    return driver.Scored(-abs(w - 3.0), {"closeness": -abs(w - 3.0)}, {"closeness": -abs(w - 3.0), "w": w})

  def exported(self, params):
    return params

  def save_params(self, params):
    checkpoint.save_params(self.run_dir, params, {"model": {}})

  def write_outputs(self, params, scored):
    del params, scored


def _config(**train):
  return ml_collections.ConfigDict({
      "train": {"skip_nonfinite_steps": 0, "tensorboard": False, "wandb": "", "log_every_steps": 4,
                "eval_every_steps": 0, "restart": False, **train},
      "checkpoint": {"every_steps": 0, "keep": 1, "async_save": False}})


def test_keep_best_early_stopping_and_the_starting_evaluation(tmp_path):
  config = _config(eval_every_steps=1, keep_best=True, early_stopping_patience=2)
  learner = ToyLearner(config, tmp_path, evaluates_start=True)
  run = driver.Driver(config, tmp_path, learner)
  run.advance()
  # w = 0 (step 0, recorded only), 1, 2, 3 (best), 4, 5: two worse evaluations stop the run at step 5
  assert learner.evaluated == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0] and run.step == 5
  assert (run.progress.best_step, run.progress.best_score, run.progress.stopped_early) == (3, 0.0, True)
  result = run.result()
  assert learner.evaluated[-1] == 3.0  # the finish evaluates the kept parameters
  assert result["dev"] == {"closeness": 0.0, "w": 3.0, "initial/closeness": -3.0}
  assert json.loads((tmp_path / "eval_results.json").read_text()) == result["dev"]
  finished = json.loads((tmp_path / "finished.json").read_text())
  assert (finished["step"], finished["best_step"], finished["stopped_early"]) == (5, 3, True)
  evals = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()
           if "closeness" in line]
  assert evals == [0, 1, 2, 3, 4, 5]


def test_without_evaluation_while_training_the_final_parameters_are_evaluated_once(tmp_path):
  config = _config(log_every_steps=2)
  learner = ToyLearner(config, tmp_path)
  run = driver.Driver(config, tmp_path, learner)
  run.advance(4)
  run.pause()  # a sweep's rung: the state kept for the next Driver
  assert learner.evaluated == [] and (tmp_path / "state").exists()
  again = driver.Driver(config, tmp_path, ToyLearner(config, tmp_path))
  assert again.step == 4
  again.advance()
  result = again.result()
  assert again.learner.evaluated == [8.0] and result["dev"] == {"closeness": -5.0, "w": 8.0}
  assert result["best_step"] == -1 and result["best_score"] is None
  assert not (tmp_path / "state").exists()  # the output is params/; no final train state is kept
  saved, _ = checkpoint.load_params(tmp_path)
  assert float(saved["w"]) == 8.0
