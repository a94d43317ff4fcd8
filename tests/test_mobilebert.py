"""MobileBERT (models/mobilebert.py, models/records/mobilebert.py) against Hugging Face transformers' PyTorch
MobileBert* classes: tiny random models saved with save_pretrained, loaded with bert_jax.load_pretrained,
compared at the real tokens of a padded batch; exported back with `bert-jax convert --to hf` and loaded in
transformers again."""
import json
import shutil
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

import bert_jax
from bert_jax import cli, jobs, params_checkpoint, presets
from bert_jax.config_utils import load_config
from bert_jax.errors import UserError
from bert_jax.finetune import heads
from bert_jax.finetune.predict import Predictor
from bert_jax.models import families
from bert_jax.models.mobilebert import MobileBertConfig, MobileBertModel
from bert_jax.training import info, trainer
import data_fixtures
from core_helpers import slow

VOCAB, LENGTH = 99, 10
LENGTHS = np.array([[10], [6], [3]])


def _hf_config(**changes):
  sizes = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_size=48,
               embedding_size=16, intra_bottleneck_size=32, num_feedforward_networks=2, max_position_embeddings=40,
               hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
  return transformers.MobileBertConfig(**{**sizes, **changes})


def _randomised(model_class, config, seed=0):
  """A model with every parameter moved off its init (NoNorm's ones and zeros, the zero biases), so each
  one matters; seeded."""
  torch.manual_seed(seed)
  model = model_class(config)
  with torch.no_grad():
    for p in model.parameters():
      p.add_(torch.randn_like(p) * 0.1)
  return model.eval()


def _inputs():
  ids = np.random.RandomState(0).randint(1, VOCAB, (3, LENGTH))
  mask = (np.arange(LENGTH)[None] < LENGTHS).astype(np.int64)
  types = (np.arange(LENGTH)[None] >= 4).astype(np.int64) * mask
  return ids, mask, types


def _torch(model, ids, mask, types):
  with torch.no_grad():
    return model(torch.tensor(ids), attention_mask=torch.tensor(mask), token_type_ids=torch.tensor(types))


def _ours(model, params, ids, mask, types, **kwargs):
  return model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(types), **kwargs)


@pytest.mark.parametrize("changes,scan", [
    ({}, None),  # the paper's layer: NoNorm, ReLU, shared query/key bottleneck, trigram input
    pytest.param({"normalization_type": "layer_norm", "hidden_act": "gelu"}, False, marks=slow),
    pytest.param({"use_bottleneck_attention": True, "num_feedforward_networks": 3}, None, marks=slow),
])
def test_pretraining_logits_match_transformers(tmp_path, changes, scan):
  hf_model = _randomised(transformers.MobileBertForPreTraining, _hf_config(**changes))
  hf_model.save_pretrained(tmp_path)
  ids, mask, types = _inputs()
  expected = _torch(hf_model, ids, mask, types)

  model, params = bert_jax.load_pretrained(str(tmp_path), scan_layers=scan)
  assert isinstance(model, MobileBertModel) and model.config.scan_layers is (scan is not False)
  assert model.config.num_feedforward_networks == changes.get("num_feedforward_networks", 2)
  out = _ours(model, params, ids, mask, types)
  real = mask.astype(bool)
  reference = expected.prediction_logits.numpy()
  assert np.abs(reference[real]).max() > 1.0  # the random weights give logits far from zero
  np.testing.assert_allclose(np.asarray(out.mlm_logits)[real], reference[real], atol=1e-4, rtol=1e-5)
  np.testing.assert_allclose(out.nsp_logits, expected.seq_relationship_logits.numpy(), atol=1e-5, rtol=1e-5)


