"""Q-BERT: the power iteration against eigvalsh of the full Hessian, bit packing, group-wise
quantization against NumPy, the bit allocation under a budget, and `bert-jax quantize --mode hessian`
end to end on the session's fine-tuned sst2 model."""
import json
import os

import flax.linen as nn
import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import pytest

import data_fixtures
from bert_jax import cli, params_checkpoint
from bert_jax.config_utils import load_config
from bert_jax.errors import UserError
from bert_jax.finetune import heads
from bert_jax.finetune.objective import FinetuneObjective
from bert_jax.models import families
from bert_jax.ops import hessian
from core_helpers import slow

pytest.importorskip("qwix")
from bert_jax.compress import qbert  # noqa: E402  pylint: disable=wrong-import-position
from bert_jax.ops import int8, lowbit  # noqa: E402  pylint: disable=wrong-import-position

RNG = np.random.default_rng(0)


def _mlp_loss(params, x, y):
  h = jnp.tanh(x @ params["w1"] + params["b1"])
  return jnp.mean((h @ params["w2"] - y) ** 2)


def test_power_iteration_gives_the_top_eigenvalue_of_the_full_hessian():
  """A tiny MLP (31 parameters): the power iteration on jvp-of-grad products against the eigenvalue of
  largest magnitude of jax.hessian's full matrix."""
  params = {"w1": jnp.asarray(RNG.normal(size=(3, 5)), jnp.float32), "b1": jnp.asarray(RNG.normal(size=5) * .1,
                                                                                          jnp.float32),
            "w2": jnp.asarray(RNG.normal(size=(5, 2)), jnp.float32)}
  x, y = jnp.asarray(RNG.normal(size=(16, 3)), jnp.float32), jnp.asarray(RNG.normal(size=(16, 2)), jnp.float32)
  loss = lambda p: _mlp_loss(p, x, y)  # noqa: E731
  flat, unravel = jax.flatten_util.ravel_pytree(params)
  full = jax.jit(jax.hessian(lambda f: loss(unravel(f))))(flat)
  np.testing.assert_allclose(full, full.T, atol=1e-5)
  eigenvalues = np.linalg.eigvalsh(np.asarray(full, np.float64))
  want = eigenvalues[np.argmax(np.abs(eigenvalues))]
  second = np.sort(np.abs(eigenvalues))[-2]
  assert second < 0.7 * abs(want), eigenvalues  # power iteration's premise: the top |eigenvalue| stands apart
  product = jax.jit(lambda v: hessian.hvp(loss, params, v))
  got, steps = hessian.top_eigenvalue(product, params, jax.random.key(1), iterations=200, tol=1e-7)
  assert got == pytest.approx(want, rel=1e-4) and steps < 200, (got, want, eigenvalues[-3:], steps)
  # and a quadratic whose Hessian is a known matrix with a negative dominant eigenvalue
  a = RNG.normal(size=(6, 6))
  q = jnp.asarray(a @ np.diag([-9., 4., 3., 2., 1., .5]) @ np.linalg.inv(a), jnp.float32)
  sym = (q + q.T) / 2
  quad = lambda v: 0.5 * v["x"] @ sym @ v["x"]  # noqa: E731
  got, _ = hessian.top_eigenvalue(jax.jit(lambda v: hessian.hvp(quad, {"x": jnp.zeros(6)}, v)),
                                  {"x": jnp.zeros(6)}, jax.random.key(0), iterations=200, tol=1e-7)
  e = np.linalg.eigvalsh(np.asarray(sym, np.float64))
  assert got == pytest.approx(e[np.argmax(np.abs(e))], rel=1e-4)


