"""head.cls_norm=isobn (models/isobn.py): IsoBN's normalisation against NumPy, in training (the estimates take
the batch in) and in evaluation; one optimizer step assigns the new estimates and leaves the loss and the
trained parameters' gradients as they were; a fine-tuning run keeps them in params, predict reads them, and
the HF export refuses them in one line."""
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import data_fixtures
from bert_jax import cli, params_checkpoint
from bert_jax.finetune import heads, objective as objective_lib, optim
from bert_jax.models import isobn
from bert_jax.models.config import ModelConfig
from bert_jax.config_utils import load_config
from core_helpers import slow


def _sst2_teacher():
  import conftest  # pylint: disable=import-outside-toplevel
  return conftest.SST2_TEACHER


def _numpy_isobn(h, cov, std, training, m=0.05, eps=1e-3, beta=0.5):
  """IsoBN (Zhou et al. 2021) on h [B, H] from estimates (cov, std): (output, new cov, new std)."""
  h = np.asarray(h, np.float64)
  if training:
    y = h - h.mean(0)
    cov = cov + m * (y.T @ y / len(h) - cov)
    std = std + m * (np.sqrt((y ** 2).mean(0)) - std)
  corr = np.clip(cov / np.outer(std, std), -1, 1)
  gamma = (corr ** 2).mean(1)
  scale = 1 / (gamma * std + eps) ** beta
  scale *= np.sqrt(np.trace(cov) / ((np.diag(cov) * scale ** 2).sum() + eps))
  return h * scale, cov, std


def test_the_normalisation_equals_numpy_in_training_and_evaluation():
  rng = np.random.default_rng(0)
  h = rng.normal(size=(16, 6)) * np.array([5, 1, 1, 0.2, 1, 3]) + np.array([2, 0, 0, 0, -1, 0])
  cov = np.cov(rng.normal(size=(6, 40))) * 0.7
  std = np.sqrt(np.diag(cov)) * 1.1
  module = isobn.IsoBN()
  params = {"running_cov": jnp.asarray(cov, jnp.float32), "running_std": jnp.asarray(std, jnp.float32)}
  out, state_loss = module.apply({"params": params}, jnp.asarray(h, jnp.float32), False)
  expected, new_cov, new_std = _numpy_isobn(h, cov, std, training=True)
  np.testing.assert_allclose(out, expected, rtol=2e-4, atol=1e-5)
  assert float(state_loss) == 0.0
  # d state_loss / d estimates = estimate - new value: the optimizer's update -gradient assigns the new value
  grads = jax.grad(lambda p: module.apply({"params": p}, jnp.asarray(h, jnp.float32), False)[1])(params)
  np.testing.assert_allclose(grads["running_cov"], cov - new_cov, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(grads["running_std"], std - new_std, rtol=1e-4, atol=1e-6)
  out, state_loss = module.apply({"params": params}, jnp.asarray(h, jnp.float32), True)
  np.testing.assert_allclose(out, _numpy_isobn(h, cov, std, training=False)[0], rtol=2e-4, atol=1e-5)
  assert state_loss is None
  zero = {k: jnp.zeros_like(v) for k, v in params.items()}  # before any training step: the vector is zero
  assert not np.any(np.asarray(module.apply({"params": zero}, jnp.asarray(h, jnp.float32), True)[0]))


def test_one_step_assigns_the_estimates_and_trains_the_rest_as_without_them():
  config = load_config("configs/glue.py:sst2", ["--config.optimizer.weight_decay=0.01"])
  model_config = ModelConfig(vocab_size=64, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                             max_position_embeddings=16, hidden_dropout=0.0, attention_dropout=0.0)
  model = heads.FinetuneModel(heads.encoder_config(model_config, "classification", "pooled"), "classification", 2,
                              "pooled", 0.0, "isobn")
  objective = objective_lib.FinetuneObjective(model)
  rng = np.random.default_rng(1)
  batch = {"input_ids": jnp.asarray(rng.integers(1, 64, size=(8, 12)), jnp.int32),
           "attention_mask": jnp.ones((8, 12), jnp.int32), "token_type_ids": jnp.zeros((8, 12), jnp.int32),
           "label": jnp.asarray(rng.integers(0, 2, size=8), jnp.int32)}
  params = nn.meta.unbox(jax.jit(objective.init)(jax.random.key(0), batch))
  params["head"]["cls_norm"] = {"running_cov": jnp.eye(16) * 0.3, "running_std": jnp.full((16,), 0.5)}
  counts = objective.counts(batch)
  loss = lambda p: objective.loss(objective.sums(p, batch, jax.random.key(1), False), counts)  # noqa: E731
  plain = lambda p: objective.head.loss(objective.apply(p, batch, jax.random.key(1), False), batch) / counts["labels"]  # noqa: E731
  (value, grads), (plain_value, plain_grads) = jax.jit(  # one compile for both
      lambda p: (jax.value_and_grad(loss)(p), jax.value_and_grad(plain)(p)))(params)
  tx, _ = optim.make_optimizer(config.optimizer, 10, params, model_config)
  after = jax.jit(lambda g, p: optax.apply_updates(p, tx.update(g, tx.init(p), p)[0]))(grads, params)  # one compile
  pooled = jax.jit(lambda p: model.apply({"params": p}, *(batch[k] for k in ("input_ids", "attention_mask",
                                                                            "token_type_ids")),
                                         method=lambda m, *a: m.encoder_model(*a).pooled_output))(params)
  _, new_cov, new_std = _numpy_isobn(pooled, np.eye(16) * 0.3, np.full(16, 0.5), training=True)
  np.testing.assert_allclose(after["head"]["cls_norm"]["running_cov"], new_cov, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(after["head"]["cls_norm"]["running_std"], new_std, rtol=1e-4, atol=1e-6)
  # The zero-valued term changes neither the loss nor any trained parameter's gradient.
  assert float(value) == pytest.approx(float(plain_value), rel=1e-6)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-7),
               {k: v for k, v in grads.items() if k != "head"}, {k: v for k, v in plain_grads.items() if k != "head"})


