"""Unpadded fine-tuning training steps (models/unpad.py, finetune/batching.train_packer): a padded batch's real
tokens packed into fewer rows give the padded step's loss and gradients, dropout included, since each packed
token draws its dropout at its place (row, position) in the padded batch (models/batch_rows.packed). Checked on
BERT and ModernBERT heads (every dropout of the encoder on), and through the jitted train step over a data=2 mesh,
one pass and micro-batches (each device's micro-batch packed on its own: unpad.pack_groups)."""
import dataclasses
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.compress import distill, theseus
from bert_jax.config_utils import load_config
from bert_jax.finetune import batching, heads, trainer
from bert_jax.finetune.objective import FinetuneObjective
from bert_jax.models import ModelConfig, unpad
from bert_jax.models.modernbert import ModernBertConfig
from core_helpers import slow
from test_unpad import _batch

DROPOUT = {
    "bert": ModelConfig(vocab_size=64, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32,
                        max_position_embeddings=40, hidden_dropout=0.3, attention_dropout=0.3),
    "modernbert": ModernBertConfig(vocab_size=64, hidden_size=16, num_layers=3, num_heads=2, intermediate_size=24,
                                   global_every=3, local_window=4, pad_token_id=0, max_position_embeddings=40,
                                   pooling="mean", embedding_dropout=0.2, attention_dropout=0.2, mlp_dropout=0.2,
                                   attention="dot"),
}
NO_DROPOUT = {"hidden_dropout": 0.0, "attention_dropout": 0.0, "embedding_dropout": 0.0, "mlp_dropout": 0.0}
LENGTHS = [12, 3, 20, 7, 20, 1, 9, 16]
SHORT = [10, 3, 7, 9, 1, 5, 8, 2, 4, 10, 6, 3, 9, 1, 7, 5]  # any two fit one row of 20


def _labels(kind, mask):
  if kind == "classification":
    return {"label": np.arange(len(mask)) % 3}
  return {"token_labels": (np.arange(mask.size).reshape(mask.shape) % 3).astype(np.int32),
          "label_weights": mask.astype(np.float32)}


@pytest.mark.parametrize("name,kind,dropout", [("bert", "classification", True), ("modernbert", "token", True),
                                               pytest.param("modernbert", "classification", False, marks=slow)])
def test_packed_loss_and_gradients_equal_the_padded(name, kind, dropout):
  config = DROPOUT[name]
  if not dropout:
    config = dataclasses.replace(config, **{k: v for k, v in NO_DROPOUT.items() if hasattr(config, k)})
  model = heads.FinetuneModel(heads.encoder_config(config, kind, "pooled"), kind, 3, "pooled",
                             head_dropout=0.2 if dropout else 0.0)
  batch = _batch(LENGTHS, 20, seed=1)
  batch.update(_labels(kind, batch["attention_mask"]))
  params = jax.jit(model.init)(jax.random.key(0), *(jnp.asarray(batch[k]) for k in (
      "input_ids", "attention_mask", "token_type_ids")))["params"]
  objective = FinetuneObjective(model)
  packed = {**batch, **unpad.pack(batch, config, unit=1)}
  assert packed["input_ids"].shape[0] == 5

  def loss(p, b, rng):
    return objective.sums(p, b, rng, deterministic=False)["loss"] / objective.counts(b)["labels"]
  grad = jax.jit(jax.value_and_grad(loss))
  (want, want_grads), (got, got_grads) = grad(params, batch, jax.random.key(3)), grad(params, packed,
                                                                                       jax.random.key(3))
  np.testing.assert_allclose(got, want, rtol=1e-6)
  for a, b in zip(jax.tree.leaves(got_grads), jax.tree.leaves(want_grads)):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
  # the masks are on: other masks (another key, the padded step's compiled program) give other gradients; with
  # every dropout at 0 the key changes nothing
  other = grad(params, batch, jax.random.key(4))[1]
  moved = max(float(np.abs(a - b).max()) for a, b in zip(jax.tree.leaves(other), jax.tree.leaves(want_grads)))
  assert (moved > 1e-3) == dropout


