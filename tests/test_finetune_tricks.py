"""Each fine-tuning trick against a hand computation: BERTAdam vs bias-corrected Adam, head learning
rate, layer-wise decay (scanned and unrolled layers), warmup ratio, re-init of top layers, head
dropping for two-stage fine-tuning, and the layer-mix head."""
import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from bert_jax.errors import UserError
from bert_jax.finetune import heads, init, optim
from bert_jax.models import bert
from bert_jax.models.config import ModelConfig
from bert_jax.training.optim import learning_rate_schedule

TINY = dict(vocab_size=40, hidden_size=8, num_layers=2, num_heads=2, intermediate_size=16,
            max_position_embeddings=16)


def _opt_cfg(**kw):
  values = dict(learning_rate=0.1, head_learning_rate=0.0, layer_decay=1.0, bias_correction=True,
                warmup_steps=0, warmup_ratio=0.0, decay="linear", decay_power=1.0, end_learning_rate=0.0,
                b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.0, clip_norm=0.0)
  values.update(kw)
  return ml_collections.ConfigDict(values)


@functools.cache
def _cached_init(kind, pooling, scan_layers):
  cfg = heads.encoder_config(ModelConfig(**TINY, scan_layers=scan_layers), kind, pooling)
  model = heads.FinetuneModel(cfg, kind, 3, pooling, 0.0)
  x = jnp.arange(12, dtype=jnp.int32).reshape(2, 6) % 40
  params = jax.jit(model.init)(jax.random.key(0), x, jnp.ones_like(x), jnp.zeros_like(x))["params"]
  return cfg, model, jax.tree.map(np.asarray, bert.nn.meta.unbox(params)), x


def _init(kind="classification", pooling="pooled", scan_layers=True):
  """A tiny model and fresh (mutable) copies of its parameters."""
  cfg, model, params, x = _cached_init(kind, pooling, scan_layers)
  return cfg, model, jax.tree.map(np.copy, params), x


def _apply_steps(tx, params, grads_list):
  state = tx.init(params)
  for grads in grads_list:
    updates, state = tx.update(grads, state, params)
    params = optax.apply_updates(params, updates)
  return params


def test_bert_adam_matches_hand_computed_steps():
  params = {"head": {"kernel": jnp.array([1.0, -2.0]), "bias": jnp.array([0.5])}}
  g1 = {"head": {"kernel": jnp.array([0.5, -1.0]), "bias": jnp.array([2.0])}}
  g2 = {"head": {"kernel": jnp.array([-0.25, 1.0]), "bias": jnp.array([2.0])}}
  cfg = _opt_cfg(bias_correction=False, weight_decay=0.1)
  tx, _ = optim.make_optimizer(cfg, 10, params, ModelConfig(**TINY))
  got = _apply_steps(tx, params, [g1, g2])

  def hand(w, grads, decay):
    m = v = 0.0
    for step, g in enumerate(grads):
      m, v = 0.9 * m + 0.1 * g, 0.999 * v + 0.001 * g * g
      learning_rate = 0.1 * (1 - step / 10)  # no warmup, linear decay over 10 steps
      w = w - learning_rate * (m / (np.sqrt(v) + 1e-6) + decay * w)
    return w

  # kernels decay (0.1 * w), biases do not
  assert np.allclose(got["head"]["kernel"], [hand(1.0, [0.5, -0.25], 0.1), hand(-2.0, [-1.0, 1.0], 0.1)])
  assert np.allclose(got["head"]["bias"], [hand(0.5, [2.0, 2.0], 0.0)])
  # first step without bias correction: 0.1 g / (sqrt(0.001) |g|) ~ 3.16, not Adam's 1
  first = _apply_steps(optim.scale_by_bert_adam(), {"w": jnp.zeros(1)}, [{"w": jnp.ones(1)}])
  assert float(first["w"][0]) == pytest.approx(0.1 / (np.sqrt(0.001) + 1e-6), rel=1e-5)


def test_bias_corrected_adam_first_step_is_lr_times_sign():
  params = {"head": {"kernel": jnp.array([1.0, -2.0])}}
  tx, _ = optim.make_optimizer(_opt_cfg(), 10, params, ModelConfig(**TINY))
  got = _apply_steps(tx, params, [{"head": {"kernel": jnp.array([0.5, -1.0])}}])
  assert np.allclose(got["head"]["kernel"], [1.0 - 0.1, -2.0 + 0.1], atol=1e-5)


@pytest.mark.parametrize("scan", [True, False])
def test_layer_decay_and_head_rate_multipliers(scan):
  cfg, _, params, _ = _init(scan_layers=scan)
  mult = optim.lr_multipliers(params, cfg, layer_decay=0.5, head_multiplier=10.0)
  # L = 2: embeddings 0.5^3, layer 0 0.5^2, layer 1 0.5, pooler 1, head 10
  assert float(mult["embeddings"]["word_embeddings"]["embedding"]) == 0.125
  assert float(mult["pooler"]["kernel"]) == 1.0 and float(mult["head"]["classifier"]["kernel"]) == 10.0
  if scan:
    kernel = mult["encoder"]["layers"]["attention"]["query"]["kernel"]
    assert kernel.shape == (2, 1, 1, 1) and kernel.ravel().tolist() == [0.25, 0.5]
  else:
    assert float(mult["encoder"]["layer_0"]["attention"]["query"]["kernel"]) == 0.25
    assert float(mult["encoder"]["layer_1"]["attention"]["query"]["kernel"]) == 0.5


