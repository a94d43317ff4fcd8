"""Int8: per-channel weight quantization against a NumPy quantizer, the round-trip bound, the
straight-through gradient of the int8 matmul, and train.qat putting int8 dots into the train step."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.config_utils import load_config
from bert_jax.finetune import heads, trainer
from bert_jax.finetune.tasks import Task
from bert_jax.models.config import ModelConfig

pytest.importorskip("qwix")
from bert_jax.ops import int8  # noqa: E402  pylint: disable=wrong-import-position

RNG = np.random.default_rng(0)


def _numpy_int8(w, contracted):
  """Symmetric per-channel int8 with qwix's convention: the absmax maps to 127.5 (so the extreme
  value's bucket is a full one), round half to even, clip to [-128, 127]."""
  scale = np.abs(w).max(axis=contracted, keepdims=True) / 127.5
  return np.clip(np.rint(w / scale), -128, 127).astype(np.int8), scale


@pytest.mark.parametrize("path, shape, contracted", [
    (("encoder", "layers", "attention", "query", "kernel"), (2, 8, 2, 4), (1,)),  # scanned [L, H, N, D]
    (("encoder", "layer_0", "attention", "out", "kernel"), (2, 4, 8), (0, 1)),  # [N, D, H]
    (("encoder", "layer_0", "feed_forward", "intermediate", "kernel"), (8, 16), (0,)),
    (("embeddings", "word_embeddings", "embedding"), (30, 8), (1,)),  # one scale per token
])
def test_per_channel_int8_matches_numpy_and_stays_within_half_a_step(path, shape, contracted):
  w = RNG.normal(size=shape).astype(np.float32) * RNG.uniform(0.01, 3, size=shape[-1]).astype(np.float32)
  tree = {}
  node = tree
  for key in path[:-1]:
    node = node.setdefault(key, {})
  node[path[-1]] = w
  node["bias"] = np.ones(shape[-1], np.float32)
  quantized = int8.quantize_params(tree)
  leaf = quantized
  for key in path[:-1]:
    leaf = leaf[key]
  want_q, want_scale = _numpy_int8(w, contracted)
  assert leaf[path[-1]]["qvalue"].dtype == np.int8
  np.testing.assert_allclose(leaf[path[-1]]["scale"], want_scale, rtol=1e-6)
  got_q = leaf[path[-1]]["qvalue"].astype(int)
  ties = np.abs(np.abs(w / want_scale) % 1 - 0.5) < 1e-4  # x.5 in float32: either neighbour is right
  np.testing.assert_array_equal(got_q[~ties], want_q[~ties])
  assert np.all(np.abs(got_q - want_q) <= 1)
  assert leaf["bias"] is node["bias"]  # biases stay float
  back = int8.dequantize_params(quantized)
  for key in path:
    back = back[key]
  assert np.all(np.abs(back - w) <= want_scale / 2 * (1 + 1e-4))  # half a step, up to float32 rounding
  assert int8.tree_bytes(quantized) == w.size + want_scale.size * 4 + shape[-1] * 4  # int8 + f32 scales, bias


def _with_exact_scales(a, axis, scale):
  """`a` squeezed below 127 * scale with each channel's absmax set to 127.5 * scale (a power of two):
  the scale then divides exactly and the extreme value rounds on a true tie, the same on every backend."""
  a = np.clip(a, -126 * scale, 126 * scale)
  index = np.expand_dims(np.abs(a).argmax(axis=axis), axis)
  np.put_along_axis(a, index, np.where(np.take_along_axis(a, index, axis) < 0, -127.5, 127.5) * scale, axis)
  return a.astype(np.float32)


def test_int8_matmul_forward_is_int8_and_gradient_is_straight_through():
  x = _with_exact_scales(RNG.normal(size=(4, 8)), 1, 2.0 ** -6)
  dense = nn.Dense(3, use_bias=False)
  w = _with_exact_scales(RNG.normal(size=(8, 3)) * 0.3, 0, 2.0 ** -8)
  params = {"params": {"kernel": jnp.asarray(w)}}
  model = int8.int8_model(dense)
  qx, sx = _numpy_int8(x, (1,))  # activations: each row its own scale (dynamic)
  qw, sw = _numpy_int8(w, (0,))  # weights: each output unit its own scale
  want = (qx.astype(np.int32) @ qw.astype(np.int32)) * sx * sw
  np.testing.assert_allclose(model.apply(params, x), want, rtol=1e-5, atol=1e-6)
  assert not np.allclose(want, x @ w, atol=1e-4)  # the int8 product differs from the float one
  loss = lambda p, x: jnp.sum(model.apply(p, x) * jnp.arange(3.0))  # noqa: E731
  g_params, g_x = jax.grad(loss, argnums=(0, 1))(params, x)
  upstream = np.broadcast_to(np.arange(3.0), (4, 3))
  np.testing.assert_allclose(g_params["params"]["kernel"], x.T @ upstream, rtol=1e-5)  # STE: float x
  np.testing.assert_allclose(g_x, upstream @ w.T, rtol=1e-5, atol=1e-6)


def test_qat_switch_puts_int8_dots_in_the_train_step():
  def lowered(qat):
    config = load_config("configs/glue.py:sst2", [
        "--config.model.num_layers=1", "--config.model.hidden_size=16", "--config.model.num_heads=2",
        "--config.model.intermediate_size=32", "--config.data.max_seq_length=8", "--config.train.batch_size=8",
        f"--config.train.qat={qat}"])
    model = heads.encoder_config(ModelConfig.from_dict({**config.model.to_dict(), "vocab_size": 64}),
                                 "classification", "pooled")
    task = Task("sst2", "classification", 2, train=None, evals=[], tests=[], selection=("accuracy",))
    setup, _ = trainer.build_train_setup(config, model, task, num_train=8)
    batch = {k: jax.ShapeDtypeStruct((8, 8), jnp.int32) for k in ("input_ids", "attention_mask",
                                                                  "token_type_ids", "label")}
    batch["label"] = jax.ShapeDtypeStruct((8,), jnp.int32)
    return setup.train_step.lower(setup.abstract_state, batch, jax.random.key(0)).as_text()
  int8_dots = lambda text: sum("dot_general" in line and "xi8>" in line for line in text.splitlines())  # noqa: E731
  assert int8_dots(lowered(True)) >= 6 and int8_dots(lowered(False)) == 0