@slow  # weekly suite (BERT_JAX_SLOW_TESTS=1): the suite's 15 minutes; the family's HF-equality test stays
def test_hidden_states_and_attentions_match_the_bare_model(tmp_path):
  hf_model = _randomised(transformers.MobileBertModel, _hf_config(), seed=1)
  hf_model.save_pretrained(tmp_path)
  ids, mask, types = _inputs()
  with torch.no_grad():
    expected = hf_model(torch.tensor(ids), attention_mask=torch.tensor(mask), token_type_ids=torch.tensor(types),
                        output_hidden_states=True, output_attentions=True)
  model, params = bert_jax.load_pretrained(str(tmp_path))
  assert not model.config.mlm_head and model.config.sentence_head == "none" and model.config.use_pooler
  out = _ours(model, params, ids, mask, types, output_hidden_states=True, output_attentions=True)
  real = mask.astype(bool)
  for ours, theirs in zip(out.hidden_states, expected.hidden_states):
    np.testing.assert_allclose(np.asarray(ours)[real], theirs.numpy()[real], atol=1e-4, rtol=1e-5)
  for ours, theirs in zip(out.attentions, expected.attentions):  # [B, N, T, T], queries at real tokens
    np.testing.assert_allclose(np.asarray(ours)[real.nonzero()[0], :, real.nonzero()[1]],
                               theirs.numpy()[real.nonzero()[0], :, real.nonzero()[1]], atol=1e-5)
  np.testing.assert_allclose(out.pooled_output, expected.pooler_output.numpy(), atol=1e-5)


def test_trigram_embedding_is_the_next_own_and_previous_token_projected():
  """The embedding before positions: W [x_{t+1}; x_t; x_{t-1}] + b with zeros past the ends (NumPy)."""
  config = MobileBertConfig(vocab_size=VOCAB, hidden_size=8, num_layers=1, num_heads=2, intermediate_size=8,
                            embedding_size=4, intra_bottleneck_size=4, num_feedforward_networks=1,
                            max_position_embeddings=16, mlm_head=False, sentence_head="none", use_pooler=False)
  model = MobileBertModel(config)
  ids = jnp.asarray([[5, 7, 9, 11]])
  params = jax.tree.map(np.asarray, nn.meta.unbox(jax.jit(model.init)(jax.random.key(0), ids)["params"]))
  emb = params["embeddings"]
  emb["position_embeddings"]["embedding"] = np.zeros_like(emb["position_embeddings"]["embedding"])
  emb["token_type_embeddings"]["embedding"] = np.zeros_like(emb["token_type_embeddings"]["embedding"])
  emb["norm"]["bias"] = np.zeros(8, np.float32)
  out = jax.jit(lambda p: model.apply({"params": p}, ids, output_hidden_states=True))(params)
  words = emb["word_embeddings"]["embedding"][np.asarray(ids[0])]
  padded = np.concatenate([np.zeros((1, 4)), words, np.zeros((1, 4))])
  trigram = np.concatenate([padded[2:], padded[1:-1], padded[:-2]], axis=-1)
  projected = trigram @ emb["transformation"]["kernel"] + emb["transformation"]["bias"]
  np.testing.assert_allclose(out.hidden_states[0, 0], projected * emb["norm"]["scale"], atol=1e-5)


@slow  # weekly suite (BERT_JAX_SLOW_TESTS=1): the suite's 15 minutes; the family's HF-equality test stays
def test_convert_to_hf_round_trip_loads_in_transformers(tmp_path, capsys):
  hf_model = _randomised(transformers.MobileBertForPreTraining, _hf_config(), seed=2)
  hf_model.save_pretrained(tmp_path / "hf")
  assert cli.main(["convert", "--from", "hf", str(tmp_path / "hf"), str(tmp_path / "ours")]) == 0
  saved = json.loads((tmp_path / "ours" / "config.json").read_text())
  assert saved["model"]["family"] == "mobilebert" and saved["heads"] == ["pooler", "mlm", "sentence"]
  assert cli.main(["convert", "--to", "hf", str(tmp_path / "ours"), str(tmp_path / "back")]) == 0
  assert "not written" not in capsys.readouterr().out
  written = json.loads((tmp_path / "back" / "config.json").read_text())
  assert written["architectures"] == ["MobileBertForPreTraining"] and written["num_feedforward_networks"] == 2
  back = transformers.MobileBertForPreTraining.from_pretrained(tmp_path / "back").eval()
  ids, mask, types = _inputs()
  expected, got = _torch(hf_model, ids, mask, types), _torch(back, ids, mask, types)
  real = mask.astype(bool)
  np.testing.assert_allclose(got.prediction_logits.numpy()[real], expected.prediction_logits.numpy()[real],
                             atol=1e-5, rtol=1e-6)
  np.testing.assert_allclose(got.seq_relationship_logits.numpy(), expected.seq_relationship_logits.numpy(),
                             atol=1e-6)


