"""The sharded train step: a 2x2x2 data/fsdp/tensor mesh of 8 CPU devices equals one device."""
import math
import re

import jax
import numpy as np
import pytest

from bert_jax.tpu import hlo
from bert_jax.training import partitioning
from bert_jax.training.step import build_train_setup
from core_helpers import random_batch, slow, tiny_config


def _run(config, devices, steps=3):
  setup = build_train_setup(config, partitioning.make_mesh(config.mesh, devices))
  state = setup.init_state(jax.random.key(0))
  losses = []
  for i in range(steps):
    state, metrics = setup.train_step(state, partitioning.global_batch(random_batch(i), setup.mesh),
                                      jax.random.key(1))
    losses.append(float(metrics["loss"]))
  return losses, jax.device_get(state.params), setup


LAMB = ("--config.optimizer.name=lamb", "--config.optimizer.warmup_steps=1", "--config.optimizer.learning_rate=1e-2")
MESH_2X2X2 = ("--config.mesh.data=2", "--config.mesh.fsdp=2", "--config.mesh.tensor=2")


@pytest.fixture(scope="module")
def one_device():
  """accum -> the one-device run with that many micro-batches, run when a test first asks for it."""
  runs = {}

  def run(accum):
    if accum not in runs:
      runs[accum] = _run(tiny_config(*LAMB, f"--config.train.grad_accum_steps={accum}"), jax.devices()[:1])
    return runs[accum]
  return run


# unrolled-scan: weekly (the rolled variant with micro-batches covers the mesh; scan_unroll is
# checked against the unrolled stack in test_family_models.py's test_scanned_equals_unrolled)
@pytest.mark.parametrize("unroll,accum", [pytest.param(2, 1, marks=slow), (1, 2)],
                         ids=["unrolled-scan", "rolled-scan-micro-batches"])
def test_2x2x2_mesh_equals_one_device(one_device, unroll, accum):
  """With micro-batches the step accumulates per device and reduces once (training/accumulate.py); with
  dropout on, each micro-batch draws the masks it draws on one device (rows numbered globally,
  models/batch_rows.py). They are not the one-pass step's masks: each micro-batch folds its index into the key."""
  assert jax.device_count() == 8
  config = tiny_config(*LAMB, *MESH_2X2X2, f"--config.model.scan_unroll={unroll}",
                       f"--config.train.grad_accum_steps={accum}")
  losses, params, setup = _run(config, jax.devices())
  ref_losses, ref_params, _ = one_device(accum)
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
  hlo = setup.train_step.lower(setup.abstract_state, batch, jax.random.key(1)).compile().as_text()
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
  with pytest.raises(UserError, match="train.grad_reduce_dtype='float16'"):
    build_train_setup(tiny_config("--config.train.grad_reduce_dtype=float16"), partitioning.make_mesh(
        tiny_config().mesh, jax.devices()[:1]))


def _gradient_collectives(mesh, accum, *overrides):
  """{kind: (count, bytes)} of the all-reduces and reduce-scatters of a compiled step (32 rows)."""
  config = tiny_config(*mesh, f"--config.train.grad_accum_steps={accum}", "--config.train.batch_size=32", *overrides)
  setup = build_train_setup(config, partitioning.make_mesh(config.mesh, jax.devices()))
  state = setup.abstract_state
  batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=partitioning.batch_sharding(setup.mesh))
           for k, v in random_batch(0, batch=32).items()}
  text = setup.train_step.lower(state, batch, jax.random.key(1)).compile().as_text()
  found = {c["kind"]: (c["count"], c["bytes"]) for c in hlo.collectives(text, 8)}
  # A ring over 8 devices sends 7/8 of a leaf to reduce-scatter it (the leaves split over fsdp) and
  # twice that to all-reduce it (the others).
  split = lambda x: setup.mesh.shape["fsdp"] > 1 and "fsdp" in str(x.sharding.spec)  # noqa: E731
  ring = sum(math.prod(x.shape) * 4 * 7 / 8 * (1 if split(x) else 2) for x in jax.tree.leaves(state.params))
  return found, ring, text


# data: weekly (its one all-reduce per step is also asserted by test_bfloat16_gradient_reduction's float32 bytes)
@pytest.mark.parametrize("mesh,kind", [pytest.param(("--config.mesh.data=8",), "all-reduce", marks=slow),
                                       (("--config.mesh.data=1", "--config.mesh.fsdp=8"), "reduce-scatter")],
                         ids=["data", "fsdp"])
