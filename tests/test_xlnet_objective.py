"""XLNet's presets and permutation LM (configs/xlnet.py, training/objectives/xlnet.py): parameter counts
against the released models and the built model, the sampled factorisation against XLNet's rules, the
loss against transformers' XLNetLMHeadModel given the same factorisation, and (slow) `tiny` pretraining."""
import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers

from bert_jax import presets
from bert_jax.config_utils import load_config
from bert_jax.conversion import common, hf
from bert_jax.models import families
from bert_jax.models.xlnet import XLNetConfig
from bert_jax.training import trainer
from bert_jax.training.objectives import make_objective
from bert_jax.training.objectives import xlnet as plm
from core_helpers import random_batch, slow


def _count(config):
  ids = jnp.zeros((1, 4), jnp.int32)
  abstract = jax.eval_shape(lambda: families.build(config).init(jax.random.key(0), ids))["params"]
  abstract = {k: v for k, v in nn.meta.unbox(abstract).items() if k != "mlm_head"}
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(abstract))


def test_presets_have_the_released_sizes():
  rows = {r["preset"]: r for r in presets.list_presets(("xlnet",))}
  assert abs(rows["base"]["params"] / 117e6 - 1) < 0.04 and abs(rows["large"]["params"] / 360e6 - 1) < 0.04
  for name in ("tiny", "base", "large"):  # the presets' count is the built model's
    config = load_config(f"configs/xlnet.py:{name}")
    assert rows[name]["params"] == _count(XLNetConfig.from_dict(config.model.to_dict())), name
    assert config.objective == "xlnet" and rows[name]["family"] == "xlnet"


def _batch(seed=0):
  batch = random_batch(seed, batch=6, seq=24, predictions=4, vocab=50)
  batch["input_mask"][0] = 1  # one full row
  batch["input_ids"] *= batch["input_mask"]
  return batch


