"""The token loss: negative log-likelihood, accuracy and gradient against a float64 NumPy reference."""
import re

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from bert_jax.training.objectives import token_nll_and_correct


def _reference(logits, labels):
  z = logits.astype(np.float64)
  lse = np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1)) + z.max(-1)
  label_logit = np.take_along_axis(z, labels[..., None], -1)[..., 0]
  softmax = np.exp(z - lse[..., None])
  return lse - label_logit, (label_logit >= z.max(-1)).astype(np.float32), softmax


def _case(seed=0, shape=(3, 5, 37)):
  rng = np.random.default_rng(seed)
  logits = (rng.normal(size=shape) * 4).astype(np.float32)
  labels = rng.integers(0, shape[-1], size=shape[:-1]).astype(np.int32)
  # Make some labels the row maximum (one of them tied with another entry) so accuracy is mixed.
  logits[0, 0, labels[0, 0]] = logits[0, 0].max() + 1.0
  logits[0, 1, labels[0, 1]] = logits[0, 1].max()
  logits[1, 2, labels[1, 2]] = logits[1, 2].max() + 0.5
  return logits, labels


def test_nll_accuracy_and_gradient_match_numpy():
  logits, labels = _case()
  nll, correct = token_nll_and_correct(jnp.asarray(logits), jnp.asarray(labels))
  ref_nll, ref_correct, softmax = _reference(logits, labels)
  np.testing.assert_allclose(nll, ref_nll, rtol=1e-6, atol=1e-6)
  np.testing.assert_array_equal(correct, ref_correct)
  assert correct[0, 0] == correct[0, 1] == correct[1, 2] == 1.0 and 0 < correct.mean() < 0.5
  weights = np.random.default_rng(1).uniform(size=labels.shape).astype(np.float32)
  grad = jax.grad(lambda z: jnp.sum(token_nll_and_correct(z, jnp.asarray(labels))[0] * weights))(
      jnp.asarray(logits))
  one_hot = np.eye(logits.shape[-1])[labels]
  np.testing.assert_allclose(grad, (softmax - one_hot) * weights[..., None], atol=1e-6)


def test_large_logits_lose_no_precision():
  """log(3) survives next to logits of 1e4 (float32 spacing there is ~1e-3): no cancellation."""
  logits = np.array([[1e4, -1e4, 0.0], [-1e4, -1e4, -1e4]], np.float32)
  nll, correct = token_nll_and_correct(jnp.asarray(logits), jnp.array([1, 2]))
  np.testing.assert_allclose(nll, [2e4, np.log(3.0)], rtol=1e-6)
  np.testing.assert_array_equal(correct, [0.0, 1.0])


def test_labels_outside_the_vocab_stay_finite_for_weight_zero_slots():
  """Padding slots may carry a label outside [0, V); at weight 0 they add nothing and no NaN."""
  logits, labels = _case(3, (2, 4, 11))
  labels[0, 1], labels[1, 3] = -1, 11
  weights = np.ones(labels.shape, np.float32)
  weights[0, 1] = weights[1, 3] = 0.0
  loss, grad = jax.value_and_grad(lambda z: jnp.sum(token_nll_and_correct(z, jnp.asarray(labels))[0] * weights))(
      jnp.asarray(logits))
  keep = weights > 0
  ref_nll, _, softmax = _reference(logits[keep], labels[keep])
  np.testing.assert_allclose(loss, ref_nll.sum(), rtol=1e-6)
  np.testing.assert_allclose(grad[keep], softmax - np.eye(11)[labels[keep]], atol=1e-6)
  np.testing.assert_array_equal(grad[~keep], 0.0)


def test_vocab_sharded_over_the_mesh_gathers_locally():
  """Logits split along the vocab: same numbers, and no all-gather of the logits (only [rows] reduced)."""
  logits, labels = _case(2, (8, 4, 64))
  mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "tensor"))
  sharded = jax.device_put(logits, NamedSharding(mesh, P("data", None, "tensor")))
  fn = jax.jit(lambda z, y: jax.value_and_grad(lambda z: token_nll_and_correct(z, y)[0].sum())(z),
               out_shardings=(None, NamedSharding(mesh, P("data", None, "tensor"))))
  (total, grad) = fn(sharded, jnp.asarray(labels))
  ref_nll, _, softmax = _reference(logits, labels)
  np.testing.assert_allclose(total, ref_nll.sum(), rtol=1e-5)
  np.testing.assert_allclose(grad, softmax - np.eye(64)[labels], atol=1e-6)
  hlo = fn.lower(sharded, jnp.asarray(labels)).compile().as_text()
  gathered = [s for s in re.findall(r"= f32\[([\d,]*)\]\S* all-gather", hlo)]
  assert not any(s.endswith(",64") or s.endswith(",16") for s in gathered), gathered