def test_gradients_are_reduced_once_per_step(mesh, kind):
  """4 micro-batches send what 2 do: one reduction of each gradient leaf after the loop, none inside it
  (the old step, reducing per micro-batch, sent 4x one reduction with 4 micro-batches)."""
  (two, ring, _), (four, _, _) = (_gradient_collectives(mesh, accum) for accum in (2, 4))
  assert two == four
  sent = sum(four.get(k, (0, 0))[1] for k in ("all-reduce", "reduce-scatter"))
  assert ring <= sent <= 1.02 * ring  # + the metrics' sums
  assert kind in four


def _lowered_all_reduce_bytes(*overrides) -> tuple[dict[str, int], int]:
  """{dtype: bytes} of the all-reduces' buffers in the step as JAX hands it to XLA (data=8, 2
  micro-batches, 32 rows), and the model's parameter count."""
  config = tiny_config("--config.mesh.data=8", "--config.train.grad_accum_steps=2", "--config.train.batch_size=32",
                       *overrides)
  setup = build_train_setup(config, partitioning.make_mesh(config.mesh, jax.devices()))
  batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=partitioning.batch_sharding(setup.mesh))
           for k, v in random_batch(0, batch=32).items()}
  text = setup.train_step.lower(setup.abstract_state, batch, jax.random.key(1)).as_text(dialect="hlo")
  sizes = {"f32": 4, "bf16": 2}
  found: dict[str, int] = {}
  for dtype, dims in re.findall(r"= (\w+)\[([\d,]*)\]\S* all-reduce\(", text):
    found[dtype] = found.get(dtype, 0) + sizes[dtype] * math.prod(int(d) for d in dims.split(",") if d)
  return found, sum(math.prod(x.shape) for x in jax.tree.leaves(setup.abstract_state.params))


def test_bfloat16_gradient_reduction():
  """train.grad_reduce_dtype=bfloat16: the step hands XLA its gradients' all-reduces in bf16 (half the
  bytes; the metrics' sums stay f32). The lowered module is checked: XLA:CPU's passes promote bf16
  all-reduces to f32 (XLA:TPU keeps them). Its closeness to the float32 step: the weekly test below."""
  (f32, params), (bf16, _) = (_lowered_all_reduce_bytes(f"--config.train.grad_reduce_dtype={d}")
                               for d in ("float32", "bfloat16"))
  assert set(f32) == {"f32"} and params * 4 <= f32["f32"] < params * 4 * 1.01
  assert bf16["bf16"] == params * 2 and bf16["f32"] < 0.01 * params * 4


@slow  # two 3-step runs on 4 devices (~20 s); the bf16 bytes are checked above in the suite
def test_bfloat16_gradient_reduction_stays_close_to_float32():
  """BENCHMARKS.md measures the difference over more steps."""
  # _run's 8 rows: 4 devices x 2 micro-batches, both steps in the shard_map.
  common = ("--config.model.hidden_dropout=0.0", "--config.model.attention_dropout=0.0", "--config.mesh.data=4",
            "--config.train.grad_accum_steps=2")
  exact, exact_params, _ = _run(tiny_config(*common), jax.devices()[:4])
  rounded, rounded_params, _ = _run(tiny_config(*common, "--config.train.grad_reduce_dtype=bfloat16"),
                                    jax.devices()[:4])
  np.testing.assert_allclose(rounded, exact, rtol=1e-3)
  differences = [float(np.max(np.abs(a - b))) for a, b in zip(jax.tree.leaves(rounded_params),
                                                              jax.tree.leaves(exact_params))]
  assert 0 < max(differences) < 1e-3  # rounded, by less than a step of the optimizer


def test_bert_large_splits_its_parameters_and_lamb_moments_over_every_device():
  """The large preset's mesh is data=1, fsdp=-1 (ZeRO-3 over all devices: each keeps and updates 1/n of the
  parameters and LAMB's moments; BENCHMARKS.md, issue 54): any device count resolves, one CPU device too, and
  on 8 devices each matrix and its two moments are split 8 ways (at the preset's own sizes, abstractly)."""
  from bert_jax.config_utils import load_config
  config = load_config("configs/bert.py:large", ["--config.train.batch_size=64", "--config.train.grad_accum_steps=1"])
  assert [partitioning.mesh_shape(config.mesh, n) for n in (1, 8, 64, 2048)] == [
      (1, 1, 1), (1, 8, 1), (1, 64, 1), (1, 2048, 1)]
  setup = build_train_setup(config, partitioning.make_mesh(config.mesh, jax.devices()))
  ffn = (24, 1024, 4096)  # the stacked layers' first feed-forward matrix
  shards = [s.shard_shape(ffn) for tree in ("params", "opt_state")
            for s, x in zip(jax.tree.leaves(getattr(setup.state_shardings, tree)),
                            jax.tree.leaves(getattr(setup.abstract_state, tree))) if getattr(x, "shape", ()) == ffn]
  assert shards == [(24, 128, 4096)] * 3  # the weight, LAMB's first and second moments