def test_multipliers_scale_updates_per_layer_slice():
  cfg, _, params, _ = _init(scan_layers=True)
  tx, _ = optim.make_optimizer(_opt_cfg(learning_rate=1.0, head_learning_rate=2.0, layer_decay=0.5), 10,
                               params, cfg)
  grads = jax.tree.map(np.ones_like, params)
  updates, _ = jax.jit(tx.update)(grads, tx.init(params), params)
  # Adam's first step is -lr * sign(g); times 0.5^(3 - depth), head times 2 (= 2.0 / 1.0)
  query = updates["encoder"]["layers"]["attention"]["query"]["kernel"]
  assert np.allclose(query[0], -0.25, atol=1e-4) and np.allclose(query[1], -0.5, atol=1e-4)
  assert np.allclose(updates["head"]["classifier"]["bias"], -2.0, atol=1e-4)


def test_warmup_ratio_then_linear_decay_and_warmup_steps_win():
  """optimizer.warmup_ratio of the run's steps; warmup_steps > 0 wins over it (config_schema's one rule)."""
  schedule = learning_rate_schedule(_opt_cfg(learning_rate=1.0, warmup_ratio=0.1), 100)
  assert [float(schedule(s)) for s in (0, 5, 10, 55, 100)] == pytest.approx([0.0, 0.5, 1.0, 0.5, 0.0])
  schedule = learning_rate_schedule(_opt_cfg(learning_rate=1.0, warmup_ratio=0.1, warmup_steps=20), 100)
  assert [float(schedule(s)) for s in (0, 10, 20, 60, 100)] == pytest.approx([0.0, 0.5, 1.0, 0.5, 0.0])


@pytest.mark.parametrize("scan", [True, False])
def test_reinit_top_layers_and_pooler(scan):
  cfg, _, fresh, _ = _init(scan_layers=scan)
  loaded = jax.tree.map(lambda x: x + 1.0, fresh)
  out = init.reinit_top_layers(loaded, fresh, cfg, 1)
  if scan:
    kernel, was, new = (t["encoder"]["layers"]["feed_forward"]["output"]["kernel"] for t in (out, loaded, fresh))
    assert np.array_equal(kernel[0], was[0]) and np.array_equal(kernel[1], new[1])
  else:
    assert out["encoder"]["layer_0"] is loaded["encoder"]["layer_0"]
    assert out["encoder"]["layer_1"] is fresh["encoder"]["layer_1"]
  assert out["pooler"] is fresh["pooler"] and out["embeddings"] is loaded["embeddings"]
  with pytest.raises(UserError, match="reinit_layers"):
    init.reinit_top_layers(loaded, fresh, cfg, 3)


def test_merge_keeps_encoder_and_drops_other_task_head():
  _, _, fresh, _ = _init()
  saved = jax.tree.map(lambda x: x + 1.0, fresh)
  saved["mlm_head"] = {"output_bias": np.zeros(40)}
  other = init.merge(fresh, saved, {"task": {"name": "mnli"}}, "rte")
  assert other["encoder"] is saved["encoder"] and other["head"] is fresh["head"] and "mlm_head" not in other
  same = init.merge(fresh, saved, {"task": {"name": "rte"}}, "rte")
  assert same["head"] is saved["head"]
  saved["head"] = {"classifier": {"kernel": np.zeros((8, 2)), "bias": np.zeros(2)}}  # 2 labels, not 3
  assert init.merge(fresh, saved, {"task": {"name": "rte"}}, "rte")["head"] is fresh["head"]
  saved["embeddings"]["word_embeddings"]["embedding"] = np.zeros((41, 8))
  with pytest.raises(UserError, match="does not fit"):
    init.merge(fresh, saved, None, "rte")


def test_layer_mix_head_is_softmax_weighted_cls_vectors():
  cfg, model, params, x = _init(pooling="layer_mix")
  params["head"]["layer_mix"]["layer_weights"] = np.array([0.5, -1.0, 2.0], np.float32)
  params["head"]["layer_mix"]["gamma"] = np.float32(1.5)
  logits = jax.jit(model.apply)({"params": params}, x, jnp.ones_like(x), jnp.zeros_like(x))["logits"]
  encoder_params = {k: v for k, v in params.items() if k != "head"}
  hidden = jax.jit(lambda p: bert.BertModel(cfg).apply({"params": p}, x, output_hidden_states=True)
                   .hidden_states)(encoder_params)
  weights = np.exp([0.5, -1.0, 2.0]) / np.exp([0.5, -1.0, 2.0]).sum()
  mixed = 1.5 * np.einsum("l,lbh->bh", weights, np.asarray(hidden[:, :, 0]))
  classifier = params["head"]["classifier"]
  assert np.allclose(logits, mixed @ classifier["kernel"] + classifier["bias"], atol=1e-5)


def test_span_head_masks_padding():
  _, model, params, x = _init(kind="span")
  mask = jnp.array([[1, 1, 1, 0, 0, 0], [1] * 6])
  out = jax.jit(model.apply)({"params": params}, x, mask, jnp.zeros_like(x))
  assert out["start_logits"].shape == (2, 6) and bool(jnp.all(out["end_logits"][0, 3:] < -1e8))
