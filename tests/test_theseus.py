"""BERT-of-Theseus (compress/theseus.py): the curriculum, the mixed model against models assembled by hand
from the predecessor's and successor's layers, gradients only where a module was replaced, and the job end to
end (behind BERT_JAX_SLOW_TESTS)."""
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from bert_jax import cli
from bert_jax.compress import theseus
from bert_jax.compress.distill import InnerModel
from bert_jax.compress.teacher import take_layers
from bert_jax.errors import UserError
from bert_jax.finetune import heads
from bert_jax.models.config import ModelConfig
import data_fixtures
from core_helpers import slow

TEACHER = ModelConfig(vocab_size=50, hidden_size=16, num_layers=4, num_heads=2, intermediate_size=20,
                      max_position_embeddings=32, hidden_dropout=0.0, attention_dropout=0.0, scan_layers=True)
CFG = ml_collections.ConfigDict({"modules": 2, "replace_rate": 0.3, "curriculum_fraction": 0.5})


def _model(config):
  return InnerModel(heads.encoder_config(config, "classification", "pooled"), "classification", 3, "pooled", 0.0)


def _batch():
  rng = np.random.RandomState(0)
  mask = (np.arange(8)[None] < np.array([[8], [5], [3]])).astype(np.int32)
  return {"input_ids": jnp.asarray(rng.randint(1, 50, (3, 8)) * mask), "attention_mask": jnp.asarray(mask),
          "token_type_ids": jnp.zeros((3, 8), jnp.int32), "label": jnp.asarray([0, 2, 1])}


def _logits(config, params, batch):
  apply = jax.jit(_model(config).apply)  # jitted: one compile instead of an op-by-op dispatch
  return apply({"params": params}, batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])["logits"]


@pytest.fixture(scope="module")
def predecessor():
  batch = _batch()
  params = jax.jit(_model(TEACHER).init)(jax.random.key(0), batch["input_ids"], batch["attention_mask"],
                                         batch["token_type_ids"])["params"]
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda x: np.asarray(x) + 0.3 * rng.standard_normal(x.shape).astype(np.float32),
                        nn.meta.unbox(params))
  return params


def test_the_curriculum_is_linear_from_the_base_rate_to_one():
  steps = jnp.asarray([0, 50, 100, 150])
  np.testing.assert_allclose(theseus.replace_rate(steps, 0.3, 100), [0.3, 0.65, 1.0, 1.0], atol=1e-6)


@pytest.mark.parametrize("replace", [(1, 1), (0, 0), (1, 0), (0, 1)])
def test_each_module_is_the_successor_layer_or_the_predecessor_layers(predecessor, replace):
  """The mix equals a plain BertModel assembled by hand: successor layer i for a replaced module i, else the
  predecessor's layers 2i and 2i + 1; the successor starts as the predecessor's first two layers, whose
  embeddings, pooler and classifier it shares."""
  student_config = TEACHER.replace(num_layers=2)
  successor = take_layers(predecessor, TEACHER, (0, 1))
  successor["encoder"]["layers"] = jax.tree.map(lambda x: x + 0.1, successor["encoder"]["layers"])  # moved on
  objective = theseus.TheseusObjective(CFG, _model(student_config), _model(TEACHER).config, 10)
  batch = _batch()
  mixed = jax.jit(lambda s, t, r: objective.mixed_logits(s, t, batch, r, None, True))(
      successor, predecessor, jnp.asarray(replace, bool))
  parts = []
  for i, r in enumerate(replace):
    parts += [("s", i)] if r else [("t", 2 * i), ("t", 2 * i + 1)]
  stacked = {"s": successor["encoder"]["layers"], "t": predecessor["encoder"]["layers"]}
  assembled = {**successor, "encoder": {"layers": jax.tree.map(
      lambda s, t: jnp.stack([(s if w == "s" else t)[j] for w, j in parts]), stacked["s"], stacked["t"])}}
  reference = _logits(TEACHER.replace(num_layers=len(parts)), assembled, batch)
  np.testing.assert_allclose(mixed, reference, atol=1e-5)
  assert np.abs(reference).max() > 0.1


@slow  # weekly suite (BERT_JAX_SLOW_TESTS=1): the suite's 15 minutes; the family's HF-equality test stays
def test_gradients_reach_only_the_successor_layers_in_use(predecessor):
  student_config = TEACHER.replace(num_layers=2)
  successor = take_layers(predecessor, TEACHER, (0, 1))
  objective = theseus.TheseusObjective(CFG, _model(student_config), _model(TEACHER).config, 10)
  batch = _batch()

  def loss(params):
    logits = objective.mixed_logits(params, predecessor, batch, jnp.asarray([True, False]), None, True)
    return jnp.sum(logits ** 2)
  grads = jax.jit(jax.grad(loss))(successor)
  layer = grads["encoder"]["layers"]["attention"]["query"]["kernel"]
  assert np.abs(layer[0]).max() > 0 and np.abs(layer[1]).max() == 0  # module 1 ran the predecessor's layers
  assert np.abs(grads["embeddings"]["word_embeddings"]["embedding"]).max() > 0


def test_modules_must_divide_the_predecessor():
  with pytest.raises(UserError, match="distill.modules=3 must divide the predecessor's 4 layers"):
    theseus.validate(ml_collections.ConfigDict({**CFG.to_dict(), "modules": 3}), TEACHER)
  assert theseus.validate(ml_collections.ConfigDict({**CFG.to_dict(), "modules": 0}), TEACHER) == 2


@slow  # two short runs, ~2 min of CPU (BERT_JAX_SLOW_TESTS=1)
def test_theseus_job_compresses_a_fine_tuned_model_into_a_workdir_predict_takes(tmp_path, capsys):
  data = data_fixtures.write_first_word_sst2(tmp_path / "data")
  tiny = ["--config.model.num_layers=4", "--config.model.hidden_size=32", "--config.model.num_heads=2",
          "--config.model.intermediate_size=64", "--config.model.max_position_embeddings=32",
          "--config.data.max_seq_length=32", "--config.train.batch_size=16", "--config.train.log_every_steps=8",
          f"--config.data.data_dir={data}", "--config.optimizer.learning_rate=1e-2"]
  assert cli.main(["finetune", "--config", "configs/glue.py:sst2", "--workdir", str(tmp_path / "teacher"),
                   *tiny]) == 0
  assert cli.main(["distill", "--config", "configs/distill.py:theseus", "--workdir", str(tmp_path / "theseus"),
                   f"--config.distill.teacher={tmp_path / 'teacher'}", *tiny[5:], "--config.train.epochs=4"]) == 0
  out = capsys.readouterr().out
  saved = json.loads((tmp_path / "theseus" / "config.json").read_text())
  assert saved["model"]["num_layers"] == 2
  rates = [json.loads(line).get("replace_rate") for line in
           (tmp_path / "theseus" / "metrics.jsonl").read_text().splitlines()]
  rates = [r for r in rates if r is not None]
  assert rates[0] < 0.6 and rates[-1] == 1.0, rates
  teacher_accuracy = json.loads((tmp_path / "teacher" / "eval_results.json").read_text())["accuracy"]
  accuracy = json.loads((tmp_path / "theseus" / "eval_results.json").read_text())["accuracy"]
  assert accuracy >= min(teacher_accuracy, 0.9) - 0.15, (accuracy, teacher_accuracy, out)
  (tmp_path / "dev.txt").write_text("true it is\nfalse it is not\n")
  assert cli.main(["predict", "--model", str(tmp_path / "theseus"), "--input", str(tmp_path / "dev.txt"),
                   "--output", str(tmp_path / "p.jsonl")]) == 0
