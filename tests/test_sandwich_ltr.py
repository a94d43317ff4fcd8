"""Sandwich transformers (Press et al. 2020): `model.sublayer_order`; the default order is today's model."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import flax.linen as nn
from bert_jax.errors import UserError
from bert_jax.models import BertModel, ModelConfig, attention
from bert_jax.models.bert import Encoder, SandwichSublayers
from core_helpers import slow

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


@slow  # weekly suite (BERT_JAX_SLOW_TESTS=1): the suite's 15 minutes; the family's HF-equality test stays
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


# BERT's "LTR & No NSP" ablation: objective="ltr" on a causal encoder.
LTR_CFG = CFG.replace(causal=True, sentence_head="none", scan_layers=True)


def _ltr_batch():
  """Two rows; row 0 had token 11 at position 2 masked, row 1 is shorter (padding from position 4)."""
  cls, sep, mask = 2, 3, 4
  return {"input_ids": np.array([[cls, 10, mask, 12, sep, 0], [cls, 20, 21, sep, 0, 0]], np.int32),
          "input_mask": np.array([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0]], np.int32),
          "segment_ids": np.zeros((2, 6), np.int32),
          "masked_lm_positions": np.array([[2, 0], [1, 0]], np.int32),
          "masked_lm_ids": np.array([[11, 0], [20, 0]], np.int32),
          "masked_lm_weights": np.array([[1, 0], [1, 0]], np.float32),
          "next_sentence_labels": np.zeros(2, np.int32)}


def test_ltr_targets_of_a_hand_built_batch():
  from bert_jax.training.objectives import ltr
  targets, weights = ltr.next_token_targets(_ltr_batch())
  assert np.asarray(targets).tolist() == [[10, 11, 12, 3, 0], [20, 21, 3, 0, 0]]
  assert np.asarray(weights).tolist() == [[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]]


def test_ltr_loss_against_numpy_and_causality():
  from bert_jax.training.objectives import ltr
  objective = ltr.LeftToRight(LTR_CFG)
  batch = _ltr_batch()
  params = nn.meta.unbox(objective.init(jax.random.key(0), batch))
  sums, counts = objective.sums(params, batch, None, True), objective.counts(batch)
  ids = np.asarray(ltr.original_ids(batch))
  logits = np.asarray(objective.model.apply({"params": params}, ids, batch["input_mask"], batch["segment_ids"]
                                            ).mlm_logits, np.float64)
  log_probs = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
      - logits.max(-1, keepdims=True)
  expected = [-log_probs[r, t, ids[r, t + 1]] for r in range(2) for t in range(5) if batch["input_mask"][r, t + 1]]
  assert float(counts["lm"]) == len(expected) == 7
  np.testing.assert_allclose(float(objective.loss(sums, counts)), np.mean(expected), rtol=1e-5)
  # position t sees tokens 0..t only: a new last token changes nothing before it
  changed = ids.copy()
  changed[0, 4] = 50
  again = np.asarray(objective.model.apply({"params": params}, changed, batch["input_mask"], batch["segment_ids"]
                                           ).mlm_logits)
  np.testing.assert_allclose(again[0, :4], logits[0, :4], atol=1e-5)
  assert not np.allclose(again[0, 4], logits[0, 4], atol=1e-3)
  bidirectional = BertModel(LTR_CFG.replace(causal=False))
  a = bidirectional.apply({"params": params}, ids, batch["input_mask"], batch["segment_ids"]).mlm_logits
  b = bidirectional.apply({"params": params}, changed, batch["input_mask"], batch["segment_ids"]).mlm_logits
  assert not np.allclose(np.asarray(a)[0, :4], np.asarray(b)[0, :4], atol=1e-6)


def test_ltr_needs_a_causal_model_without_a_sentence_head():
  from bert_jax.configs import ltr as ltr_configs
  from bert_jax.training.objectives import make_objective
  config = ltr_configs.get_config("tiny")
  assert make_objective(config).config.causal
  config.model.causal = False
  with pytest.raises(UserError, match="model.causal=True"):
    make_objective(config)