def test_pack_groups_gives_each_micro_batch_its_own_rows():
  """2 devices x 2 micro-batches of 2 rows: micro-batch a of device g holds rows 4g + a, 4g + a + 2; its packed
  rows (k = 0, 1) sit at 4g + 2k + a, and restoring the micro-batch's slice from them gives its tokens."""
  batch = _batch([5, 3, 8, 2, 6, 6, 1, 4], 8, seed=3)
  packed = unpad.pack_groups(batch, ModelConfig(), groups=2, micro=2)
  assert packed["input_ids"].shape == (8, 8)  # each micro-batch needs 1 or 2 rows: all get 2
  for g in range(2):
    for a in range(2):
      rows = 4 * g + a + 2 * np.arange(2)
      mine = packed["input_ids"][4 * g + a + 2 * np.arange(2)].reshape(-1)
      index = packed["unpad_index"][rows]
      assert index.max() == 16  # local: the slots of its own 2 x 8 packed tokens, 16 past them
      restored = np.concatenate([mine, [0]])[index]
      np.testing.assert_array_equal(restored, batch["input_ids"][rows])
  with pytest.raises(ValueError, match="equal micro-batches"):
    unpad.pack_groups(batch, ModelConfig(), groups=3)


def _setup(model_config, accum):
  config = load_config("configs/glue.py:sst2", [
      "--config.mesh.data=4", "--config.mesh.tensor=2", "--config.train.batch_size=16",
      f"--config.train.grad_accum_steps={accum}",
      "--config.data.max_seq_length=20", "--config.optimizer.warmup_ratio=0.0", "--config.head.dropout=0.2"])
  task = types.SimpleNamespace(head="classification", num_labels=3)
  setup, _ = trainer.build_train_setup(config, heads.encoder_config(model_config, "classification", "pooled"),
                                       task, 64)
  return config, setup


@pytest.mark.parametrize("name,accum", [pytest.param("bert", 1, marks=slow), ("bert", 2),
                                        pytest.param("modernbert", 2, marks=slow)])
def test_train_steps_unpadded_follow_the_padded_curve(name, accum):
  """Three optimizer steps of the jitted train step (data=4 x tensor=2; accum 2: inside shard_map, micro-batches)
  on packed batches (train_packer) give the padded steps' losses and parameters."""
  config, setup = _setup(DROPOUT[name], accum)
  packer = batching.train_packer(setup.objective.model.config, config.train, setup.mesh)
  rng = np.random.default_rng(0)
  batches = []
  for step in range(3):
    batch = _batch(list(rng.permutation(SHORT)), 20, seed=step)
    batches.append({**batch, "label": (np.arange(16) + step) % 3})
  curves, finals = [], []
  for pack in (lambda b: b, packer):
    state = setup.make_state(setup.init_params(jax.random.key(0)))
    losses = []
    for batch in batches:
      state, metrics = setup.train_step(state, pack(batch), jax.random.key(1))
      losses.append(float(metrics["loss"]))
    curves.append(losses)
    finals.append(jax.device_get(state.params))
  assert packer(batches[0])["input_ids"].shape[0] == 8  # accum 2: each device's 2 rows in 1; 1: 4 x 2 rows
  np.testing.assert_allclose(curves[1], curves[0], rtol=1e-5)
  assert curves[0][0] != curves[0][2]
  for a, b in zip(jax.tree.leaves(finals[1]), jax.tree.leaves(finals[0])):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)


def test_training_packs_only_plain_fine_tuning():
  """data.unpad off, SMART or another learner's objective: the train step gets the padded batch."""
  config, setup = _setup(DROPOUT["bert"], 1)
  assert trainer._packing(setup) is setup.objective.model.config
  config.data.unpad = False
  assert trainer._packing(setup) is None
  config.data.unpad = True
  setup.objective.smart = config.smart
  assert trainer._packing(setup) is None
  setup.objective.smart = None
  other = types.SimpleNamespace(packs_rows=False, model=setup.objective.model)  # a distillation's, say
  assert trainer._packing(dataclasses.replace(setup, objective=other)) is None
  assert not distill.DistillObjective.packs_rows and not theseus.TheseusObjective.packs_rows
