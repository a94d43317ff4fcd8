"""The sharded train step: a 2x2x2 data/fsdp/tensor mesh of 8 CPU devices equals one device."""
import re

import jax
import numpy as np
import pytest

from bert_jax.training import partitioning
from bert_jax.training.step import build_train_setup
from core_helpers import random_batch, tiny_config


def _run(config, devices, steps=3):
  setup = build_train_setup(config, partitioning.make_mesh(config.mesh, devices))
  state = setup.init_state(jax.random.key(0))
  losses = []
  for i in range(steps):
    state, metrics = setup.train_step(state, partitioning.global_batch(random_batch(i), setup.mesh),
                                      jax.random.key(1))
    losses.append(float(metrics["loss"]))
  return losses, jax.device_get(state.params), setup


@pytest.fixture(scope="module")
def one_device():
  return _run(tiny_config("--config.optimizer.name=lamb", "--config.optimizer.warmup_steps=1",
                          "--config.optimizer.learning_rate=1e-2"), jax.devices()[:1])


@pytest.mark.parametrize("unroll", [2, 1], ids=["unrolled-scan", "rolled-scan"])
def test_2x2x2_mesh_equals_one_device(one_device, unroll):
  assert jax.device_count() == 8
  config = tiny_config("--config.optimizer.name=lamb", "--config.optimizer.warmup_steps=1",
                       "--config.optimizer.learning_rate=1e-2", "--config.mesh.data=2",
                       "--config.mesh.fsdp=2", "--config.mesh.tensor=2",
                       f"--config.model.scan_unroll={unroll}")
  losses, params, setup = _run(config, jax.devices())
  ref_losses, ref_params, _ = one_device
  np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
  assert losses[-1] != losses[0]  # the optimizer moved
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), params, ref_params)
  # Weights really are split: fsdp over `embed`, tensor over heads.
  query = setup.state_shardings.params["encoder"]["layers"]["attention"]["query"]["kernel"]
  assert tuple(query.spec) == (None, "fsdp", "tensor", None)


def test_activations_stay_split_over_the_batch():
  """No collective in the compiled 2x2x2 step holds a whole global batch of activations.

  Before the embedding tables were gathered over fsdp ahead of the lookup (`bert.lookup`), XLA
  all-gathered the [batch, length, hidden] lookup output onto every device to reshard it.
  """
  config = tiny_config("--config.mesh.data=2", "--config.mesh.fsdp=2", "--config.mesh.tensor=2")
  setup = build_train_setup(config, partitioning.make_mesh(config.mesh, jax.devices()))
  batch = partitioning.global_batch(random_batch(0), setup.mesh)
  hlo = setup.train_step.lower(setup.init_state(jax.random.key(0)), batch,
                               jax.random.key(1)).compile().as_text()
  shapes = re.findall(r"= \(?f32\[([\d,]+)\][^ ]* (?:all-gather|all-reduce|all-to-all)", hlo)
  assert shapes, "expected the step's collectives in the HLO"
  whole = [s for s in shapes if s.startswith("8,16")]  # random_batch: 8 rows of 16 tokens
  assert not whole, whole


def test_gradient_accumulation_equals_the_full_batch():
  common = ("--config.model.hidden_dropout=0.0", "--config.model.attention_dropout=0.0")
  full, full_params, _ = _run(tiny_config(*common), jax.devices()[:1], steps=2)
  accum, accum_params, _ = _run(tiny_config(*common, "--config.train.grad_accum_steps=4"),
                                jax.devices()[:1], steps=2)
  np.testing.assert_allclose(accum, full, rtol=1e-6)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=2e-6), accum_params, full_params)


def test_mesh_errors_name_the_fix():
  from bert_jax.errors import UserError
  with pytest.raises(UserError, match="needs 16 devices but 8 are available"):
    partitioning.make_mesh(tiny_config("--config.mesh.data=4", "--config.mesh.tensor=4").mesh)
  with pytest.raises(UserError, match="divisible by data-parallel size"):
    build_train_setup(tiny_config("--config.train.grad_accum_steps=3"), partitioning.make_mesh(
        tiny_config().mesh, jax.devices()[:1]))
