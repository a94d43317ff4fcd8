"""ERNIE-THU (Zhang et al. 2019): the knowledgeable encoder's fusion layer against NumPy of the paper's equations,
the switch off = the model as before, the dEA noise, candidates, labels and loss against hand-built examples and
NumPy, mention matching, and on a small synthetic knowledge graph: the loss falls and a planted token-entity
relation is learned."""
import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from scipy.special import erf

from bert_jax import params_checkpoint
from bert_jax.config_utils import load_config
from bert_jax.conversion import hf
from bert_jax.data_pipelines import entities
from bert_jax.errors import UserError
from bert_jax.models import attention, families
from bert_jax.models.bert import KnowledgeLayer
from bert_jax.models.config import ModelConfig
from bert_jax.training import trainer
from bert_jax.training.objectives import make_objective
from bert_jax.training.objectives.ernie_thu import ErnieThuPretraining
from core_helpers import random_like, slow

SMALL = dict(vocab_size=64, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=24,
             max_position_embeddings=16, hidden_dropout=0.0, attention_dropout=0.0)


def _gelu(x):
  return 0.5 * x * (1 + erf(x / np.sqrt(2)))


def _ln(x, p, eps=1e-12):
  mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
  return (x - mu) / np.sqrt(var + eps) * np.asarray(p["scale"]) + np.asarray(p["bias"])


def _np_attention(x, p, keys):
  """BERT's self-attention: x [B, T, H], keys bool[B, T] (the keys each query may see)."""
  q, k, v = (np.einsum("bth,hnd->btnd", x, np.asarray(p[n]["kernel"])) + np.asarray(p[n]["bias"])
             for n in ("query", "key", "value"))
  logits = np.einsum("btnd,bsnd->bnts", q, k) / np.sqrt(q.shape[-1])
  logits = np.where(keys[:, None, None, :], logits, np.finfo(np.float32).min)
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  y = np.einsum("bnts,bsnd->btnd", probs, v)
  return np.einsum("btnd,ndh->bth", y, np.asarray(p["out"]["kernel"])) + np.asarray(p["out"]["bias"])


def _np_knowledge_layer(p, x, e, mask, tokens, fusion):
  """The aggregator (paper section 4.2): attention sublayers on both streams, then the information fusion."""
  x = _ln(x + _np_attention(x, p["attention"], tokens > 0), p["attention_layer_norm"])
  e = _ln(e + _np_attention(e, p["entity_attention"], mask > 0), p["entity_attention_layer_norm"])
  h = _gelu(x @ np.asarray(p["token_fusion"]["kernel"]) + np.asarray(p["token_fusion"]["bias"])
            + mask[..., None] * (e @ np.asarray(p["entity_fusion"]["kernel"])))
  w = h @ np.asarray(p["token_output"]["kernel"]) + np.asarray(p["token_output"]["bias"])
  ent = h @ np.asarray(p["entity_output"]["kernel"]) + np.asarray(p["entity_output"]["bias"])
  if fusion == "paper":
    return _gelu(w), _gelu(ent)
  return _ln(x + w, p["output_layer_norm"]), _ln(e + ent, p["entity_output_layer_norm"])


@pytest.mark.parametrize("fusion", ["paper", "residual"])
def test_the_fusion_layer_is_the_papers_equations(fusion):
  cfg = ModelConfig(**SMALL, entity_layers=1, entity_dim=8, entity_heads=2, entity_fusion=fusion)
  rng = np.random.default_rng(0)
  x = rng.normal(size=(2, 6, 16)).astype(np.float32)
  e = rng.normal(size=(2, 6, 8)).astype(np.float32)
  mask = np.array([[0, 1, 0, 0, 1, 0], [0, 0, 0, 0, 0, 0]], np.int32)  # the second row has no entity at all
  tokens = np.array([[1] * 6, [1] * 4 + [0] * 2], np.int32)
  e = e * mask[..., None]
  layer = KnowledgeLayer(cfg)
  segments, entity_segments = attention.Segments.of(tokens, None), attention.Segments(mask)
  init = lambda r: layer.init(r, x, e, mask, segments, entity_segments, True)  # noqa: E731
  params = random_like(nn.meta.unbox(jax.eval_shape(init, jax.random.key(0)))["params"], 0.1, 1)  # biases too
  got_w, got_e = layer.apply({"params": params}, x, e, mask, segments, entity_segments, True)
  want_w, want_e = _np_knowledge_layer(params, x, e, mask.astype(np.float32), tokens, fusion)
  np.testing.assert_allclose(np.asarray(got_w), want_w, rtol=2e-4, atol=2e-5)
  np.testing.assert_allclose(np.asarray(got_e)[mask > 0], want_e[mask > 0], rtol=2e-4, atol=2e-5)
  assert np.isfinite(np.asarray(got_e)).all()