@slow  # a fine-tuning run and predict end to end (~26 s in the suite); the estimates' math is tested above
def test_a_fine_tuning_run_keeps_the_estimates_and_predict_reads_them(tmp_path, capsys):
  data = data_fixtures.write_first_word_sst2(tmp_path / "sst2", n_train=64, n_dev=32)
  workdir = str(tmp_path / "run")
  overrides = [o for o in _sst2_teacher() if "epochs" not in o] + [
      f"--config.data.data_dir={data}", "--config.train.epochs=1", "--config.head.cls_norm=isobn"]
  assert cli.main(["finetune", "--config", "configs/glue.py:sst2", "--workdir", workdir, *overrides]) == 0
  params, _ = params_checkpoint.load_params(workdir)
  std = np.asarray(params["head"]["cls_norm"]["running_std"])
  assert std.shape == (32,) and np.all(np.isfinite(std)) and std.max() > 0
  accuracy = data_fixtures.predict_accuracy(workdir, data, tmp_path / "predictions.jsonl")
  final = json.loads((tmp_path / "run" / "eval_results.json").read_text())["accuracy"]
  assert accuracy == pytest.approx(final)
  capsys.readouterr()
  assert cli.main(["convert", "--to", "hf", workdir, str(tmp_path / "hf")]) == 2
  assert "head.cls_norm='isobn' (IsoBN's normalised [CLS]) has no Hugging Face equivalent" in capsys.readouterr().err
  assert cli.main(["finetune", "--config", "configs/glue.py:sst2", "--workdir", str(tmp_path / "bad"), *overrides,
                   "--config.head.cls_norm=batch"]) == 2
  assert "head.cls_norm='batch' is not one of ('none', 'isobn')" in capsys.readouterr().err
