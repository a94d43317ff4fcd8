"""LAMB against a NumPy step written from the paper; schedules; weight-decay masks."""
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from bert_jax.errors import UserError
from bert_jax.training import batch_warmup, optim


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



def _numpy_stable_adamw(params, grads_seq, stacked, lr, b1, b2, eps, wd):
  """StableAdamW (Wortsman et al. 2023, Algorithm 2) per tensor, per layer slice for stacked arrays."""
  m = {k: np.zeros_like(v) for k, v in params.items()}
  v = {k: np.zeros_like(p) for k, p in params.items()}
  p = {k: x.copy() for k, x in params.items()}
  for t, grads in enumerate(grads_seq, start=1):
    for k in p:
      g = grads[k]
      m[k] = b1 * m[k] + (1 - b1) * g
      v[k] = b2 * v[k] + (1 - b2) * g ** 2
      v_hat = v[k] / (1 - b2 ** t)
      u = (m[k] / (1 - b1 ** t)) / (np.sqrt(v_hat) + eps)
      if not k.endswith(("bias", "scale")):
        u = u + wd * p[k]
      for s in (range(p[k].shape[0]) if stacked[k] else [slice(None)]):
        rms = np.sqrt(np.mean(g[s] ** 2 / np.maximum(v_hat[s], eps ** 2)))
        u[s] = u[s] / max(1.0, rms)
      p[k] = p[k] - lr * u
  return p


def test_stable_adamw_matches_reference_with_update_clipping_per_layer():
  rng = np.random.RandomState(3)
  params = {"layers/kernel": rng.randn(3, 4, 5).astype(np.float32), "layers/bias": rng.randn(3, 5).astype(np.float32),
            "embedding": rng.randn(7, 4).astype(np.float32)}
  stacked = {"layers/kernel": True, "layers/bias": True, "embedding": False}
  # A gradient that jumps by 100x in one layer at step 3: its RMS(g / sqrt(v)) passes 1 there, and clips.
  grads_seq = [{k: rng.randn(*v.shape).astype(np.float32) for k, v in params.items()} for _ in range(3)]
  grads_seq[2]["layers/kernel"][1] *= 100
  hp = dict(lr=0.01, b1=0.9, b2=0.98, eps=1e-6, wd=0.1)
  expected = _numpy_stable_adamw(params, grads_seq, stacked, **hp)

  def tree(flat):
    return {"layers": {"kernel": flat["layers/kernel"], "bias": flat["layers/bias"]}, "embedding": flat["embedding"]}

  tx = optim.stable_adamw(hp["lr"], b1=hp["b1"], b2=hp["b2"], eps=hp["eps"], weight_decay=hp["wd"],
                          stacked=tree(stacked))
  p = jax.tree.map(jnp.asarray, tree(params))
  state = tx.init(p)
  for grads in grads_seq:
    updates, state = tx.update(jax.tree.map(jnp.asarray, tree(grads)), state, p)
    p = optax.apply_updates(p, updates)
  for key, value in expected.items():
    np.testing.assert_allclose(np.asarray(_get(p, key)), value, rtol=2e-5, atol=1e-6, err_msg=key)
  # The clipping acted: without it the jumped layer would move much further.
  plain = _numpy_stable_adamw(params, grads_seq[:2], stacked, **hp)
  jumped = np.abs(expected["layers/kernel"][1] - plain["layers/kernel"][1]).max()
  assert jumped < 1.01 * hp["lr"] * (1 + hp["wd"] * np.abs(plain["layers/kernel"][1]).max())


def test_warmup_stable_decay_at_its_phase_edges():
  cfg = ml_collections.ConfigDict(dict(learning_rate=1e-3, warmup_steps=10, decay="1-sqrt", decay_power=1.0,
                                       end_learning_rate=1e-5, decay_steps=40, decay_start=-1))
  wsd = optim.learning_rate_schedule(cfg, 100)  # stable from 10 to 60, then 1 - sqrt down to 1e-5 at 100
  steps = (0, 5, 10, 59, 60, 70, 100, 150)
  want = [0, 5e-4, 1e-3, 1e-3, 1e-3, 1e-5 + (1e-3 - 1e-5) * (1 - np.sqrt(10 / 40)), 1e-5, 1e-5]
  np.testing.assert_allclose([float(wsd(s)) for s in steps], want, rtol=1e-5, atol=1e-9)
  # A decay started from another stable checkpoint (step 30): the same rates up to there.
  cfg.decay_start = 30
  branch = optim.learning_rate_schedule(cfg, 100)
  np.testing.assert_allclose([float(branch(s)) for s in (10, 30, 40, 70)],
                             [1e-3, 1e-3, 1e-5 + (1e-3 - 1e-5) * 0.5, 1e-5], rtol=1e-5)
  cfg.decay_start = 5
  with pytest.raises(UserError, match="decay_start=5"):
    optim.learning_rate_schedule(cfg, 100)


def test_batch_warmup_thins_the_rows_that_count():
  rows = [int(batch_warmup.rows_in_use(jnp.asarray(s), 32, 0.25, 8)) for s in (0, 4, 8, 100)]
  assert rows == [8, 20, 32, 32]
  batch = {"masked_lm_weights": jnp.ones((4, 3)), "input_ids": jnp.ones((4, 5), jnp.int32)}
  thin = batch_warmup.thin(batch, jnp.asarray(3))
  np.testing.assert_array_equal(np.asarray(thin["masked_lm_weights"]).sum(1), [3, 3, 3, 0])
  assert thin["input_ids"] is batch["input_ids"]


def test_clip_by_global_norm_is_optax_as_one_scalar_factor():
  grads = {"a": jnp.asarray([3.0, -4.0]), "b": {"kernel": jnp.asarray([[12.0]])}}  # global norm 13
  for max_norm in (1.0, 13.0, 20.0):  # clipped, at the edge, not clipped
    ours, _ = optim.clip_by_global_norm(max_norm).update(grads, None)
    theirs, _ = optax.clip_by_global_norm(max_norm).update(grads, optax.EmptyState())
    for x, y, g in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), jax.tree.leaves(grads)):
      np.testing.assert_allclose(x, y, rtol=1e-6)
      np.testing.assert_allclose(x, np.asarray(g) * min(1.0, max_norm / 13.0), rtol=1e-6)
      if max_norm >= 13.0:
        np.testing.assert_array_equal(x, g)  # unclipped: the very same values
  nan, _ = optim.clip_by_global_norm(1.0).update({"a": jnp.asarray([1.0, jnp.nan])}, None)
  assert np.isnan(np.asarray(nan["a"])).all()  # as optax: a non-finite norm poisons every update


def test_optimizers_by_name_and_an_unknown_one_in_one_line():
  assert optim.OPTIMIZERS == ("lamb", "adamw", "stable_adamw", "adafactor")
  cfg = ml_collections.ConfigDict(dict(name="adamw", learning_rate=0.1, warmup_steps=0, warmup_ratio=0.0,
                                       decay="constant", b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0, clip_norm=0.0))
  params = {"w": jnp.array([1.0, -2.0])}
  tx, _ = optim.make_optimizer(cfg, 10)
  updates, _ = tx.update({"w": jnp.array([0.5, 0.5])}, tx.init(params), params)
  np.testing.assert_allclose(updates["w"], [-0.1, -0.1], rtol=1e-5)  # Adam's first step: -lr * sign(g)
  cfg.name = "sgd"
  with pytest.raises(UserError, match=r"optimizer.name='sgd' is not one of \('lamb', 'adamw', 'stable_adamw'"):
    optim.make_optimizer(cfg, 10)