def test_entity_fusion_off_is_the_model_as_before():
  ids = jnp.asarray(np.random.default_rng(0).integers(1, 64, (2, 8)), jnp.int32)
  plain = families.build(ModelConfig(**SMALL))
  # the other entity keys changed, entity_layers 0: no parameter, the same function
  off = families.build(ModelConfig(**SMALL, entity_dim=12, entity_heads=3, entity_fusion="residual"))
  p0 = jax.jit(plain.init)(jax.random.key(0), ids)["params"]  # compiled: eagerly each op compiles on its own
  p1 = jax.jit(off.init)(jax.random.key(0), ids)["params"]
  assert jax.tree.structure(p0) == jax.tree.structure(p1)
  jax.tree.map(np.testing.assert_array_equal, p0, p1)
  a, b = jax.jit(plain.apply)({"params": p0}, ids), jax.jit(off.apply)({"params": p0}, ids)
  np.testing.assert_array_equal(a.last_hidden_state, b.last_hidden_state)
  np.testing.assert_array_equal(a.mlm_logits, b.mlm_logits)
  # on: the text layers keep BERT's names (the bottom L - K layers), the fusion layers are added beside them
  on = families.build(ModelConfig(**SMALL, entity_layers=1, entity_dim=8, entity_heads=2))
  p2 = nn.meta.unbox(jax.eval_shape(on.init, jax.random.key(0), ids)["params"])
  assert set(p2) == set(p0) | {"knowledge_encoder"}
  assert p2["encoder"]["layers"]["attention"]["query"]["kernel"].shape[0] == 1
  with pytest.raises(UserError, match="entity_layers"):
    ModelConfig(**SMALL, entity_layers=2)


def test_the_entity_stream_changes_the_tokens_only_through_aligned_entities():
  cfg = ModelConfig(**SMALL, entity_layers=1, entity_dim=8, entity_heads=2)
  model = families.build(cfg)
  ids = jnp.ones((1, 6), jnp.int32)
  params = random_like(nn.meta.unbox(jax.eval_shape(model.init, jax.random.key(0), ids)["params"]), 0.1, 0)
  vec = np.random.default_rng(0).normal(size=(1, 6, 8)).astype(np.float32)
  apply = jax.jit(lambda p, **entities: model.apply({"params": p}, ids, **entities).last_hidden_state)
  none = apply(params)
  unaligned = apply(params, entity_vectors=vec, entity_mask=np.zeros((1, 6), np.int32))
  aligned = apply(params, entity_vectors=vec, entity_mask=np.eye(6, dtype=np.int32)[1:2])
  np.testing.assert_allclose(unaligned, none, atol=1e-6)
  assert np.abs(np.asarray(aligned - none)).max() > 1e-3


def test_candidates_and_labels_by_hand():
  ids = np.array([[0, 7, 0, 3, 7, 0, 9], [0, 0, 0, 0, 0, 0, 0]], np.int32)
  cands, labels = entities.candidates(ids, max_entities=2)
  np.testing.assert_array_equal(cands, [[7, 3], [0, 0]])
  np.testing.assert_array_equal(labels, [[-1, 0, -1, 1, 0, -1, -1], [-1] * 7])  # entity 9 is beyond the 2


