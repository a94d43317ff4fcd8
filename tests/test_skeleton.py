"""The shared skeleton from fine-tuning's side: its loss runs through training/step.py's train step,
so it equals the reference cross-entropy and micro-batches give the full batch's update."""
import jax
import numpy as np
import pytest

from bert_jax.config_utils import load_config
from bert_jax.errors import UserError
from bert_jax.finetune import heads, init, tasks, trainer
from bert_jax.training import partitioning

TINY = ["--config.model.num_layers=1", "--config.model.hidden_size=32", "--config.model.num_heads=2",
        "--config.model.intermediate_size=64", "--config.model.max_position_embeddings=32",
        "--config.model.vocab_size=64", "--config.data.max_seq_length=16", "--config.train.batch_size=16",
        "--config.train.eval_batch_size=16", "--config.model.hidden_dropout=0.0",
        "--config.model.attention_dropout=0.0", "--config.head.dropout=0.0"]


def _setup(accum: int):
  config = load_config("configs/glue.py:sst2", TINY + [f"--config.train.grad_accum_steps={accum}"])
  model_config = heads.encoder_config(init.model_config(config, None), "classification", "pooled")
  task = tasks.Task("sst2", "classification", 3, None, [], [], ("accuracy",))
  setup, _ = trainer.build_train_setup(config, model_config, task, num_train=64)
  return setup


def _batch(rng):
  return {"input_ids": rng.integers(5, 64, (16, 16), dtype=np.int32),
          "attention_mask": np.ones((16, 16), np.int32), "token_type_ids": np.zeros((16, 16), np.int32),
          "label": rng.integers(0, 3, (16,), dtype=np.int32)}


def test_finetune_loss_and_micro_batches():
  """Both setups step from the same initial state (the first setup's, placed on the second's shardings: one
  init compiled, not two); the reference cross-entropy comes from the first setup's eval step."""
  batch = _batch(np.random.default_rng(0))
  first = _setup(1)
  initial = jax.device_get(first.init_state(jax.random.key(0)))
  logits = np.asarray(first.eval_step(jax.device_put(initial.params, first.state_shardings.params),
                                      partitioning.global_batch(batch, first.mesh))["logits"], np.float64)
  log_probs = logits - logits.max(-1, keepdims=True)
  log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
  reference = -log_probs[np.arange(16), batch["label"]].mean()
  after = []
  for setup in (first, _setup(2)):
    state = jax.device_put(initial, setup.state_shardings)
    state, metrics = setup.train_step(state, partitioning.global_batch(batch, setup.mesh), jax.random.key(1))
    assert float(metrics["loss"]) == pytest.approx(reference, rel=1e-5)
    after.append(jax.device_get(state.params))
  close = jax.tree.map(lambda a, b: np.allclose(a, b, atol=1e-6), *after)
  assert all(jax.tree.leaves(close))


def test_finetune_batch_must_split_over_micro_batches():
  with pytest.raises(UserError, match="grad_accum_steps"):
    _setup(3)
