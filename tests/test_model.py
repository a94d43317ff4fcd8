"""The encoder: padding invariance, the masked-position MLM head, scan vs unrolled, hidden states."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import flax.linen as nn
from bert_jax.models import BertModel, ModelConfig
from core_helpers import slow

CFG = ModelConfig(vocab_size=97, hidden_size=32, num_layers=3, num_heads=4, intermediate_size=64,
                  max_position_embeddings=40, hidden_dropout=0.0, attention_dropout=0.0)


def _init(cfg, ids):
  """The parameters (from key 0) for `cfg` at ids' shape, compiled once per config and shape in the module."""
  return _init_at(cfg, np.shape(ids))


@functools.lru_cache(maxsize=None)
def _init_at(cfg, shape):
  return nn.meta.unbox(jax.jit(BertModel(cfg).init)(jax.random.key(0), jnp.zeros(shape, jnp.int32))["params"])


def _apply(cfg):
  """BertModel(cfg).apply compiled (run eagerly, each op of the encoder compiles on its own)."""
  return jax.jit(BertModel(cfg).apply, static_argnames=("deterministic",))


def _inputs(seed=0, batch=3, seq=10):
  rng = np.random.RandomState(seed)
  ids = rng.randint(5, CFG.vocab_size, (batch, seq)).astype(np.int32)
  types = (np.arange(seq)[None] >= seq // 2).astype(np.int32).repeat(batch, 0)
  return ids, types


@pytest.mark.parametrize("cfg", [CFG, CFG.replace(scan_layers=False), CFG.replace(position_style="roberta",
                                                                                    pad_token_id=1)])
def test_real_token_outputs_unchanged_by_extra_padding(cfg):
  ids, types = _inputs()
  params = _init(cfg, ids)
  apply = _apply(cfg)
  short = apply({"params": params}, ids, jnp.ones_like(ids), types)
  pad = cfg.pad_token_id
  padded_ids = np.concatenate([ids, np.full((3, 7), pad, np.int32)], 1)
  padded_mask = np.concatenate([np.ones_like(ids), np.zeros((3, 7), np.int32)], 1)
  padded_types = np.concatenate([types, np.zeros((3, 7), np.int32)], 1)
  long = apply({"params": params}, padded_ids, padded_mask, padded_types)
  np.testing.assert_allclose(long.last_hidden_state[:, :10], short.last_hidden_state, atol=1e-5)
  np.testing.assert_allclose(long.pooled_output, short.pooled_output, atol=1e-5)
  np.testing.assert_allclose(long.nsp_logits, short.nsp_logits, atol=1e-5)


def test_masked_position_head_equals_full_logits_then_gather():
  ids, types = _inputs(seed=1)
  params = _init(CFG, ids)
  model = BertModel(CFG)
  positions = np.array([[1, 4, 9], [0, 0, 2], [7, 3, 5]], np.int32)
  full = model.apply({"params": params}, ids, None, types).mlm_logits
  at = model.apply({"params": params}, ids, None, types, masked_positions=positions).mlm_logits
  assert full.shape == (3, 10, CFG.vocab_size) and at.shape == (3, 3, CFG.vocab_size)
  np.testing.assert_allclose(at, np.take_along_axis(np.asarray(full), positions[..., None], 1), atol=1e-5)


@pytest.mark.parametrize("cfg,packed", [(CFG, True),  # the other two weekly (~10 s each quiet)
                                        pytest.param(CFG.replace(scan_layers=False, remat="dots"), False, marks=slow),
                                        pytest.param(CFG.replace(share_layers="all", attention_dropout=1e-9), False,
                                                     marks=slow)])
def test_heads_only_last_layer_gives_the_full_models_heads_and_gradients(cfg, packed):
  """heads_only runs the last layer at [CLS] and the masked positions only: the same MLM and NSP logits
  and parameter gradients as the full model (the reference), scanned (stacked parameters sliced) or
  unrolled, over packed documents or padding, and through the dropout path at a vanishing rate."""
  ids, types = _inputs(seed=2, seq=12)
  params = _init(cfg, ids)
  mask = np.ones_like(ids)
  mask[1, 8:] = 0
  docs = np.array([[1] * 6 + [2] * 6, [1] * 8 + [0] * 4, [1] * 3 + [2] * 9], np.int32) if packed else None
  positions = np.array([[1, 7, 0], [2, 5, 0], [3, 11, 4]], np.int32)
  model = BertModel(cfg)

  def loss(params, heads_only):
    out = model.apply({"params": params}, ids, mask, types, document_ids=docs, masked_positions=positions,
                      heads_only=heads_only, deterministic=not heads_only, rngs={"dropout": jax.random.key(1)})
    return jnp.sum(jnp.sin(out.mlm_logits)) + jnp.sum(out.nsp_logits ** 2), out

  grad = jax.jit(jax.grad(loss, has_aux=True), static_argnums=1)
  (full_grads, full), (grads, out) = grad(params, False), grad(params, True)
  assert out.last_hidden_state is None and out.mlm_logits.shape == (3, 3, cfg.vocab_size)
  np.testing.assert_allclose(out.mlm_logits, full.mlm_logits, atol=2e-5)
  np.testing.assert_allclose(out.nsp_logits, full.nsp_logits, atol=2e-5)
  scale = max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(full_grads))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-4 * scale), grads, full_grads)


