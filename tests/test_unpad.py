"""Unpadding (bert_jax/models/unpad.py): a padded batch's real tokens packed into fewer rows on the host and
restored after the encoder. The packing against hand counts; fine-tuning heads on BERT (absolute and RoBERTa
positions) and ModernBERT (local windows) packed against the same padded batch (1e-5, rows in order); the
evaluation/predict path (finetune/batching.run_model) with data.unpad on and off."""
import importlib
import inspect

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from bert_jax.cli import main
from bert_jax.config_utils import load_config
from bert_jax.errors import UserError
from bert_jax.finetune import batching, heads
from bert_jax.finetune.objective import FinetuneObjective
from bert_jax.models import ModelConfig, families, unpad
from bert_jax.models.modernbert import ModernBertConfig
from bert_jax.models.xlnet import XLNetConfig
from bert_jax.training import partitioning


def _batch(lengths, width, seed=0, vocab=64):
  rng = np.random.default_rng(seed)
  mask = (np.arange(width)[None] < np.asarray(lengths)[:, None]).astype(np.int32)
  ids = rng.integers(5, vocab, (len(lengths), width)).astype(np.int32) * mask
  types = (rng.integers(0, 2, (len(lengths), width)) * mask).astype(np.int32)
  return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def test_pack_lays_rows_end_to_end_longest_first():
  batch = _batch([5, 3, 8, 2, 0, 6], 8)
  packed = unpad.pack(batch, ModelConfig(), unit=1)
  # longest first, first fit: 8 fills row 0; 6 opens row 1 and 2 joins it; 5 opens row 2, 3 joins it
  assert packed["input_ids"].shape == (3, 8)
  np.testing.assert_array_equal(packed["document_ids"], [[1] * 8, [1] * 6 + [2] * 2, [1] * 5 + [2] * 3])
  np.testing.assert_array_equal(packed["position_ids"][1], [0, 1, 2, 3, 4, 5, 0, 1])
  np.testing.assert_array_equal(packed["input_ids"][2], np.concatenate([batch["input_ids"][0, :5],
                                                                        batch["input_ids"][1, :3]]))
  index = packed["unpad_index"]
  assert index[4].tolist() == [24] * 8 and index[3, :2].tolist() == [14, 15] and index[3, 2:].tolist() == [24] * 6
  flat = np.concatenate([packed["token_type_ids"].reshape(-1), [0]])
  np.testing.assert_array_equal(flat[index], batch["token_type_ids"])
  roberta = unpad.pack(batch, ModelConfig(position_style="roberta", pad_token_id=1), unit=1)
  np.testing.assert_array_equal(roberta["position_ids"][1], [2, 3, 4, 5, 6, 7, 2, 3])
  assert unpad.pack(batch, ModelConfig())["input_ids"].shape == (3, 8)  # unit: an eighth of 6 rows is 1
  assert unpad.pack(batch, ModelConfig(), unit=4)["input_ids"].shape == (4, 8)
  assert unpad.row_count(7, 6, 4) == 8 and unpad.default_unit(64, 8) == 8 and unpad.default_unit(64, 3) == 9
  two_hosts = unpad.pack(batch, ModelConfig(), unit=1, process_index=1, process_count=2)
  assert two_hosts["unpad_index"][3, 0] == (3 + 1) * 8 + 6 and two_hosts["unpad_index"][4, 0] == 48


CONFIGS = {
    "bert": ModelConfig(vocab_size=64, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32,
                        max_position_embeddings=40, hidden_dropout=0.0, attention_dropout=0.0),
    "roberta positions": ModelConfig(vocab_size=64, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32,
                                     max_position_embeddings=44, hidden_dropout=0.0, attention_dropout=0.0,
                                     position_style="roberta", pad_token_id=1, type_vocab_size=2),
    "modernbert": ModernBertConfig(vocab_size=64, hidden_size=16, num_layers=3, num_heads=2, intermediate_size=24,
                                   global_every=3, local_window=4, pad_token_id=0, max_position_embeddings=40,
                                   pooling="mean"),
}


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("kind,pooling", [("classification", "pooled"), ("token", "pooled"),
                                          ("classification", "layer_mix")])
def test_packed_batches_give_the_padded_outputs(name, kind, pooling):
  if pooling == "layer_mix" and name != "modernbert":
    pytest.skip("layer_mix (every layer restored) once is enough")
  config = CONFIGS[name]
  model = heads.FinetuneModel(heads.encoder_config(config, kind, pooling), kind, 3, pooling)
  batch = _batch([12, 3, 20, 7, 20, 1, 9, 16], 20, seed=1)
  params = model.init(jax.random.key(0), *(jnp.asarray(batch[k]) for k in ("input_ids", "attention_mask",
                                                                           "token_type_ids")))["params"]
  params = jax.tree.map(lambda p: p + 0.05 * jax.random.normal(jax.random.key(1), p.shape, p.dtype), params)
  objective = FinetuneObjective(model)
  packed = unpad.pack(batch, config, unit=1)
  assert packed["input_ids"].shape[0] == 5  # 20, 20, 16+3+1, 12+7, 9
  want = jax.jit(objective.apply)(params, {k: jnp.asarray(v) for k, v in batch.items()})
  got = jax.jit(objective.apply)(params, {k: jnp.asarray(v) for k, v in packed.items()})
  assert set(got) == set(want)
  for key, value in want.items():
    if value.ndim == 3:  # token logits: the real tokens' (the padding's are undefined in the padded run)
      real = batch["attention_mask"] > 0
      np.testing.assert_allclose(np.asarray(got[key])[real], np.asarray(value)[real], atol=1e-5, rtol=0)
    else:
      np.testing.assert_allclose(np.asarray(got[key]), np.asarray(value), atol=1e-5, rtol=0)


