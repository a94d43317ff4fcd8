"""bert_jax.models.dropout: Threefry bits equal JAX's, drop rates, scaling, sharding invariance; erf GELU."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.random import threefry2x32_p
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from bert_jax.models import activations
from bert_jax.models.dropout import Dropout, keep_mask, threefry2x32


def test_threefry_matches_jax_primitive():
  rng = np.random.default_rng(0)
  k1, k2 = (np.uint32(v) for v in rng.integers(0, 2 ** 32, 2))
  x1, x2 = (rng.integers(0, 2 ** 32, 1000, dtype=np.uint64).astype(np.uint32) for _ in range(2))
  ours = jax.jit(threefry2x32)(k1, k2, x1, x2)
  ref = threefry2x32_p.bind(jnp.uint32(k1), jnp.uint32(k2), jnp.asarray(x1), jnp.asarray(x2))
  np.testing.assert_array_equal(ours[0], ref[0])
  np.testing.assert_array_equal(ours[1], ref[1])
  # The published known-answer vector (Random123 kat_vectors: threefry2x32_20, key = counter = pi digits).
  pi = np.uint32([0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344])
  out = threefry2x32(pi[2], pi[3], pi[:1], pi[1:2])
  assert (int(out[0][0]), int(out[1][0])) == (0xC4923A9C, 0x483DF7A0)


@pytest.mark.parametrize("rate", [0.1, 0.5, 0.9])
def test_drop_fraction_is_the_rate_in_every_lane(rate):
  keep = np.asarray(jax.jit(keep_mask, static_argnums=(1, 2))(jax.random.key(3), (32, 128, 256), rate))
  n = keep.size
  sigma = np.sqrt(rate * (1 - rate) / n)
  assert abs((1 - keep.mean()) - rate) < 5 * sigma
  # Each 16-bit half of each word feeds one quarter of the last axis: check each quarter separately.
  for quarter in np.split(keep, 4, axis=-1):
    assert abs((1 - quarter.mean()) - rate) < 5 * sigma * 2
  # Neighbours are independent: P(both dropped) = rate^2.
  both = (~keep[..., :-1] & ~keep[..., 1:]).mean()
  assert abs(both - rate ** 2) < 5 * np.sqrt(rate ** 2 * (1 - rate ** 2) / n)


def test_masks_depend_on_the_key_only():
  a = keep_mask(jax.random.key(0), (64, 96), 0.1)
  b = keep_mask(jax.random.key(0), (64, 96), 0.1)
  c = keep_mask(jax.random.key(1), (64, 96), 0.1)
  np.testing.assert_array_equal(a, b)
  agree_dropped = (~np.asarray(a) & ~np.asarray(c)).mean()
  assert agree_dropped < 0.03  # independent masks co-drop ~1% of elements; identical ones 10%
  raw = keep_mask(jax.random.PRNGKey(0), (64, 96), 0.1)  # a legacy uint32[2] key works too
  assert raw.shape == (64, 96)


@pytest.mark.parametrize("shape", [(), (7,), (3, 5, 7), (2, 3, 4, 9)])
def test_any_shape(shape):
  keep = keep_mask(jax.random.key(0), shape, 0.5)
  assert keep.shape == shape and keep.dtype == jnp.bool_


def test_module_scales_to_preserve_the_expectation():
  x = jnp.ones((64, 128, 64))
  module = Dropout(0.1)
  y = np.asarray(module.apply({}, x, deterministic=False, rngs={"dropout": jax.random.key(5)}))
  kept = y != 0
  np.testing.assert_allclose(y[kept], 65536 / (65536 - 6554), rtol=1e-6)  # 1 / (1 - 6554/65536)
  assert abs(y.mean() - 1.0) < 5 * np.sqrt(0.1 / 0.9 / y.size)
  np.testing.assert_array_equal(module.apply({}, x, deterministic=True), x)
  np.testing.assert_array_equal(Dropout(0.0).apply({}, x, deterministic=False), x)
  np.testing.assert_array_equal(
      Dropout(1.0).apply({}, x, deterministic=False, rngs={"dropout": jax.random.key(5)}), 0 * x)
  with pytest.raises(ValueError, match="dropout rate"):
    Dropout(1.5).apply({}, x, deterministic=False, rngs={"dropout": jax.random.key(5)})


def test_gradient_is_the_mask_times_the_scale():
  x = jax.random.normal(jax.random.key(0), (16, 32))
  apply = lambda x: Dropout(0.3).apply({}, x, deterministic=False, rngs={"dropout": jax.random.key(2)})
  keep = np.asarray(apply(x)) != 0
  assert 0.5 < keep.mean() < 0.9
  grad = jax.grad(lambda x: jnp.sum(apply(x)))(x)
  np.testing.assert_allclose(grad, keep * (65536 / (65536 - round(0.3 * 65536))), rtol=1e-6)


def test_mask_does_not_depend_on_sharding():
  assert jax.device_count() == 8, "tests/conftest.py sets 8 CPU devices"
  mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "tensor"))
  shape = (8, 16, 4, 32)
  key = jax.random.key(11)
  whole = jax.jit(keep_mask, static_argnums=(1, 2))(key, shape, 0.1)
  for spec in (P("data"), P("data", None, "tensor"), P(None, "tensor", None, "data"), P(None, None, None, "tensor")):
    sharded = jax.jit(keep_mask, static_argnums=(1, 2), out_shardings=NamedSharding(mesh, spec))(key, shape, 0.1)
    np.testing.assert_array_equal(sharded, whole)


def test_gelu_is_the_erf_formula():
  x = jnp.linspace(-12.0, 12.0, 4001)
  ref = jax.nn.gelu(x, approximate=False)  # JAX's erfc formulation
  np.testing.assert_allclose(activations.gelu(x), ref, atol=1e-6, rtol=1e-6)
  np.testing.assert_allclose(jax.vmap(jax.grad(activations.gelu))(x),
                             jax.vmap(jax.grad(lambda v: jax.nn.gelu(v, approximate=False)))(x), atol=1e-6)
  # Hand values: gelu(1) = 0.5 * (1 + erf(1/sqrt 2)) = 0.8413447460685429; gelu(-1) = -0.15865525393145707.
  np.testing.assert_allclose(activations.gelu(jnp.array([1.0, -1.0, 0.0])), [0.8413447, -0.1586553, 0.0], atol=1e-6)