@pytest.mark.parametrize("scan, layer", [(True, 1), pytest.param(False, 0, marks=slow)])
def test_layer_sensitivity_is_the_top_eigenvalue_of_that_layers_hessian(scan, layer):
  """A tiny fine-tuning model (hidden 8, 2 layers): the sensitivity's eigenvalue for one layer against
  eigvalsh of jax.hessian of the task loss in that layer's 512 matmul weights (a scanned encoder's slice
  of its stacked leaves, or an unrolled encoder's own layer)."""
  config = load_config("configs/glue.py:sst2", [
      "--config.model.num_layers=2", "--config.model.hidden_size=8", "--config.model.num_heads=2",
      "--config.model.intermediate_size=16", f"--config.model.scan_layers={scan}"])
  model = heads.FinetuneModel(families.model_config({**config.model.to_dict(), "vocab_size": 20}),
                              "classification", 2, config.head.pooling, config.head.dropout)
  # Its own generator: the batch, and so the spectrum, must not depend on which tests ran before.
  batch = {"input_ids": jnp.asarray(np.random.default_rng(1).integers(1, 20, size=(4, 6)), jnp.int32),
           "attention_mask": jnp.ones((4, 6), jnp.int32), "token_type_ids": jnp.zeros((4, 6), jnp.int32),
           "label": jnp.asarray([0, 1, 1, 0], jnp.int32)}
  objective = FinetuneObjective(model)
  # weights 10x BERT's init (std 0.2): a curvature well above float32's noise, one eigenvalue well apart
  params = jax.tree.map(lambda x: x * 10 if x.ndim >= 2 else x,
                        nn.meta.unbox(jax.jit(objective.init)(jax.random.key(0), batch)))
  kernels = qbert.layer_kernels(params, layer)
  flat, unravel = jax.flatten_util.ravel_pytree(kernels)
  assert flat.size == 4 * 8 * 8 + 2 * 8 * 16

  def loss(f):
    p = qbert.with_layer(params, layer, unravel(f))
    return objective.sums(p, batch, None, True)["loss"] / objective.counts(batch)["labels"]
  eigenvalues = np.linalg.eigvalsh(np.asarray(jax.jit(jax.hessian(loss))(flat), np.float64))
  want = eigenvalues[np.argmax(np.abs(eigenvalues))]
  second = np.sort(np.abs(eigenvalues))[-2]
  assert second < 0.7 * abs(want), eigenvalues  # power iteration's premise: the top |eigenvalue| stands apart
  report = qbert.sensitivities(objective, params, [batch, batch], [layer], iterations=300, tol=1e-6)[0]
  assert report["eigenvalues"][0] == pytest.approx(want, rel=1e-4), (report, eigenvalues[-3:])
  assert report["sensitivity"] == pytest.approx(abs(want), rel=1e-4) and report["std"] < 1e-4 * abs(want)


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_pack_unpack_round_trip_and_sizes(bits):
  values = RNG.integers(-(1 << (bits - 1)), 1 << (bits - 1), size=37)
  packed = lowbit.pack(values, bits)
  assert packed.dtype == np.uint8 and packed.size == -(-37 * bits // 8)
  np.testing.assert_array_equal(lowbit.unpack(packed, bits, 37), values)


def test_packing_by_hand():
  # offsets +2 (2 bits): -2,-1,0,1 -> 0,1,2,3, little-endian in one byte: 0b11_10_01_00
  assert lowbit.pack(np.array([-2, -1, 0, 1]), 2).tolist() == [0b11100100]
  # 4 bits: -8 -> 0 in the low nibble, 7 -> 15 in the high one
  assert lowbit.pack(np.array([-8, 7, 0]), 4).tolist() == [0xF0, 0x08]
  # 3 bits, 8 values in 3 bytes: 0..7 offset by 4 from -4..3
  assert lowbit.pack(np.arange(-4, 4), 3).tolist() == [0b10001000, 0b11000110, 0b11111010]


def _numpy_groupwise(w, contracted, bits, groups_shape):
  """NumPy reference on the [outputs, inputs] matrix: groups of rows, absmax / (2**(b-1) - 0.5)."""
  outputs = [a for a in range(w.ndim) if a not in contracted]
  m = np.transpose(w, outputs + list(contracted)).reshape(int(np.prod([w.shape[a] for a in outputs])), -1)
  g = m.reshape(groups_shape, -1)
  scale = np.abs(g).max(axis=1) / (2 ** (bits - 1) - 0.5)
  ratio = (g / scale[:, None]).reshape(m.shape)
  return np.clip(np.rint(ratio), -(1 << (bits - 1)), (1 << (bits - 1)) - 1), scale, ratio


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("path, shape, contracted, groups, want_groups", [
    (("encoder", "layer_0", "attention", "query", "kernel"), (8, 4, 6), (0,), 4, 4),  # one scale a head
    (("encoder", "layer_0", "attention", "query", "kernel"), (8, 4, 6), (0,), 8, 8),  # two a head
    (("encoder", "layer_0", "attention", "query", "kernel"), (8, 4, 6), (0,), 2, 2),  # two heads a group
    (("encoder", "layer_0", "attention", "out", "kernel"), (4, 6, 8), (0, 1), 4, 4),
    (("encoder", "layer_0", "feed_forward", "intermediate", "kernel"), (8, 12), (0,), 5, 4),  # 4 divides 12
])
def test_groupwise_quantization_matches_numpy(bits, path, shape, contracted, groups, want_groups):
  w = RNG.normal(size=shape).astype(np.float32)
  packed, scale = lowbit.quantize_weight(w, contracted, bits, groups)
  assert scale.shape == (want_groups,)
  want_q, want_scale, ratio = _numpy_groupwise(w, contracted, bits, want_groups)
  np.testing.assert_allclose(scale, want_scale, rtol=1e-6)
  got_q = lowbit.unpack(packed, bits, w.size).reshape(want_q.shape)
  ties = np.abs(np.abs(ratio % 1) - 0.5) < 1e-4  # x.5 in float32: either neighbour is right
  np.testing.assert_array_equal(got_q[~ties], want_q[~ties])
  back = lowbit.dequantize_weight(packed, scale, bits, shape, contracted)
  outputs = [a for a in range(len(shape)) if a not in contracted]
  back_matrix = np.transpose(back, outputs + list(contracted)).reshape(want_q.shape)
  w_matrix = np.transpose(w, outputs + list(contracted)).reshape(want_q.shape)
  row_scale = np.repeat(scale, want_q.shape[0] // want_groups)[:, None]
  # half a step, up to float32 rounding of w / scale (about 127.5 * 2**-23 of a step at 8 bits)
  assert np.all(np.abs(back_matrix - w_matrix) <= row_scale / 2 * (1 + 1e-4))
  # the tree form: the path picks the contracted axes; a stacked leaf has one width per layer
  tree = {}
  node = tree
  for key in ("encoder", "layers") + path[2:-1]:
    node = node.setdefault(key, {})
  node["kernel"] = np.stack([w, 2 * w])
  restored = lowbit.dequantize_params(lowbit.quantize_params(tree, lambda p: [bits, 8], groups))
  for key in ("encoder", "layers") + path[2:]:
    restored = restored[key]
  np.testing.assert_allclose(restored[0], back, rtol=1e-6)
  assert np.max(np.abs(restored[1] - 2 * w)) <= np.max(np.abs(2 * w)) / 127.5 / 2 * (1 + 1e-4)
  unrolled = lowbit.quantize_params({"encoder": {"layer_0": {"x": {path[-2]: {"kernel": w}}}}}, lambda p: bits, groups)
  leaf = unrolled["encoder"]["layer_0"]["x"][path[-2]]["kernel"]
  assert leaf["packed"].dtype == np.uint8 and leaf["packed"].size == -(-w.size * bits // 8)
  np.testing.assert_allclose(lowbit.dequantize_params(unrolled)["encoder"]["layer_0"]["x"][path[-2]]["kernel"], back,
                             rtol=1e-6)


def test_groupwise_exact_values_by_hand():
  # a Dense kernel [in=2, out=4], 2 groups of 2 output units, 4 bits: scale = absmax / 7.5
  w = np.array([[7.5, 1.0, 0.0, -0.375], [-2.0, 3.2, 1.875, 0.125]], np.float32)
  packed, scale = lowbit.quantize_weight(w, (0,), 4, 2)
  np.testing.assert_allclose(scale, [1.0, 0.25], rtol=1e-6)
  # group 0 (outputs 0, 1): [7.5, -2] -> [7 (8 clipped), -2], [1.0, 3.2] -> [1, 3];
  # group 1 (outputs 2, 3) / 0.25: [0, 7.5] -> [0, 7 (8 clipped)], [-1.5, 0.5] -> [-2, 0] (half to even)
  np.testing.assert_array_equal(lowbit.unpack(packed, 4, 8), [7, -2, 1, 3, 0, 7, -2, 0])
  np.testing.assert_array_equal(lowbit.dequantize_weight(packed, scale, 4, w.shape, (0,)),
                                [[7.0, 1.0, 0.0, -0.5], [-2.0, 3.0, 1.75, 0.0]])


def _costs(n):
  return {b: n * b // 8 for b in lowbit.BITS}


def test_allocation_respects_the_budget_and_the_order():
  sensitivity = [0.5, 30.0, 3.0, 8.0]
  costs, counts = [_costs(800)] * 4, [800] * 4  # 100 bytes a bit
  for budget in (800, 1000, 1300, 1700, 2400, 3200):
    bits = qbert.allocate_bits(sensitivity, costs, counts, budget)
    assert sum(c[b] for c, b in zip(costs, bits)) <= budget
    by_rank = [bits[i] for i in np.argsort(sensitivity)[::-1]]
    assert by_rank == sorted(by_rank, reverse=True), (budget, bits)
  assert qbert.allocate_bits(sensitivity, costs, counts, 800) == [2, 2, 2, 2]
  assert qbert.allocate_bits(sensitivity, costs, counts, 3200) == [8, 8, 8, 8]
  # 200 bytes over all-2: the top layer 2->3 (removes 30 * (4**-2 - 4**-3) = 1.41 per 100 bytes), then the
  # second's 2->3 (8 * 0.047 = 0.375) beats the top one's 3->4 (30 * 0.0117 = 0.35)
  assert qbert.allocate_bits(sensitivity, costs, counts, 1000) == [2, 3, 2, 3]
  # 500 bytes: then the top 3->4 (0.35), the third 2->3 (0.14), the second 3->4 (0.094); never 4->8 (400 bytes)
  assert qbert.allocate_bits(sensitivity, costs, counts, 1300) == [2, 4, 3, 4]
  with pytest.raises(UserError, match="need 800"):
    qbert.allocate_bits(sensitivity, costs, counts, 799)


def test_bits_per_layer_parsing():
  assert qbert.parse_bits("[8, 4, 3]", 3) == [8, 4, 3] and qbert.parse_bits("4", 2) == [4, 4]
  for bad in ("[8, 5]", "[8]", "x"):
    with pytest.raises(UserError):
      qbert.parse_bits(bad, 2)


def _results(workdir):
  with open(os.path.join(workdir, "eval_results.json")) as f:
    return json.load(f)


def test_hessian_quantize_at_8_bits_keeps_predictions_and_bytes_fall_with_bits(sst2_finetuned, tmp_path, capsys):
  """--bits-per-layer 8 keeps the float model's predictions and `predict` serves the packed workdir; the
  same model's bytes at 4, 3 and 2 bits fall with the bits, by exactly the packed weights' bytes."""
  data, workdir, _ = sst2_finetuned
  out = str(tmp_path / "q8")
  assert cli.main(["quantize", "--model", workdir, "--output", out, "--mode", "hessian",
                   "--bits-per-layer", "8", "--groups", "4"]) == 0
  results = _results(out)
  assert results["bits_per_layer"] == [8, 8] and results["average_bits"] == 8
  assert results["agreement"] >= 0.95 and results["quantized"]["accuracy"] >= results["float"]["accuracy"] - 0.02
  saved = json.load(open(os.path.join(out, "config.json")))["quantization"]
  assert saved["bits_per_layer"] == [8, 8] and saved["groups"] == 4
  assert "bits per layer [8, 8] (average 8.00)" in capsys.readouterr().out
  accuracy = data_fixtures.predict_accuracy(out, data, tmp_path / "predictions.jsonl")
  assert accuracy == pytest.approx(results["quantized"]["accuracy"])
  params = params_checkpoint.load_params(workdir)[0]
  sizes = {bits: int8.tree_bytes(qbert.quantize_tree(params, [bits, bits], 4)) for bits in (8, 4, 3, 2)}
  assert sizes[8] == results["bytes"]["quantized"] and sizes[8] > sizes[4] > sizes[3] > sizes[2], sizes
  kernels = sum(np.size(w) for layer in range(2) for w in qbert.layer_kernels(params, layer).values())
  assert sizes[4] - sizes[2] == kernels * 2 // 8  # 2 bits less per encoder weight, the scales unchanged
  capsys.readouterr()
  assert cli.main(["quantize", "--model", out, "--output", str(tmp_path / "again"), "--mode", "hessian",
                   "--bits-per-layer", "4"]) == 2
  assert "already quantized" in capsys.readouterr().err


@slow  # two more quantize runs and the Hessian of each layer on two batches: ~40 s on 2 cores
def test_hessian_quantize_under_a_budget(sst2_finetuned, tmp_path):
  """--budget-bytes: the Hessian's sensitivities pick the bits, the bytes stay within the budget, the most
  sensitive layer gets the most bits."""
  _, workdir, _ = sst2_finetuned
  params = params_checkpoint.load_params(workdir)[0]
  budget = (int8.tree_bytes(qbert.quantize_tree(params, [4, 4], 4)) +
            int8.tree_bytes(qbert.quantize_tree(params, [2, 2], 4))) // 2
  out = str(tmp_path / "budget")
  assert cli.main(["quantize", "--model", workdir, "--output", out, "--mode", "hessian", "--budget-bytes",
                   str(budget), "--groups", "4", "--hessian-batches", "2", "--power-iterations", "30"]) == 0
  results = _results(out)
  assert results["bytes"]["quantized"] <= budget and 2 < results["average_bits"] < 4, results
  sens = [layer["sensitivity"] for layer in results["sensitivity"]]
  assert all(len(layer["eigenvalues"]) == 2 for layer in results["sensitivity"]) and min(sens) > 0
  assert results["bits_per_layer"][int(np.argmax(sens))] == max(results["bits_per_layer"])
  assert cli.main(["quantize", "--model", workdir, "--output", str(tmp_path / "small"), "--mode", "hessian",
                   "--budget-bytes", "1000"]) == 2