def test_config_errors_name_the_field():
  with pytest.raises(UserError, match="model.normalization_type='batch_norm'"):
    MobileBertConfig(normalization_type="batch_norm")
  with pytest.raises(UserError, match="num_heads=3 must divide the attention's width 128"):
    MobileBertConfig(num_heads=3)
  assert families.model_config(MobileBertConfig().to_dict()) == MobileBertConfig()


def test_base_preset_has_the_published_size_and_transformers_count():
  """configs/mobilebert.py:base's backbone (embeddings, encoder, pooler): the paper's 25.3M within 4%, and
  exactly transformers' MobileBertModel of google/mobilebert-uncased's config (torch's meta device)."""
  config = load_config("configs/mobilebert.py:base")
  counted = presets.backbone_params(config.model)
  assert abs(counted / 25.3e6 - 1) < 0.04, counted
  with torch.device("meta"):
    hf_model = transformers.MobileBertModel(transformers.MobileBertConfig())
  assert counted == sum(p.numel() for p in hf_model.parameters())


def test_tiny_preset_builds_through_the_pretraining_objective():
  """`bert-jax info`'s count of the tiny preset (the objective's backbone) is the presets table's."""
  config = load_config("configs/mobilebert.py:tiny")
  built = jobs.with_step(config, "configs/mobilebert.py:tiny", "info").step(config, None)
  assert presets.backbone_params(config.model) == info.model_info(*built)["num_params"]


@slow  # ~1 min of CPU, mostly compiling (BERT_JAX_SLOW_TESTS=1)
def test_tiny_pretraining_loss_falls(tmp_path):
  """MLM + NSP on the embedded corpus: 40 small steps (LAMB moves small weights by lr x their norm: a
  larger rate, as ALBERT's tiny test)."""
  config = load_config("configs/mobilebert.py:tiny", [
      "--config.train.batch_size=16", "--config.data.max_seq_length=64", "--config.train.num_steps=40",
      "--config.train.log_every_steps=5", "--config.train.eval_every_steps=0", "--config.checkpoint.every_steps=1000",
      "--config.checkpoint.async_save=False", "--config.data.num_shards=4", "--config.optimizer.warmup_steps=5",
      "--config.optimizer.learning_rate=2e-2"])
  trainer.pretrain(config, str(tmp_path))
  rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  losses = [r["loss"] for r in rows if "loss" in r]
  assert losses[-1] < losses[0] - 0.4, losses
  assert "nsp_loss" in rows[-1] or any("nsp_loss" in r for r in rows)


TINY = MobileBertConfig(vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=24,
                        embedding_size=8, intra_bottleneck_size=16, num_feedforward_networks=2,
                        max_position_embeddings=40, hidden_dropout=0.0, attention_dropout=0.0)
HF_CLASSES = {"classification": "MobileBertForSequenceClassification", "token": "MobileBertForTokenClassification",
              "span": "MobileBertForQuestionAnswering"}


def _fine_tuned(directory, kind, labels):
  """A `bert-jax finetune` workdir with random weights (NoNorm scales near 1, every bias nonzero)."""
  config = heads.encoder_config(TINY, kind, "pooled")
  model = heads.FinetuneModel(config, kind, 2 if kind == "span" else len(labels))
  ids = jnp.ones((1, LENGTH), jnp.int32)
  abstract = nn.meta.unbox(jax.eval_shape(model.init, jax.random.key(0), ids, ids, ids * 0)["params"])
  rng = np.random.default_rng(0)
  params = jax.tree_util.tree_map_with_path(
      lambda path, x: (jax.tree_util.keystr(path).endswith("['scale']") + 0.1 * rng.standard_normal(x.shape))
      .astype(np.float32), abstract)
  saved = {"model": config.to_dict(), "head": {"pooling": "pooled", "dropout": 0.1},
           "task": {"family": "test", "name": f"mobilebert_{kind}", "head": kind, "num_labels": len(labels) or 2,
                    "labels": list(labels)},
           "data": {"max_seq_length": LENGTH}, "train": {"eval_batch_size": 4}}
  params_checkpoint.save_params(str(directory), params, saved)
  return saved, params


@slow  # weekly suite (BERT_JAX_SLOW_TESTS=1): the suite's 15 minutes; the family's HF-equality test stays
@pytest.mark.parametrize("kind,labels", [("classification", ("neg", "pos", "mixed")), ("token", ("O", "B", "I")),
                                         ("span", ())])