def test_tied_output_layer_uses_word_embeddings():
  ids, types = _inputs()
  params = _init(CFG, ids)
  out = BertModel(CFG).apply({"params": params}, ids, None, types, output_hidden_states=True)
  # Recompute the MLM head by hand from the last hidden state: dense, erf-GELU, LayerNorm, E^T + bias.
  head = params["mlm_head"]
  h = out.last_hidden_state @ head["transform"]["kernel"] + head["transform"]["bias"]
  h = 0.5 * h * (1 + jax.scipy.special.erf(h / np.sqrt(2)))
  mean, var = h.mean(-1, keepdims=True), h.var(-1, keepdims=True)
  h = (h - mean) / np.sqrt(var + CFG.layer_norm_eps) * head["layer_norm"]["scale"] + head["layer_norm"]["bias"]
  logits = h @ params["embeddings"]["word_embeddings"]["embedding"].T + head["output_bias"]
  np.testing.assert_allclose(out.mlm_logits, logits, atol=1e-4)
  assert out.hidden_states.shape == (CFG.num_layers + 1, 3, 10, CFG.hidden_size)
  np.testing.assert_allclose(out.hidden_states[-1], out.last_hidden_state, atol=1e-6)


def test_scanned_and_unrolled_layers_compute_the_same_function():
  ids, types = _inputs()
  scanned = _init(CFG, ids)
  unrolled = dict(scanned)
  layers = scanned["encoder"]["layers"]
  unrolled["encoder"] = {f"layer_{i}": jax.tree.map(lambda x: x[i], layers) for i in range(CFG.num_layers)}
  a = BertModel(CFG).apply({"params": scanned}, ids, None, types)
  b = BertModel(CFG.replace(scan_layers=False)).apply({"params": unrolled}, ids, None, types)
  np.testing.assert_allclose(a.last_hidden_state, b.last_hidden_state, atol=1e-5)


@pytest.mark.parametrize("unroll", [pytest.param(2, marks=slow), pytest.param(3, marks=slow), 8])  # 8: full unroll
def test_unrolling_the_scan_changes_nothing_but_speed(unroll):
  """Same parameters, same dropout masks, same values and gradients for any scan_unroll."""
  ids, types = _inputs()
  cfg = CFG.replace(hidden_dropout=0.1, attention_dropout=0.1)
  params = _init(cfg, ids)

  def loss(params, cfg):
    out = BertModel(cfg).apply({"params": params}, ids, None, types, deterministic=False,
                               rngs={"dropout": jax.random.key(7)})
    return jnp.sum(out.mlm_logits ** 2) * 1e-3

  value_and_grad = jax.jit(jax.value_and_grad(loss), static_argnums=1)
  a, grad_a = value_and_grad(params, cfg)
  b, grad_b = value_and_grad(params, cfg.replace(scan_unroll=unroll))
  np.testing.assert_allclose(a, b, rtol=1e-6)
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6), grad_a, grad_b)


def test_small_presets_unroll_their_scans():
  from bert_jax.config_utils import load_config
  assert load_config("configs/bert.py:mini").model.scan_unroll == 4
  assert load_config("configs/bert.py:medium").model.scan_unroll == 8
  assert load_config("configs/bert.py:base").model.scan_unroll == 1


def test_remat_and_bf16_compute_keep_fp32_params_and_logits():
  ids, types = _inputs()
  cfg = CFG.replace(dtype="bfloat16", remat="dots")
  params = _init(cfg, ids)
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(params))
  out = BertModel(cfg).apply({"params": params}, ids, None, types)
  ref = BertModel(CFG).apply({"params": params}, ids, None, types)
  assert out.last_hidden_state.dtype == jnp.bfloat16 and out.mlm_logits.dtype == jnp.float32
  np.testing.assert_allclose(out.mlm_logits, ref.mlm_logits, atol=0.15)


def test_attention_dropout_path_is_the_deterministic_path_when_rate_is_zero():
  ids, types = _inputs()
  params = _init(CFG, ids)
  model = BertModel(CFG.replace(attention_dropout=1e-9))
  train = model.apply({"params": params}, ids, None, types, deterministic=False,
                      rngs={"dropout": jax.random.key(3)})
  infer = model.apply({"params": params}, ids, None, types)
  np.testing.assert_allclose(train.last_hidden_state, infer.last_hidden_state, atol=1e-4)


def test_packed_documents_do_not_attend_to_each_other():
  ids, types = _inputs(batch=1, seq=12)
  params = _init(CFG, ids)
  apply = _apply(CFG)
  docs = np.array([[1] * 5 + [2] * 4 + [0] * 3], np.int32)
  positions = np.array([[0, 1, 2, 3, 4, 0, 1, 2, 3, 0, 0, 0]], np.int32)
  packed = apply({"params": params}, ids, None, types, position_ids=positions, document_ids=docs)
  alone = apply({"params": params}, ids[:, 5:9], None, types[:, 5:9])
  np.testing.assert_allclose(packed.last_hidden_state[:, 5:9], alone.last_hidden_state, atol=1e-5)


def test_bad_shapes_are_reported():
  with pytest.raises(ValueError, match="max_position_embeddings"):
    BertModel(CFG).init(jax.random.key(0), jnp.zeros((1, 41), jnp.int32))