def test_plan_follows_xlnets_factorisation_rules():
  batch = _batch()
  mask = batch["input_mask"]
  k = 4
  sample = jax.jit(plm.sample_plan, static_argnames=("k", "max_span", "context"))
  plan = jax.tree.map(np.asarray, sample(jax.random.key(3), jnp.asarray(mask), k=k, max_span=3, context=2))
  p = 24 // k
  assert plan.perm_mask.shape == (6, 24, 24) and plan.target_mapping.shape == (6, p, 24)
  runs = []
  for row in range(6):
    real = int(mask[row].sum())
    goal = min(max(real // k, 1), p, real - 2)
    target = plan.target_mapping[row].sum(0) > 0
    assert target.sum() == goal == plan.weights[row].sum()
    assert not target[0] and not target[real - 1:].any()  # never [CLS], [SEP] or padding
    np.testing.assert_array_equal(plan.targets[row][:goal], np.flatnonzero(target))
    # The order: non-targets first, then each target after those it sees; none sees itself.
    perm = plan.perm_mask[row] > 0
    assert not perm[:, ~target].any()  # non-targets are seen by every position
    assert perm[~target][:, target].all()  # and see no target
    seen = (~perm[target][:, target]).sum(1)  # how many targets each target sees
    np.testing.assert_array_equal(np.sort(seen), np.arange(goal))  # a strict order of the targets
    rank = np.full(24, -1)
    rank[target] = seen
    np.testing.assert_array_equal(perm, target[None, :] & (rank[None, :] >= rank[:, None]))
    edges = np.diff(np.concatenate([[0], target.astype(int), [0]]))
    runs += list(np.flatnonzero(edges == -1) - np.flatnonzero(edges == 1))
  assert np.mean(runs) > 1.2  # targets come in spans
  again = sample(jax.random.key(3), jnp.asarray(mask), k=k, max_span=3, context=2)
  other = sample(jax.random.key(4), jnp.asarray(mask), k=k, max_span=3, context=2)
  np.testing.assert_array_equal(again.perm_mask, plan.perm_mask)
  assert not np.array_equal(other.perm_mask, plan.perm_mask)


def test_original_tokens_puts_the_masked_tokens_back():
  batch = _batch()
  restored = np.asarray(plm.original_tokens(batch))
  expected = batch["input_ids"].copy()
  for row, (positions, ids, weights) in enumerate(zip(batch["masked_lm_positions"], batch["masked_lm_ids"],
                                                      batch["masked_lm_weights"])):
    for position, token, weight in zip(positions, ids, weights):
      if weight > 0:
        expected[row, position] = token
  np.testing.assert_array_equal(restored, expected)


@slow  # weekly suite (BERT_JAX_SLOW_TESTS=1): the suite's 15 minutes; the family's HF-equality test stays
def test_loss_matches_transformers_on_the_same_factorisation(tmp_path):
  config = load_config("configs/xlnet.py:tiny", ["--config.model.vocab_size=50", "--config.model.hidden_size=32",
                                                 "--config.model.num_layers=2", "--config.model.intermediate_size=40",
                                                 "--config.model.num_heads=4", "--config.xlnet.mem_len=0",
                                                 "--config.xlnet.reuse_len=0", "--config.xlnet.bi_data=false"])
  objective = make_objective(config)
  batch = _batch()
  params = nn.meta.unbox(jax.jit(objective.init)(jax.random.key(0), batch))
  params = jax.tree.map(lambda x: x + 0.2 * np.random.RandomState(0).standard_normal(x.shape).astype(np.float32),
                        params)  # biases away from zero
  key = jax.random.key(7)
  sums = jax.jit(lambda params, batch: objective.sums(params, batch, key, deterministic=True))(params, batch)
  loss = float(objective.loss(sums, objective.counts(batch)))

  hf.write(str(tmp_path / "hf"), common.Converted("xlnet", objective.config, params, None))
  model = transformers.XLNetLMHeadModel.from_pretrained(tmp_path / "hf").eval()
  order_key, _ = jax.random.split(key)
  plan = jax.tree.map(np.asarray, plm.sample_plan(order_key, jnp.asarray(batch["input_mask"]), k=6))
  ids = np.asarray(plm.original_tokens(batch))
  labels = np.where(plan.weights > 0, np.take_along_axis(ids, plan.targets, 1), -100).astype(np.int64)
  with torch.no_grad():
    ref = model(torch.tensor(ids), attention_mask=torch.tensor(batch["input_mask"]),
                token_type_ids=torch.tensor(batch["segment_ids"]), perm_mask=torch.tensor(plan.perm_mask),
                target_mapping=torch.tensor(plan.target_mapping), labels=torch.tensor(labels))
  assert float(ref.loss) > 1.0
  np.testing.assert_allclose(loss, float(ref.loss), rtol=1e-5)
  # The same loss by hand from transformers' logits (log-softmax at the labels, real targets only).
  logits = ref.logits.numpy().astype(np.float64)
  log_probs = logits - logits.max(-1, keepdims=True)
  log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
  real = labels >= 0
  np.testing.assert_allclose(loss, -np.take_along_axis(log_probs, np.maximum(labels, 0)[..., None], -1)[..., 0][real]
                             .mean(), rtol=1e-5)


@slow
def test_tiny_pretraining_loss_falls(tmp_path):
  config = load_config("configs/xlnet.py:tiny", [
      "--config.train.batch_size=16", "--config.data.max_seq_length=64", "--config.train.num_steps=60",
      "--config.train.log_every_steps=5", "--config.train.eval_every_steps=0", "--config.checkpoint.every_steps=1000",
      "--config.checkpoint.async_save=False", "--config.optimizer.warmup_steps=5",
      "--config.optimizer.learning_rate=2e-3", "--config.xlnet.reuse_len=32",
      "--config.xlnet.mem_len=48"])  # the preset's memory across steps, bi_data and stream layout
  trainer.pretrain(config, str(tmp_path))
  with open(os.path.join(tmp_path, "metrics.jsonl")) as f:
    rows = [r for r in map(json.loads, f) if "loss" in r]
  assert rows[-1]["loss"] < rows[0]["loss"] - 0.4, (rows[0]["loss"], rows[-1]["loss"])
  assert "plm_accuracy" in rows[-1]
