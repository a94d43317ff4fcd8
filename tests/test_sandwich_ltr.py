"""Sandwich transformers (Press et al. 2020): `model.sublayer_order`; the default order is today's model."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import flax.linen as nn
from bert_jax.errors import UserError
from bert_jax.models import BertModel, ModelConfig, attention
from bert_jax.models.bert import Encoder, SandwichSublayers

CFG = ModelConfig(vocab_size=97, hidden_size=32, num_layers=3, num_heads=4, intermediate_size=64,
                  max_position_embeddings=40, hidden_dropout=0.0, attention_dropout=0.0, scan_layers=False)


def _hidden(seed=0, batch=3, seq=10):
  x = jax.random.normal(jax.random.key(seed), (batch, seq, CFG.hidden_size))
  mask = (np.arange(seq)[None] < np.array([[seq], [seq - 3], [4]])[:batch]).astype(np.int32)
  return x, attention.Segments.of(jnp.asarray(mask), None)


def test_the_default_order_is_todays_model():
  assert ModelConfig(sublayer_order="sf" * 3, num_layers=3) == ModelConfig(num_layers=3)
  x, segments = _hidden()
  encoder = Encoder(CFG)
  params = nn.meta.unbox(encoder.init(jax.random.key(1), x, segments, None, True)["params"])
  expected, _, _ = encoder.apply({"params": params}, x, segments, None, True)
  sandwich_params = {}
  for i in range(CFG.num_layers):
    layer = params[f"layer_{i}"]
    sandwich_params.update({f"sublayer_{2 * i}_attention": layer["attention"],
                            f"sublayer_{2 * i}_layer_norm": layer["attention_layer_norm"],
                            f"sublayer_{2 * i + 1}_feed_forward": layer["feed_forward"],
                            f"sublayer_{2 * i + 1}_layer_norm": layer["output_layer_norm"]})
  sandwich = SandwichSublayers(CFG, "sf" * CFG.num_layers)
  assert jax.tree.structure(sandwich_params) == jax.tree.structure(
      nn.meta.unbox(sandwich.init(jax.random.key(1), x, segments, True)["params"]))
  got = sandwich.apply({"params": sandwich_params}, x, segments, True)
  assert np.array_equal(np.asarray(got), np.asarray(expected))  # bit for bit


def test_a_reordered_model_has_the_same_parameters_and_another_function():
  ids = np.random.RandomState(0).randint(5, 97, (2, 8)).astype(np.int32)
  default = nn.meta.unbox(BertModel(CFG).init(jax.random.key(0), ids)["params"])
  cfg = CFG.replace(sublayer_order="ssfsff", initializer_range=0.5)  # sublayers that move x, not ~0.02 of it
  model = BertModel(cfg)
  params = nn.meta.unbox(model.init(jax.random.key(0), ids)["params"])
  count = lambda p: sum(x.size for x in jax.tree.leaves(p))  # noqa: E731
  assert count(params) == count(default)
  names = sorted(params["encoder"]["sandwich"])
  assert [n for n in names if n.endswith("attention")] == ["sublayer_0_attention", "sublayer_1_attention",
                                                            "sublayer_3_attention"]
  out = model.apply({"params": params}, ids)
  # the same sublayers in the interleaved order compute something else
  sandwich = params["encoder"]["sandwich"]
  assert np.isfinite(out.last_hidden_state).all()
  other = SandwichSublayers(cfg, "sfsfsf")
  renamed = {"sublayer_0_attention": sandwich["sublayer_0_attention"],
             "sublayer_2_attention": sandwich["sublayer_1_attention"],
             "sublayer_4_attention": sandwich["sublayer_3_attention"],
             "sublayer_1_feed_forward": sandwich["sublayer_2_feed_forward"],
             "sublayer_3_feed_forward": sandwich["sublayer_4_feed_forward"],
             "sublayer_5_feed_forward": sandwich["sublayer_5_feed_forward"],
             **{f"sublayer_{i}_layer_norm": sandwich[f"sublayer_{i}_layer_norm"] for i in range(6)}}
  x, segments = _hidden(batch=2, seq=8)
  a = SandwichSublayers(cfg, "ssfsff").apply({"params": sandwich}, x, segments, True)
  b = other.apply({"params": renamed}, x, segments, True)
  assert not np.allclose(a, b, atol=1e-3)


def test_bad_orders_are_one_line():
  with pytest.raises(UserError, match="only 's'"):
    ModelConfig(sublayer_order="sfx", scan_layers=False)
  with pytest.raises(UserError, match="scan_layers=False"):
    ModelConfig(sublayer_order="ssff")
