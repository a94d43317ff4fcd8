"""LAMB against a NumPy step written from the paper; schedules; weight-decay masks."""
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from bert_jax.training import optim


def _numpy_lamb(params, grads_seq, stacked, lr, b1, b2, eps, wd, clip):
  """Reference LAMB (You et al. 2020, Alg. 2) with global-norm clipping, per-layer trust ratios."""
  m = {k: np.zeros_like(v) for k, v in params.items()}
  v = {k: np.zeros_like(p) for k, p in params.items()}
  p = {k: x.copy() for k, x in params.items()}
  for t, grads in enumerate(grads_seq, start=1):
    norm = np.sqrt(sum(np.sum(g ** 2) for g in grads.values()))
    scale = min(1.0, clip / norm)
    for k in p:
      g = grads[k] * scale
      m[k] = b1 * m[k] + (1 - b1) * g
      v[k] = b2 * v[k] + (1 - b2) * g ** 2
      u = (m[k] / (1 - b1 ** t)) / (np.sqrt(v[k] / (1 - b2 ** t)) + eps)
      adapt = not k.endswith(("bias", "scale"))
      if adapt:
        u = u + wd * p[k]
        slices = range(p[k].shape[0]) if stacked[k] else [slice(None)]
        for s in slices:
          w_norm, u_norm = np.linalg.norm(p[k][s]), np.linalg.norm(u[s])
          ratio = w_norm / u_norm if w_norm > 0 and u_norm > 0 else 1.0
          u[s] = u[s] * ratio
      p[k] = p[k] - lr * u
  return p


def test_lamb_matches_reference_with_per_layer_trust_ratio_on_stacked_weights():
  rng = np.random.RandomState(0)
  params = {"layers/kernel": rng.randn(3, 4, 5).astype(np.float32) * np.array([1, 10, 100])[:, None, None],
            "layers/bias": rng.randn(3, 5).astype(np.float32),
            "embedding": rng.randn(7, 4).astype(np.float32),
            "norm/scale": np.ones(4, np.float32)}
  stacked = {"layers/kernel": True, "layers/bias": True, "embedding": False, "norm/scale": False}
  grads_seq = [{k: rng.randn(*v.shape).astype(np.float32) for k, v in params.items()} for _ in range(2)]
  hp = dict(lr=0.01, b1=0.9, b2=0.999, eps=1e-6, wd=0.01, clip=1.0)
  expected = _numpy_lamb(params, grads_seq, stacked, **hp)

  def tree(flat):  # nested dicts, as Flax params are, so decay_mask sees the leaf names
    return {"layers": {"kernel": flat["layers/kernel"], "bias": flat["layers/bias"]},
            "embedding": flat["embedding"], "norm": {"scale": flat["norm/scale"]}}

  tx = optim.lamb(hp["lr"], b1=hp["b1"], b2=hp["b2"], eps=hp["eps"], weight_decay=hp["wd"],
                  clip_norm=hp["clip"], stacked=tree(stacked))
  p = jax.tree.map(jnp.asarray, tree(params))
  state = tx.init(p)
  for grads in grads_seq:
    updates, state = tx.update(jax.tree.map(jnp.asarray, tree(grads)), state, p)
    p = optax.apply_updates(p, updates)
  for key, value in expected.items():
    np.testing.assert_allclose(np.asarray(_get(p, key)), value, rtol=2e-5, atol=1e-6, err_msg=key)


def _get(tree, key):
  for part in key.split("/"):
    tree = tree[part]
  return tree


def test_per_array_trust_ratio_differs_from_per_layer():
  w = {"layers": {"kernel": jnp.stack([jnp.ones((2, 2)), 100 * jnp.ones((2, 2))])}}
  g = {"layers": {"kernel": jnp.ones((2, 2, 2))}}
  per_layer = optim.scale_by_layerwise_trust_ratio(optim.decay_mask, {"layers": {"kernel": True}})
  per_array = optim.scale_by_layerwise_trust_ratio(optim.decay_mask, None)
  a, _ = per_layer.update(g, per_layer.init(w), w)
  b, _ = per_array.update(g, per_array.init(w), w)
  np.testing.assert_allclose(a["layers"]["kernel"][:, 0, 0], [1.0, 100.0], rtol=1e-6)
  ratio = np.sqrt(4 + 4 * 100 ** 2) / np.sqrt(8)
  np.testing.assert_allclose(b["layers"]["kernel"][:, 0, 0], [ratio, ratio], rtol=1e-6)


def test_decay_mask_excludes_layer_norm_and_biases():
  params = {"dense": {"kernel": 1, "bias": 2}, "layer_norm": {"scale": 3, "bias": 4},
            "mlm_head": {"output_bias": 5}, "embeddings": {"word_embeddings": {"embedding": 6}}}
  mask = optim.decay_mask(params)
  assert mask == {"dense": {"kernel": True, "bias": False}, "layer_norm": {"scale": False, "bias": False},
                  "mlm_head": {"output_bias": False}, "embeddings": {"word_embeddings": {"embedding": True}}}


def test_warmup_then_linear_and_polynomial_decay():
  cfg = ml_collections.ConfigDict(dict(learning_rate=1e-3, warmup_steps=10, decay="linear",
                                       decay_power=2.0, end_learning_rate=0.0))
  linear = optim.learning_rate_schedule(cfg, 110)
  np.testing.assert_allclose([float(linear(s)) for s in (0, 5, 10, 60, 110)],
                             [0, 5e-4, 1e-3, 5e-4, 0], rtol=1e-5, atol=1e-9)
  cfg.decay = "polynomial"
  poly = optim.learning_rate_schedule(cfg, 110)
  np.testing.assert_allclose(float(poly(60)), 1e-3 * 0.5 ** 2, rtol=1e-5)