def test_fine_tuned_heads_export_to_transformers_task_classes(tmp_path, capsys, kind, labels):
  saved, params = _fine_tuned(tmp_path / "ft", kind, labels)
  assert ("pooler" in params) == (kind == "classification")  # the family's summary: BERT's pooler
  assert cli.main(["convert", "--to", "hf", str(tmp_path / "ft"), str(tmp_path / "hf")]) == 0
  assert "not written" not in capsys.readouterr().out
  hf_model = getattr(transformers, HF_CLASSES[kind]).from_pretrained(tmp_path / "hf").eval()
  ids, mask, types = _inputs()
  rows = {"input_ids": ids.astype(np.int32), "attention_mask": mask.astype(np.int32),
          "token_type_ids": types.astype(np.int32)}
  ours = Predictor.build(saved, params, tokenizer=None).run(rows)
  theirs = _torch(hf_model, ids, mask, types)
  real = mask.astype(bool)
  for key in ("start_logits", "end_logits") if kind == "span" else ("logits",):
    got, want = ours[key], getattr(theirs, key).numpy()
    got, want = (got, want) if kind == "classification" else (got[real], want[real])
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert np.abs(want).max() > 0.05


@slow  # fine-tuning end to end, ~1 min of CPU (BERT_JAX_SLOW_TESTS=1)
def test_fine_tunes_from_a_transformers_checkpoint_and_exports_what_predict_says(tmp_path, capsys):
  """A tiny transformers MobileBertModel with the embedded vocabulary -> convert -> finetune on SST-2 whose label
  is each sentence's first word -> the dev accuracy rises well above chance; the HF export through
  transformers' pipeline gives `bert-jax predict`'s labels and scores."""
  vocab = data_fixtures.embedded_paths()[1]
  torch.manual_seed(0)
  hf_config = _hf_config(vocab_size=len(open(vocab, encoding="utf-8").read().splitlines()), hidden_size=32,
                         num_hidden_layers=2, num_attention_heads=2, intra_bottleneck_size=16, embedding_size=8,
                         max_position_embeddings=64)
  transformers.MobileBertModel(hf_config).save_pretrained(tmp_path / "hf_base")
  shutil.copyfile(vocab, tmp_path / "hf_base" / "vocab.txt")
  (tmp_path / "hf_base" / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
  assert cli.main(["convert", "--from", "hf", str(tmp_path / "hf_base"), str(tmp_path / "base")]) == 0
  data = data_fixtures.write_first_word_sst2(tmp_path / "data")
  assert cli.main(["finetune", "--config", "configs/glue.py:sst2", "--workdir", str(tmp_path / "run"),
                   f"--config.init_from={tmp_path / 'base'}", f"--config.data.data_dir={data}",
                   "--config.data.max_seq_length=32", "--config.train.batch_size=16", "--config.train.epochs=4",
                   "--config.train.log_every_steps=8", "--config.optimizer.learning_rate=1e-2"]) == 0
  assert json.loads((tmp_path / "run" / "eval_results.json").read_text())["accuracy"] >= 0.75
  sentences = [line.split("\t")[0] for line in (Path(data) / "dev.tsv").read_text().splitlines()[1:]]
  (tmp_path / "dev.txt").write_text("".join(s + "\n" for s in sentences))
  assert cli.main(["predict", "--model", str(tmp_path / "run"), "--input", str(tmp_path / "dev.txt"),
                   "--output", str(tmp_path / "dev.jsonl")]) == 0
  ours = [json.loads(line) for line in (tmp_path / "dev.jsonl").read_text().splitlines()]
  assert cli.main(["convert", "--to", "hf", str(tmp_path / "run"), str(tmp_path / "hf")]) == 0
  assert json.loads((tmp_path / "hf" / "config.json").read_text())["architectures"] == [
      "MobileBertForSequenceClassification"]
  capsys.readouterr()
  theirs = transformers.pipeline("text-classification", model=str(tmp_path / "hf"), device="cpu")(sentences,
                                                                                                   truncation=True)
  assert [r["label"] for r in theirs] == [r["label"] for r in ours]
  np.testing.assert_allclose([r["score"] for r in theirs], [r["score"] for r in ours], atol=1e-5)
