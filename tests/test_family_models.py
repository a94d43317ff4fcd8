"""The family's model pieces against independent references: HF RoBERTa positions, hand-made ELECTRA
replacements, SpanBERT's boundary head written out in numpy, and scanned == unrolled for every family."""
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.special
import torch
from transformers.models.roberta.modeling_roberta import RobertaEmbeddings

from bert_jax.config_utils import load_config
from bert_jax.models import attention, electra
from bert_jax.models.bert import BertModel, TransformerLayer, default_position_ids
from bert_jax.models.config import ModelConfig
from bert_jax.models.spanbert import SpanBoundaryHead
from bert_jax.training import grow, objectives
from core_helpers import slow

SMALL = ["--config.model.vocab_size=64", "--config.model.hidden_size=32", "--config.model.num_heads=2",
         "--config.model.intermediate_size=64", "--config.model.num_layers=2",
         "--config.model.max_position_embeddings=40", "--config.data.max_seq_length=16",
         "--config.data.max_predictions_per_seq=4"]
FAMILIES = {
    "roberta": ("configs/roberta.py:tiny", []),
    "albert": ("configs/albert.py:tiny", ["--config.model.embedding_size=16"]),
    "electra": ("configs/electra.py:tiny", ["--config.model.embedding_size=16"]),
    "spanbert": ("configs/spanbert.py:tiny", []),
}


def family_config(name, *overrides):
  spec, extra = FAMILIES[name]
  return load_config(spec, SMALL + extra + list(overrides))