def test_the_dea_noise_replaces_5_masks_15_and_keeps_80_percent():
  ids = np.random.default_rng(0).integers(0, 51, (200, 100)).astype(np.int32)  # 50 entities, 0: none
  out = entities.noise(ids, 50, 0.05, 0.15, np.random.default_rng(1))
  aligned = ids > 0
  assert (out[~aligned] == 0).all()
  kept, masked = (out == ids)[aligned].mean(), (out == 0)[aligned].mean()
  replaced = ((out != ids) & (out > 0))[aligned].mean()
  n = aligned.sum()
  for got, want in ((kept, 0.80), (masked, 0.15), (replaced, 0.05)):
    assert abs(got - want) < 4 * np.sqrt(want * (1 - want) / n), (got, want)
  assert out.max() <= 50 and out[aligned & (out != ids) & (out > 0)].min() >= 1


def test_mentions_match_longest_first_at_word_boundaries():
  vocab = {"harry": 1, "potter": 2, "##s": 3, "london": 4, "in": 5, "lives": 6}

  class Tok:
    def encode(self, text):
      return [vocab[w] for w in text.lower().split()]

    def continuation_mask(self):
      return np.array([False, False, False, True, False, False, False])

  mentions = entities.Mentions({(1, 2): 10, (1,): 11, (4,): 12}, Tok().continuation_mask())
  got = mentions.match(np.array([1, 2, 6, 5, 4, 1, 2, 3, 1], np.int32))  # harry potter lives in london harry potter##s harry
  np.testing.assert_array_equal(got, [10, 0, 0, 0, 12, 11, 0, 0, 11])  # "potter##s" is another word


def test_mention_file_rows_and_bad_lines(tmp_path):
  class Tok:
    def encode(self, text):
      return [len(w) for w in text.split()]

  path = tmp_path / "m.tsv"
  path.write_text("ab cde\t0\n# a comment\nxyz\t2\n")
  m = entities.Mentions.from_file(str(path), Tok(), 3)
  np.testing.assert_array_equal(m.match(np.array([2, 3, 9, 3])), [1, 0, 0, 3])  # rows + 1
  path.write_text("ab\t3\n")
  with pytest.raises(UserError, match="line 1"):
    entities.Mentions.from_file(str(path), Tok(), 3)


def _objective(table, **model):
  cfg = ModelConfig(**{**SMALL, "entity_layers": 1, **model, "entity_dim": table.shape[1], "entity_heads": 2})
  return ErnieThuPretraining(cfg, table, max_entities=4)


def test_the_dea_loss_against_numpy():
  rng = np.random.default_rng(0)
  table = rng.normal(size=(6, 8)).astype(np.float32)
  objective = _objective(table, sentence_head="none")
  batch = {"input_ids": rng.integers(1, 64, (2, 8)).astype(np.int32), "input_mask": np.ones((2, 8), np.int32),
           "segment_ids": np.zeros((2, 8), np.int32), "masked_lm_positions": np.array([[1, 2], [0, 3]], np.int32),
           "masked_lm_ids": np.array([[5, 6], [7, 8]], np.int32), "masked_lm_weights": np.ones((2, 2), np.float32),
           "next_sentence_labels": np.zeros(2, np.int32),
           "entity_ids": np.array([[0, 3, 0, 5, 3, 0, 1, 0], [0, 0, 2, 0, 0, 0, 0, 0]], np.int32)}
  batch = objective.add_features(batch, np.random.default_rng(1))
  params = random_like(nn.meta.unbox(jax.eval_shape(objective.init, jax.random.key(0), batch)), 0.3, 2)
  sums, counts = jax.jit(lambda p, b: objective.sums(p, b, None, True))(params, batch), objective.counts(batch)
  hidden = np.asarray(jax.jit(lambda p, b: objective.apply(p, b, None, True).last_hidden_state)(params, batch))
  head = params["dea_head"]
  projected = hidden @ np.asarray(head["kernel"]) + np.asarray(head["bias"])
  cands = [[3, 5, 1], [2]]  # the rows' entities, in order of first mention
  nll, correct = [], []
  for b, t in zip(*np.nonzero(batch["entity_labels"] >= 0)):
    logits = np.array([projected[b, t] @ table[c - 1] for c in cands[b]], np.float64)
    label = cands[b].index(int([[0, 3, 0, 5, 3, 0, 1, 0], [0, 0, 2, 0, 0, 0, 0, 0]][b][t]))
    nll.append(np.log(np.exp(logits - logits.max()).sum()) + logits.max() - logits[label])
    correct.append(logits.argmax() == label)
  assert float(counts["dea"]) == 5
  np.testing.assert_allclose(float(sums["dea_loss"]), np.sum(nll), rtol=1e-5)
  assert float(sums["dea_correct"]) == np.sum(correct)
  metrics = objective.metrics(sums, counts)
  mlm = float(sums["mlm_loss"]) / 4
  np.testing.assert_allclose(float(objective.loss(sums, counts)), mlm + np.sum(nll) / 5, rtol=1e-5)
  np.testing.assert_allclose(float(metrics["dea_loss"]), np.mean(nll), rtol=1e-5)


