"""data.length_buckets (finetune/batching.py): rows go to the smallest bucket holding them, batches never
mix buckets, resume sees the same batches, and a bucketed batch computes what the padded one does
(outputs of `run_model`, and the train step's loss and update)."""
import jax
import numpy as np
import pytest

from bert_jax.config_utils import load_config
from bert_jax.errors import UserError
from bert_jax.finetune import batching, heads, trainer
from bert_jax.finetune.tasks import Task
from bert_jax.models.config import ModelConfig
from bert_jax.training import partitioning

LENGTHS = (4, 8, 16)
TINY = dict(vocab_size=40, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32,
            max_position_embeddings=16)


def _features(n=40, seed=0, max_len=16):
  """Rows of 1..max_len tokens, padded with zeros after their length; token labels for a token head."""
  rng = np.random.default_rng(seed)
  tokens = rng.integers(1, max_len + 1, n)
  mask = (np.arange(max_len)[None] < tokens[:, None]).astype(np.int32)
  return {"input_ids": rng.integers(1, 40, (n, max_len)).astype(np.int32) * mask, "attention_mask": mask,
          "token_type_ids": ((np.arange(max_len)[None] >= tokens[:, None] // 2) * mask).astype(np.int32),
          "label": rng.integers(0, 2, n).astype(np.int32), "tokens": tokens}


def test_buckets_are_checked_and_end_with_max_seq_length():
  assert batching.buckets((), 16) == ()
  assert batching.buckets((4, 8), 16) == (4, 8, 16)
  assert batching.buckets([4, 8, 16], 16) == (4, 8, 16)
  for bad in ((8, 4), (0, 8), (4, 32), (4, 4), (4, "x"), "4,8", (4.5,), (True,), ((4,),)):
    with pytest.raises(UserError, match="data.length_buckets"):
      batching.buckets(bad, 16)


def test_bucketed_batches_never_mix_and_resume_exactly():
  features = _features()
  tokens = features.pop("tokens")
  features["row"] = np.arange(len(tokens))
  want = np.searchsorted(LENGTHS, tokens)  # the smallest bucket holding each row, by hand
  np.testing.assert_array_equal(batching.bucket_of(features, LENGTHS), want)
  batches = list(batching.train_batches(features, 4, seed=3, start_step=0, end_step=30, lengths=LENGTHS))
  per_epoch = sum(np.bincount(want, minlength=3) // 4)
  assert len(batches) == 30
  for batch in batches:
    length = batch["input_ids"].shape[1]
    assert length in LENGTHS and batch["attention_mask"].shape == (4, length)
    assert set(want[batch["row"]]) == {LENGTHS.index(length)}  # one bucket, the smallest holding every row
    np.testing.assert_array_equal(batch["input_ids"], features["input_ids"][batch["row"], :length])
  seen = np.concatenate([b["row"] for b in batches[:per_epoch]])
  assert len(set(seen)) == len(seen) == 4 * per_epoch  # an epoch's batches hold distinct rows
  resumed = list(batching.train_batches(features, 4, seed=3, start_step=7, end_step=30, lengths=LENGTHS))
  for a, b in zip(batches[7:], resumed):
    np.testing.assert_array_equal(a["row"], b["row"])
  with pytest.raises(UserError, match="no bucket holds"):
    next(batching.train_batches(features, 64, 0, 0, 1, LENGTHS))


@pytest.fixture(scope="module")
def setup():
  config = load_config("configs/glue.py:sst2", ["--config.data.max_seq_length=16", "--config.train.batch_size=8",
                                                "--config.train.eval_batch_size=8", "--config.train.epochs=1",
                                                "--config.head.dropout=0.0"])
  # Dropout off: its masks are drawn over the batch's shape, so a bucketed step draws other ones.
  model_cfg = heads.encoder_config(ModelConfig(**TINY, hidden_dropout=0.0, attention_dropout=0.0),
                                   "classification", "pooled")
  task = Task("t", "classification", 2, None, [], [], ("accuracy",))
  return trainer.build_train_setup(config, model_cfg, task, num_train=64)[0]


def test_bucketed_outputs_and_steps_equal_the_padded_ones(setup):
  features = _features(n=20, seed=1)
  features.pop("tokens")
  state = setup.init_state(jax.random.key(0))
  padded = batching.run_model(setup.eval_step, state.params, setup.mesh, features, 8)
  bucketed = batching.run_model(setup.eval_step, state.params, setup.mesh, features, 8, LENGTHS)
  np.testing.assert_allclose(bucketed["logits"], padded["logits"], atol=1e-5)
  assert np.abs(padded["logits"]).max() > 1e-3
  short = next(b for b in batching.train_batches(features, 8, 0, 0, 4, (8, 16)) if b["input_ids"].shape[1] == 8)
  full = {k: (np.pad(v, ((0, 0), (0, 8))) if v.ndim == 2 else v) for k, v in short.items()}
  results = []
  for batch in (short, full):
    new, metrics = setup.train_step(jax.tree.map(jax.numpy.copy, state), partitioning.global_batch(batch, setup.mesh),
                                    jax.random.key(1))
    results.append((float(metrics["loss"]), jax.device_get(new.params)))
  assert results[0][0] == pytest.approx(results[1][0], rel=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), results[0][1], results[1][1])