def make_batch(seed=0, rows=4, length=16, predictions=4, vocab=64):
  """Distinct ascending prediction positions, some padding, one unused slot, span features."""
  rng = np.random.RandomState(seed)
  mask = np.ones((rows, length), np.int32)
  mask[1:, -3:] = 0
  positions = np.stack([np.sort(rng.choice(np.arange(1, length // 2), predictions, replace=False))
                        for _ in range(rows)]).astype(np.int32)
  weights = np.ones((rows, predictions), np.float32)
  weights[0, -1] = 0.0
  return {"input_ids": (rng.randint(5, vocab, (rows, length)) * mask).astype(np.int32),
          "input_mask": mask, "segment_ids": np.zeros((rows, length), np.int32),
          "masked_lm_positions": positions, "masked_lm_ids": rng.randint(5, vocab, positions.shape).astype(np.int32),
          "masked_lm_weights": weights, "next_sentence_labels": rng.randint(0, 2, rows).astype(np.int32),
          "masked_lm_span_left": positions - 1, "masked_lm_span_right": positions + 1,
          "masked_lm_span_offset": np.array([[0, 1, 2, 25]] * rows, np.int32)}


def init_params(objective, batch, seed=0):
  return nn.meta.unbox(jax.jit(objective.init)(jax.random.key(seed), batch))


def eval_sums(objective, params, batch):
  return jax.jit(functools.partial(objective.sums, rng=None, deterministic=True))(params, batch)


def test_roberta_positions_match_hf_and_follow_the_attention_mask():
  cfg = ModelConfig(position_style="roberta", pad_token_id=1, max_position_embeddings=514)
  ids = np.array([[0, 7, 8, 9, 2, 1, 1], [0, 5, 2, 1, 1, 1, 1]], np.int64)
  hf = RobertaEmbeddings.create_position_ids_from_input_ids(torch.tensor(ids), padding_idx=1).numpy()
  np.testing.assert_array_equal(default_position_ids(cfg, jnp.asarray(ids)), hf)
  # A vocabulary trained here pads with id 0 and may use id 1 for a real token: the mask decides.
  local_ids = np.where(ids == 1, 0, ids)
  local_ids[0, 2] = 1
  np.testing.assert_array_equal(default_position_ids(cfg, jnp.asarray(local_ids), jnp.asarray(ids != 1)), hf)


def test_replace_tokens_by_hand():
  input_ids = jnp.array([[2, 4, 9, 4, 6, 3]])  # [CLS] a [MASK] b [MASK] [SEP]
  positions = jnp.array([[2, 4, 0]])  # the last slot is unused: position 0 must stay [CLS]
  weights = jnp.array([[1.0, 1.0, 0.0]])
  originals = jnp.array([[7, 8, 0]])
  samples = jnp.array([[7, 5, 11]])  # the first sample equals the original: not replaced
  ids, replaced = electra.replace_tokens(input_ids, positions, weights, originals, samples)
  np.testing.assert_array_equal(ids, [[2, 4, 7, 4, 5, 3]])
  np.testing.assert_array_equal(replaced, [[0, 0, 0, 0, 1, 0]])


def _shapes(tree):
  return {jax.tree_util.keystr(k): v.shape for k, v in jax.tree_util.tree_leaves_with_path(tree)}


@pytest.fixture(scope="module")
def electra_setup():
  """ELECTRA's config, objective, batch and initial parameters: one init compile for the two tests below."""
  config = family_config("electra")
  objective = objectives.make_objective(config)
  batch = make_batch()
  return config, objective, batch, init_params(objective, batch)


def test_electra_networks_are_bert_model_trees_sharing_embeddings(electra_setup):
  config, objective, batch, params = electra_setup
  inputs = objectives.model_inputs(batch)
  model = ModelConfig.from_dict(config.model.to_dict())
  for net, cfg, tree in (("discriminator", electra.discriminator_config(model), params["discriminator"]),
                         ("generator", electra.generator_config(model, 0.25),
                          objective.model.generator_params(params))):
    want = jax.eval_shape(lambda: BertModel(cfg).init(jax.random.key(0), **inputs)["params"])
    assert _shapes(tree) == _shapes(nn.meta.unbox(want)), net
  assert set(params["generator"]["embeddings"]) == {"token_type_embeddings", "layer_norm", "projection"}
  assert params["generator"]["encoder"]["layers"]["attention"]["query"]["kernel"].shape == (2, 8, 1, 8)


def test_electra_sampling_passes_no_gradient_and_embeddings_learn_from_both_losses(electra_setup):
  _, objective, batch, params = electra_setup
  counts = objective.counts(batch)

  def terms(p):
    sums = objective.sums(p, batch, jax.random.key(1), False)
    return sums["disc_loss"], sums["mlm_loss"]

  def norm(tree):
    return float(optax_norm(tree))

  disc, mlm = jax.jit(jax.jacrev(terms))(params)
  assert norm(disc["generator"]) == 0.0  # the discriminator's loss reaches the generator only via samples
  assert norm(mlm["discriminator"]["encoder"]) == 0.0
  assert norm(disc["discriminator"]["encoder"]) > 0
  shared = ("discriminator", "embeddings", "word_embeddings")
  for g in (disc, mlm):
    assert norm(functools.reduce(lambda t, k: t[k], shared, g)) > 0
  sums = eval_sums(objective, params, batch)
  np.testing.assert_allclose(objective.loss(sums, counts),
                             sums["mlm_loss"] / counts["mlm"] + 50 * sums["disc_loss"] / counts["tokens"],
                             rtol=1e-6)
  assert float(counts["mlm"]) == 15.0 and float(counts["tokens"]) == 4 * 16 - 9


def optax_norm(tree):
  return jnp.sqrt(sum(jnp.sum(jnp.square(x)) for x in jax.tree.leaves(tree)))


def _layer_norm(x, p, eps=1e-12):
  mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + eps) * p["scale"] + p["bias"]


def _gelu(x):
  return 0.5 * x * (1 + scipy.special.erf(x / np.sqrt(2)))


def test_span_boundary_head_matches_the_papers_formula():
  cfg = ModelConfig(vocab_size=50, hidden_size=16, num_heads=2, intermediate_size=32)
  head = SpanBoundaryHead(cfg)
  rng = np.random.RandomState(0)
  hidden = rng.randn(2, 10, 16).astype(np.float32)
  table = rng.randn(50, 16).astype(np.float32)
  left, right, offset = (np.array([[0, 3], [2, 2]]), np.array([[4, 9], [5, 5]]), np.array([[0, 19], [1, 2]]))
  params = nn.meta.unbox(head.init(jax.random.key(0), hidden, left, right, offset, table)["params"])
  params = jax.tree.map(lambda x: np.asarray(x) + rng.randn(*x.shape).astype(np.float32) * 0.1, params)
  got = head.apply({"params": params}, hidden, left, right, offset, table)
  rows = np.arange(2)[:, None]
  x = np.concatenate([hidden[rows, left], hidden[rows, right],
                      params["position_embeddings"]["embedding"][offset]], -1)
  x = _layer_norm(_gelu(x @ params["dense_1"]["kernel"] + params["dense_1"]["bias"]), params["layer_norm_1"])
  x = _layer_norm(_gelu(x @ params["dense_2"]["kernel"] + params["dense_2"]["bias"]), params["layer_norm_2"])
  np.testing.assert_allclose(got, x @ table.T + params["output_bias"], rtol=2e-4, atol=2e-4)


def test_spanbert_is_a_bert_tree_plus_the_head_and_skips_deep_offsets():
  config = family_config("spanbert")
  objective = objectives.make_objective(config)
  batch = make_batch()
  params = init_params(objective, batch)
  bert = nn.meta.unbox(jax.eval_shape(
      lambda: BertModel(objective.config).init(jax.random.key(0), **objectives.model_inputs(batch))["params"]))
  assert _shapes({k: v for k, v in params.items() if k != "sbo_head"}) == _shapes(bert)
  counts = objective.counts(batch)
  assert float(counts["mlm"]) == 15.0 and float(counts["sbo"]) == 12.0  # offset 25 is past the table
  sums = eval_sums(objective, params, batch)
  np.testing.assert_allclose(objective.loss(sums, counts),
                             sums["mlm_loss"] / 15.0 + sums["sbo_loss"] / 12.0, rtol=1e-6)


def unrolled(params, share_layers):
  """A scanned tree laid out as the unrolled encoder's (the same weights)."""
  def convert(tree):
    if not isinstance(tree, dict):
      return tree
    if "encoder" in tree:
      layers = tree["encoder"]["layers"]
      if share_layers == "all":
        encoder = {"layer": layers}
      else:
        num = jax.tree.leaves(layers)[0].shape[0]
        encoder = {f"layer_{i}": jax.tree.map(lambda x, i=i: x[i], layers) for i in range(num)}
      tree = {**tree, "encoder": encoder}
    return {k: convert(v) for k, v in tree.items()}
  return convert(params)


# ELECTRA's two networks are BertModels like these (see the tree test above); left out to save time.
@pytest.mark.parametrize("family", [pytest.param("roberta", marks=slow), "albert", pytest.param("spanbert", marks=slow)])
def test_scanned_equals_unrolled(family):
  batch = make_batch()
  scanned = objectives.make_objective(family_config(family))
  plain = objectives.make_objective(family_config(family, "--config.model.scan_layers=False"))
  params = init_params(scanned, batch)
  plain_params = unrolled(params, scanned.config.share_layers)
  assert _shapes(plain_params) == _shapes(init_params(plain, batch))
  got, want = eval_sums(scanned, params, batch), eval_sums(plain, plain_params, batch)
  for key in want:
    np.testing.assert_allclose(got[key], want[key], rtol=2e-5, atol=1e-5, err_msg=key)


def test_albert_full_sharing_is_one_layer_applied_num_layers_times():
  config = family_config("albert")
  model = BertModel(ModelConfig.from_dict(config.model.to_dict()))
  batch = make_batch()
  inputs = objectives.model_inputs(batch)
  params = nn.meta.unbox(jax.jit(model.init)(jax.random.key(0), **inputs)["params"])
  # Compiled, not run op by op (each op's own compile cost more than the model's).
  out = jax.jit(functools.partial(model.apply, output_hidden_states=True))({"params": params}, **inputs)
  layer = jax.jit(TransformerLayer(model.config).apply, static_argnums=(3, 4))
  x = out.hidden_states[0]
  segments = attention.Segments.of(jnp.asarray(batch["input_mask"]), None)
  for _ in range(2):
    x, _ = layer({"params": params["encoder"]["layers"]}, x, segments, None, True)
  np.testing.assert_allclose(out.last_hidden_state, x, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("scan", [True, False])
def test_grow_copies_layer_i_to_layer_i_plus_L(scan):
  config = family_config("roberta", f"--config.model.scan_layers={scan}")
  params = init_params(objectives.make_objective(config), make_batch())
  grown = grow.grow_params(params, "none")
  layers = unrolled(grown, "none")["encoder"] if scan else grown["encoder"]
  assert len(layers) == 4
  for i in range(4):
    jax.tree.map(np.testing.assert_array_equal, layers[f"layer_{i}"],
                 (unrolled(params, "none")["encoder"] if scan else params["encoder"])[f"layer_{i % 2}"])
  jax.tree.map(np.testing.assert_array_equal, grown["embeddings"], params["embeddings"])