# The synthetic knowledge graph: 24 entities with random vectors, each with an attribute (one of 4 words) that is a
# function of its vector. Every row mentions an entity by the word "thing" (the surface says nothing about which),
# followed by its entity's attribute word, masked for the MLM: only the entity can tell it; and one or two other
# entities by the word "object", followed by filler.
THING, OBJECT, ATTRS, FILLER, MASK = 5, 40, (6, 7, 8, 9), range(10, 40), 4


def _kg_batch(rng, table, rows=64, length=12):
  attribute = np.argmax(table[:, :4], axis=1)  # entity row -> attribute index
  ids = rng.choice(list(FILLER), (rows, length)).astype(np.int32)
  ids[:, 0] = 2
  entity_ids = np.zeros((rows, length), np.int32)
  positions = np.zeros((rows, 1), np.int32)
  targets = np.zeros((rows, 1), np.int32)
  for b in range(rows):
    starts = rng.permutation([1, 4, 7, 10])[:rng.integers(2, 4)]
    for k, s in enumerate(starts):
      e = rng.integers(len(table))
      ids[b, s], entity_ids[b, s] = THING if k == 0 else OBJECT, e + 1
      if k == 0:
        positions[b, 0], targets[b, 0], ids[b, s + 1] = s + 1, ATTRS[attribute[e]], MASK
  return {"input_ids": ids, "input_mask": np.ones_like(ids), "segment_ids": np.zeros_like(ids),
          "masked_lm_positions": positions, "masked_lm_ids": targets, "masked_lm_weights": np.ones((rows, 1), np.float32),
          "next_sentence_labels": np.zeros(rows, np.int32), "entity_ids": entity_ids}


def _train(steps, use_entities=True, seed=0):
  rng = np.random.default_rng(seed)
  table = rng.normal(size=(24, 8)).astype(np.float32)
  # two fusion layers: the entity enters at its mention's token, the next layer's attention takes it one further
  objective = _objective(table, sentence_head="none", hidden_size=32, num_heads=4, intermediate_size=64,
                         num_layers=3, entity_layers=2)
  first = objective.add_features(_kg_batch(rng, table), rng)
  params = nn.meta.unbox(objective.init(jax.random.key(seed), first))
  tx = optax.adam(5e-3)
  opt = tx.init(params)

  def strip(batch):
    return batch if use_entities else {**batch, "entity_mask": np.zeros_like(batch["entity_mask"])}

  @jax.jit
  def step(params, opt, batch):
    def loss(p):
      return objective.loss(objective.sums(p, batch, None, True), objective.counts(batch))
    value, grads = jax.value_and_grad(loss)(params)
    updates, opt = tx.update(grads, opt)
    return optax.apply_updates(params, updates), opt, value

  losses = []
  for _ in range(steps):
    params, opt, value = step(params, opt, strip(objective.add_features(_kg_batch(rng, table), rng)))
    losses.append(float(value))
  objective.replace = objective.mask = 0.0  # held out: every alignment as the text has it
  held = strip(objective.add_features(_kg_batch(np.random.default_rng(99), table, rows=128), np.random.default_rng(9)))
  metrics = objective.metrics(objective.sums(params, held, None, True), objective.counts(held))
  return losses, {k: float(v) for k, v in metrics.items()}


@slow  # 30 steps of a fused model (BERT_JAX_SLOW_TESTS=1)
def test_on_a_synthetic_knowledge_graph_the_loss_falls():
  losses, _ = _train(30)
  assert np.mean(losses[-5:]) < 0.8 * np.mean(losses[:5]), losses


