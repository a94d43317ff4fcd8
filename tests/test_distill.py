"""Distillation: KD losses against NumPy, DistilBERT's layer init, bad input, and distillation end to end."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import cli
from bert_jax.compress import distill, losses
from bert_jax.models.config import ModelConfig

RNG = np.random.default_rng(0)


def _log_softmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_soft_target_loss_is_t_squared_kl():
  s, t, temperature = RNG.normal(size=(3, 4)), RNG.normal(size=(3, 4)) * 3, 2.5
  p, log_q = np.exp(_log_softmax(t / temperature)), _log_softmax(s / temperature)
  expected = temperature ** 2 * np.sum(p * (np.log(p) - log_q))
  np.testing.assert_allclose(losses.soft_target_sum(jnp.asarray(s), jnp.asarray(t), temperature), expected,
                             rtol=1e-5)
  assert float(losses.soft_target_sum(jnp.asarray(t), jnp.asarray(t), temperature)) == pytest.approx(0, abs=1e-5)


def test_hidden_and_attention_mse_average_over_valid_tokens_only():
  mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0]])
  hs, ht = RNG.normal(size=(2, 2, 4, 3)), RNG.normal(size=(2, 2, 4, 3))
  expected = sum(np.mean((hs[l, b, :n] - ht[l, b, :n]) ** 2) for l in range(2) for b, n in enumerate((3, 2)))
  np.testing.assert_allclose(losses.hidden_mse_sum(jnp.asarray(hs), jnp.asarray(ht), jnp.asarray(mask)),
                             expected, rtol=1e-5)
  a_s, a_t = RNG.random(size=(2, 2, 3, 4, 4)), RNG.random(size=(2, 2, 3, 4, 4))
  expected = sum(np.mean((a_s[l, b, :, :n] - a_t[l, b, :, :n]) ** 2) for l in range(2)
                 for b, n in enumerate((3, 2)))
  np.testing.assert_allclose(losses.attention_mse_sum(jnp.asarray(a_s), jnp.asarray(a_t), jnp.asarray(mask)),
                             expected, rtol=1e-5)


def test_pkd_loss_compares_unit_vectors():
  cs, ct = RNG.normal(size=(2, 3, 5)), RNG.normal(size=(2, 3, 5))
  unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
  np.testing.assert_allclose(losses.pkd_sum(jnp.asarray(cs), jnp.asarray(ct)),
                             np.sum((unit(cs) - unit(ct)) ** 2), rtol=1e-5)
  assert float(losses.pkd_sum(jnp.asarray(cs), jnp.asarray(cs * 7.0))) == pytest.approx(0, abs=1e-6)


def test_layer_maps():
  assert distill.chosen_layers("every_other", 6) == (0, 2, 4)
  assert distill.layer_map(3, 6, (0, 2, 4)) == (1, 3, 5)
  assert distill.layer_map(2, 6, None) == (3, 6)  # TinyBERT's uniform map, top to top


@pytest.mark.parametrize("scan", [True, False])
def test_student_layers_equal_the_teachers_chosen_layers(scan):
  from bert_jax.finetune import heads  # pylint: disable=import-outside-toplevel
  cfg = ModelConfig(vocab_size=50, hidden_size=16, num_layers=5, num_heads=2, intermediate_size=32,
                    max_position_embeddings=16, scan_layers=scan)
  ids = jnp.ones((1, 8), jnp.int32)
  teacher = heads.FinetuneModel(heads.encoder_config(cfg, "classification", "pooled"), "classification", 2)
  params = teacher.init(jax.random.key(1), ids, ids, ids * 0)["params"]
  chosen = (0, 2, 4)
  student_params = distill.take_layers(params, cfg, chosen)
  student = heads.FinetuneModel(heads.encoder_config(cfg.replace(num_layers=3), "classification", "pooled"),
                                "classification", 2)
  abstract = jax.eval_shape(lambda: student.init(jax.random.key(0), ids, ids, ids * 0)["params"])
  assert jax.tree.structure(abstract) == jax.tree.structure(student_params)
  for j, i in enumerate(chosen):
    if scan:
      got = jax.tree.map(lambda x: x[j], student_params["encoder"]["layers"])  # noqa: B023
      want = jax.tree.map(lambda x: x[i], params["encoder"]["layers"])  # noqa: B023
    else:
      got, want = student_params["encoder"][f"layer_{j}"], params["encoder"][f"layer_{i}"]
    jax.tree.map(np.testing.assert_array_equal, got, want)
  np.testing.assert_array_equal(student_params["head"]["classifier"]["kernel"],
                                params["head"]["classifier"]["kernel"])