def test_run_model_unpads_where_data_unpad_says(monkeypatch):
  """finetune/batching.run_model (fine-tuning evaluation, predict): the same outputs in the same order with
  data.unpad on and off, and the model sees fewer rows on; a family that cannot restore rows runs padded."""
  config = CONFIGS["modernbert"]
  model = heads.FinetuneModel(heads.encoder_config(config, "classification", "pooled"), "classification", 2)
  lengths = [3, 18, 5, 2, 20, 4, 7, 1, 11, 6, 9]
  features = _batch(lengths, 20, seed=2)
  params = model.init(jax.random.key(0), *(jnp.asarray(features[k]) for k in ("input_ids", "attention_mask",
                                                                              "token_type_ids")))["params"]
  seen = []
  objective = FinetuneObjective(model)
  forward = jax.jit(objective.apply)

  def apply(p, batch):
    seen.append(batch["input_ids"].shape)
    return forward(p, batch)
  mesh = partitioning.make_mesh(ml_collections.ConfigDict({"data": 1, "fsdp": 1, "tensor": 1}), jax.local_devices()[:1])
  on = batching.unpad_config({"unpad": True}, model.config)
  assert on is model.config and batching.unpad_config({"unpad": False}, model.config) is None
  assert batching.unpad_config({}, model.config) is model.config
  padded = batching.run_model(apply, params, mesh, features, 8, (), None)
  assert seen == [(8, 20), (8, 20)]
  seen.clear()
  packed = batching.run_model(apply, params, mesh, features, 8, (), on)
  assert [s[0] for s in seen] == [3, 2]  # 20+18+... of 8 rows in 3, then 3 rows (filler rows dropped) in 2
  np.testing.assert_allclose(packed["logits"], padded["logits"], atol=1e-5, rtol=0)
  assert packed["logits"].shape == (len(lengths), 2)
  assert batching.unpad_config({"unpad": True}, ModelConfig(entity_layers=1)) is None
  assert batching.unpad_config({"unpad": True}, XLNetConfig()) is None


def test_each_family_record_says_whether_its_encoder_unpads():
  """The record's hook (models/families.py: unpad_refusal) agrees with the module: '' exactly where its
  __call__ takes unpad_index; ERNIE-THU's entity layers refuse inside BertModel's families."""
  for family in families.all_families():
    config = family.config()
    takes = unpad.INDEX in inspect.signature(type(family.module(config)).__call__).parameters
    assert (family.unpad_refusal(config) == "") == takes, family.name
  assert families.get("bert").unpad_refusal(ModelConfig(entity_layers=1)) == (
      "ERNIE-THU's entity layers read each padded token")


def test_data_unpad_on_a_family_that_cannot_is_one_line_before_the_workdir(capsys, tmp_path):
  """data.unpad=true with config.model of a family whose encoder reads padded rows: one line, exit 2, no
  workdir; no preset in configs/ is refused; BERT's and ModernBERT's families still unpad."""
  workdir = tmp_path / "w"
  assert main(["distill", "--config", "configs/distill.py:mobilebert", "--config.data.unpad=true",
               "--workdir", str(workdir)]) == 2
  assert capsys.readouterr().err.strip() == (
      "bert-jax distill: error: data.unpad: the mobilebert family cannot run a batch's real tokens packed into "
      "fewer rows (its encoder takes no unpad_index); set --config.data.unpad=false")
  assert not workdir.exists()
  for spec in (f"configs/{name}.py:{preset}" for name in ("glue", "squad", "ner", "distill")
               for preset in importlib.import_module(f"bert_jax.configs.{name}").PRESETS):
    batching.check_unpad(load_config(spec))
  config = load_config("configs/glue.py:embedded")
  assert config.data.unpad and config.model.family in ("", "bert")
  batching.check_unpad(config)
  config.model = ml_collections.ConfigDict(CONFIGS["modernbert"].to_dict())
  batching.check_unpad(config)
  assert batching.unpad_config(config.data, CONFIGS["modernbert"]) is CONFIGS["modernbert"]
  config.model = load_config("configs/ernie_thu.py:tiny").model
  with pytest.raises(UserError, match=r"^data.unpad: the bert family .* \(ERNIE-THU's entity layers read each "
                     r"padded token\); set --config.data.unpad=false$"):
    batching.check_unpad(config)
  config.data.unpad = False
  batching.check_unpad(config)