@slow  # a few hundred steps (BERT_JAX_SLOW_TESTS=1)
def test_on_a_synthetic_knowledge_graph_the_planted_relation_is_learned_from_the_entities():
  _, fused = _train(400)
  _, blind = _train(400, use_entities=False)  # the same model with every alignment masked
  assert fused["mlm_accuracy"] > 0.75, fused  # chance: 1/4 attributes (the majority one ~ 0.3)
  assert blind["mlm_accuracy"] < 0.5, blind  # the majority attribute, ~0.4
  assert fused["dea_accuracy"] > 0.9, fused  # chance: 1/2 to 1/3 candidates


RUN = ["--config.model.hidden_size=32", "--config.model.num_heads=2", "--config.model.intermediate_size=48",
       "--config.model.num_layers=2", "--config.model.entity_dim=8", "--config.data.max_seq_length=32",
       "--config.data.max_predictions_per_seq=5", "--config.train.batch_size=8", "--config.data.num_shards=2",
       "--config.data.shuffle_buffer=20", "--config.train.eval_every_steps=2", "--config.train.eval_steps=1",
       "--config.train.eval_batch_size=8", "--config.checkpoint.every_steps=0",
       "--config.checkpoint.async_save=false", "--config.train.tensorboard=false",
       "--config.optimizer.decay=constant", "--config.optimizer.warmup_steps=0", "--config.train.log_every_steps=1"]


def _run(workdir, steps):
  config = trainer.load_run_config("configs/ernie_thu.py:tiny", RUN + [f"--config.train.num_steps={steps}"])
  return trainer.pretrain(config, str(workdir))


@slow  # a pretrain job (~20 s); the fusion, dEA and objective numerics stay in the default suite
def test_the_tiny_preset_runs_through_the_pretrain_job(tmp_path):
  result = _run(tmp_path / "run", 2)
  assert {"mlm_loss", "nsp_loss", "dea_loss", "dea_accuracy"} <= set(result["train"])
  assert {"dea_loss", "dea_accuracy"} <= set(result["eval"]) and 0 < result["train"]["dea_loss"] < 10
  params, _ = params_checkpoint.load_params(str(tmp_path / "run"))
  assert "knowledge_encoder" in params and "dea_head" in params
  # the frozen entity table (64 toy entities x 8) is no parameter: not trained, not in the checkpoint
  assert not [x for x in jax.tree.leaves(params) if x.shape[:1] == (entities.TOY_ENTITIES,)]


@slow  # three short runs (BERT_JAX_SLOW_TESTS=1)
def test_a_stopped_and_resumed_run_equals_the_uninterrupted_one(tmp_path):
  whole = _run(tmp_path / "whole", 4)
  _run(tmp_path / "parts", 2)
  parts = _run(tmp_path / "parts", 4)  # the dEA noise of steps 3 and 4 drawn again from (seed, step)
  a, _ = params_checkpoint.load_params(str(tmp_path / "whole"))
  b, _ = params_checkpoint.load_params(str(tmp_path / "parts"))
  jax.tree.map(np.testing.assert_array_equal, a, b)
  assert {k: v for k, v in parts["train"].items() if "per_sec" not in k} == {
      k: v for k, v in whole["train"].items() if "per_sec" not in k}


def test_missing_entity_inputs_are_one_line():
  config = load_config("configs/ernie_thu.py:base", ["--config.ernie_thu.entity_embeddings=/nope.npy"])
  with pytest.raises(UserError, match="cannot read a .npy"):
    make_objective(config)
  with pytest.raises(UserError, match="needs ernie_thu.entity_embeddings"):
    make_objective(load_config("configs/ernie_thu.py:base"))
  with pytest.raises(UserError, match="entity_layers > 0"):
    make_objective(load_config("configs/ernie_thu.py:tiny", ["--config.model.entity_layers=0"]))


def test_a_fused_model_has_no_hugging_face_export(tmp_path):
  converted = types.SimpleNamespace(record=families.get("bert"), config=ModelConfig(**SMALL, entity_layers=1,
                                                                                    entity_dim=8, entity_heads=2))
  with pytest.raises(UserError, match="entity_layers=1: ERNIE-THU's entity fusion layers have no Hugging Face"):
    hf.write(str(tmp_path / "hf"), converted)
