"""Checkpoints that other commands read (init_from, a teacher, embed's and predict's --model): one of
another family than the run's model, or one holding no weights of it, is one line and exit 2, as is a
damaged one (arrays cut short, _METADATA removed, NaN), whichever command reads it, before it writes
anything; a checkpoint that fills only part of the model says how many tensors loaded and which start fresh.
The checkpoints are tiny params checkpoints written with save_params (shapes of the real models, zeros)."""
import os
import shutil

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

import bert_jax
from bert_jax import params_checkpoint, pretrained
from bert_jax.cli import main
from bert_jax.errors import UserError
from bert_jax.finetune import heads
from bert_jax.models import families
from bert_jax.models.config import ModelConfig
from bert_jax.models.modernbert import ModernBertConfig
from bert_jax.models.xlnet import XLNetConfig

import data_fixtures

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZES = dict(vocab_size=8192, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
             max_position_embeddings=64)
# A pretraining run of the checkpoints' sizes: before, its tensors whose names agree loaded into another family.
TINY_RUN = [*(f"--config.model.{k}={v}" for k, v in SIZES.items()), "--config.data.max_seq_length=32",
            "--config.data.max_predictions_per_seq=5", "--config.train.batch_size=8", "--config.train.num_steps=1",
            "--config.train.eval_every_steps=0", "--config.train.tensorboard=false"]
BERT = ModelConfig(**SIZES, mlm_head=True)
MODERNBERT = ModernBertConfig(**SIZES, global_every=1, local_window=8, pad_token_id=0)
XLNET = XLNetConfig(**SIZES)
DATA = {"vocab": "vocab.txt", "tokenizer": "wordpiece", "lower_case": True}


def _zeros(module, *inputs):
  """The module's params as zeros (eval_shape: nothing runs)."""
  shapes = jax.eval_shape(lambda: module.init(jax.random.key(0), *inputs)["params"])
  return jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), nn.meta.unbox(shapes))


def _write(directory, model_config, params=None, **config):
  """A params checkpoint of `model_config` (its encoder's params, zeros, unless given) with the embedded vocabulary."""
  ids = jnp.ones((1, 4), jnp.int32)
  params = _zeros(families.build(model_config), ids) if params is None else params
  params_checkpoint.save_params(directory, params, {"objective": "bert", "model": model_config.to_dict(),
                                                    "data": DATA, **config},
                                {"vocab.txt": data_fixtures.embedded_paths()[1]})
  return str(directory)


def _damage(directory, how):
  """The damage of issue 49's fault campaign, done to a copy."""
  params = os.path.join(directory, "params")
  if how == "truncated":
    for root, _, files in os.walk(params):
      for name in files if os.path.basename(root) == "d" else ():  # the array files
        with open(os.path.join(root, name), "r+b") as f:
          f.truncate(10)
  elif how == "no _METADATA":
    os.remove(os.path.join(params, "_METADATA"))
  elif how == "files missing":
    for name in os.listdir(params):
      if name != "_METADATA":
        path = os.path.join(params, name)
        shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
  return directory


def _nan(params):
  leaves, tree = jax.tree.flatten(params)
  leaves[0] = np.full(leaves[0].shape, np.nan, leaves[0].dtype)
  return jax.tree.unflatten(tree, leaves)


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
  return _write(tmp_path_factory.mktemp("bert") / "ckpt", BERT)


@pytest.fixture(scope="module")
def modernbert(tmp_path_factory):
  return _write(tmp_path_factory.mktemp("modernbert") / "ckpt", MODERNBERT)


@pytest.fixture(scope="module")
def xlnet(tmp_path_factory):
  return _write(tmp_path_factory.mktemp("xlnet") / "ckpt", XLNET)


def _damaged(source, tmp_path, how):
  """A damaged copy of the checkpoint at `source` (NaN: written again with one tensor NaN)."""
  target = tmp_path / "damaged"
  if how == "NaN":
    params, config = params_checkpoint.load_params(source)
    params_checkpoint.save_params(target, _nan(params), config, {"vocab.txt": data_fixtures.embedded_paths()[1]})
    return str(target)
  shutil.copytree(source, target)
  return _damage(str(target), how)


def one_error_line(capsys, argv):
  """Runs the CLI; asserts exit 2 and exactly one stderr line; returns that line."""
  capsys.readouterr()
  assert main(argv) == 2
  lines = capsys.readouterr().err.strip().splitlines()
  assert len(lines) == 1, lines
  assert lines[0].startswith(f"bert-jax {argv[0]}: error: "), lines
  return lines[0]


PRETRAIN = ["pretrain", "--config", os.path.join(ROOT, "configs/bert.py:demo")]
FINETUNE = ["finetune", "--config", os.path.join(ROOT, "configs/glue.py:embedded")]


# Another family

@pytest.mark.parametrize("config, source, theirs, ours", [
    ("configs/bert.py:demo", "modernbert", "modernbert", "bert"),
    ("configs/modernbert.py:tiny", "xlnet", "xlnet", "modernbert"),
    ("configs/modernbert.py:tiny", "bert", "bert", "modernbert")])
def test_pretraining_from_another_family_is_one_line_and_writes_nothing(request, tmp_path, capsys, config, source,
                                                                          theirs, ours):
  """Before: "no weights for [...]; those start from a fresh init", "initialised from ...", and a run from random
  weights (or, ModernBERT into BERT, the embeddings whose names agree loaded), exit 0."""
  location = request.getfixturevalue(source)
  line = one_error_line(capsys, ["pretrain", "--config", os.path.join(ROOT, config), "--workdir",
                                 str(tmp_path / "run"), f"--config.init_from={location}", *TINY_RUN])
  assert f"init_from: {location} holds a model of family {theirs!r}, and this run trains one of family {ours!r}" in line
  assert not (tmp_path / "run").exists()


def test_general_distillation_from_another_family_is_one_line(tmp_path, capsys, bert, modernbert):
  line = one_error_line(capsys, ["distill", "--config", os.path.join(ROOT, "configs/distill.py:general-tiny"),
                                 "--workdir", str(tmp_path / "run"), f"--config.distill.teacher={bert}",
                                 f"--config.init_from={modernbert}"])
  assert (f"init_from: {modernbert} holds a model of family 'modernbert', and this run trains one of family "
          "'bert'") in line, line
  assert not (tmp_path / "run").exists()


def test_fine_tuning_takes_the_checkpoints_family_unless_the_run_names_another(tmp_path, capsys, bert):
  line = one_error_line(capsys, [*FINETUNE, "--workdir", str(tmp_path / "run"), f"--config.init_from={bert}",
                                 "--config.model.family=modernbert"])
  assert line.endswith(f"init_from: {bert} holds a model of family 'bert', and model.family='modernbert': this job "
                       "takes init_from's architecture; leave model.family empty, or give a checkpoint of that family")
  assert not (tmp_path / "run").exists()


def _config(job, model, family=""):
  return ml_collections.ConfigDict({"job": job, "init_from": "ckpt", "model": {**model.to_dict(), "family": family}})


def test_the_family_check_keeps_the_inits_of_one_layout():
  """CamemBERT and XLM-R are RoBERTa's layout; a fine-tuning run takes whatever family init_from holds
  (ELECTRA's discriminator, ModernBERT) unless it names another."""
  roberta = ModelConfig(**SIZES, position_style="roberta", pad_token_id=1)
  camembert = roberta.replace(family="camembert")
  pretrained.check_family(_config("pretrain", roberta), camembert, "ckpt")
  pretrained.check_family(_config("pretrain", camembert, "camembert"), roberta.replace(family="xlm-roberta"), "ckpt")
  pretrained.check_family(_config("pretrain", BERT.replace(num_layers=2)), BERT, "ckpt")  # grown, stacked
  electra = BERT.replace(rtd_head=True, mlm_head=False)
  for saved in (electra, MODERNBERT, XLNET):
    pretrained.check_family(_config("finetune", BERT), saved, "ckpt")
    pretrained.check_family(_config("sbert", BERT), saved, "ckpt")
  pretrained.check_family(_config("finetune", BERT, "camembert"), roberta.replace(family="camembert"), "ckpt")
  with pytest.raises(UserError, match="holds a model of family 'electra', and this run trains one of family 'bert'"):
    pretrained.check_family(_config("pretrain", BERT), electra, "ckpt")
  with pytest.raises(UserError, match="holds a model of family 'roberta', and model.family='bert'"):
    pretrained.check_family(_config("finetune", BERT, "bert"), roberta, "ckpt")


# Weights that fill none or part of the model

def test_a_checkpoint_holding_none_of_the_models_tensors_is_an_error(tmp_path):
  location = _write(tmp_path / "other", BERT, params={"dense": {"kernel": np.ones((2, 2), np.float32)}})
  target = _zeros(families.build(BERT), jnp.ones((1, 4), jnp.int32))
  with pytest.raises(UserError, match=r"holds none of the model's \d+ parameter tensors .*the checkpoint's: "
                                      r"\['dense'\]\): it is a checkpoint of another model family or layout"):
    params_checkpoint.load_params_into(location, target)


def test_a_partial_load_says_how_many_tensors_loaded_and_which_start_fresh(tmp_path, capsys):
  """Before: "no weights for ['mlm_head']" only for whole modules missing, nothing for the tensors of a module
  that the checkpoint holds in part."""
  target = _zeros(families.build(BERT), jnp.ones((1, 4), jnp.int32))
  saved = {k: v for k, v in target.items() if k != "mlm_head"}
  saved["encoder"] = jax.tree.map(lambda x: x + 1, saved["encoder"])
  saved["embeddings"] = {k: v for k, v in saved["embeddings"].items() if k != "layer_norm"}
  location = _write(tmp_path / "part", BERT, params=saved)
  total = len(jax.tree.leaves(target))
  heads_count = len(jax.tree.leaves(target["mlm_head"]))
  embeddings = len(jax.tree.leaves(target["embeddings"]))
  capsys.readouterr()
  loaded = params_checkpoint.load_params_into(location, target)
  assert capsys.readouterr().out.strip() == (
      f"{location}: {total - heads_count - 2} of {total} parameter tensors loaded; no weights for ['embeddings'] "
      f"(2 of {embeddings} tensors), ['mlm_head']: those {heads_count + 2} start from a fresh init")
  np.testing.assert_array_equal(jax.tree.leaves(loaded["encoder"])[0], jax.tree.leaves(saved["encoder"])[0])


# Damaged checkpoints

DAMAGE = ["truncated", "no _METADATA", "files missing", "NaN"]


@pytest.mark.parametrize("how", DAMAGE)
def test_load_pretrained_of_a_damaged_checkpoint_raises_one_line(tmp_path, bert, how):
  location = _damaged(bert, tmp_path, how)
  with pytest.raises(UserError) as raised:
    bert_jax.load_pretrained(location)
  assert str(raised.value).startswith(f"{location}") and "\n" not in str(raised.value), raised.value


@pytest.mark.parametrize("how", DAMAGE)
def test_embed_with_a_damaged_model_is_one_line_and_writes_nothing(tmp_path, capsys, bert, how):
  location = _damaged(bert, tmp_path, how)
  (tmp_path / "in.txt").write_text("the cat sat\n")
  line = one_error_line(capsys, ["embed", "--model", location, "--input", str(tmp_path / "in.txt"),
                                 "--output", str(tmp_path / "out.npy")])
  assert f"error: {location}: " in line, line
  assert not (tmp_path / "out.npy").exists()


@pytest.mark.parametrize("how", ["truncated", "no _METADATA"])
def test_predict_with_a_damaged_model_is_one_line_and_writes_nothing(tmp_path, capsys, bert, how):
  location = _damaged(bert, tmp_path, how)
  (tmp_path / "in.txt").write_text("the cat sat\n")
  line = one_error_line(capsys, ["predict", "--model", location, "--input", str(tmp_path / "in.txt"),
                                 "--output", str(tmp_path / "out.jsonl")])
  assert f"error: {location}: the checkpoint cannot be read (" in line, line
  assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.parametrize("how", DAMAGE)
def test_fine_tuning_from_a_damaged_checkpoint_is_one_line_and_writes_nothing(tmp_path, capsys, modernbert, how):
  location = _damaged(modernbert, tmp_path, how)
  line = one_error_line(capsys, [*FINETUNE, "--workdir", str(tmp_path / "run"), f"--config.init_from={location}"])
  assert f"error: init_from: {location}: " in line, line
  assert not (tmp_path / "run").exists()


def test_pretraining_from_a_damaged_checkpoint_is_one_line_and_writes_nothing(tmp_path, capsys, bert):
  location = _damaged(bert, tmp_path, "truncated")
  line = one_error_line(capsys, [*PRETRAIN, "--workdir", str(tmp_path / "run"), f"--config.init_from={location}"])
  assert f"error: init_from: {location}: the checkpoint cannot be read (" in line, line
  assert not (tmp_path / "run").exists()


@pytest.fixture(scope="module")
def task_teacher(tmp_path_factory):
  """A fine-tuning workdir of sst2 (a classification head over BERT, zeros)."""
  model = heads.encoder_config(BERT.replace(mlm_head=False), "classification", "pooled")
  ids = jnp.ones((1, 8), jnp.int32)
  params = _zeros(heads.FinetuneModel(model, "classification", 2), ids, ids, ids * 0)
  return _write(tmp_path_factory.mktemp("teacher") / "sst2", model, params=params,
                task={"family": "glue", "name": "sst2", "head": "classification", "num_labels": 2,
                      "labels": ["0", "1"]}, head={"pooling": "pooled", "dropout": 0.1})


@pytest.mark.parametrize("config, how", [("sst2", "truncated"), ("sst2", "no _METADATA"), ("sst2", "NaN"),
                                         ("theseus", "truncated"), ("general-tiny", "truncated"),
                                         ("general-tiny", "no _METADATA")])
def test_distilling_from_a_damaged_teacher_is_one_line_and_writes_nothing(request, tmp_path, capsys, config, how):
  """Before: orbax's traceback (FileNotFoundError without _METADATA), exit 1, and config.json and vocab.txt
  left in the student's workdir."""
  source = request.getfixturevalue("bert" if config.startswith("general") else "task_teacher")
  location = _damaged(source, tmp_path, how)
  line = one_error_line(capsys, ["distill", "--config", os.path.join(ROOT, f"configs/distill.py:{config}"),
                                 "--workdir", str(tmp_path / "student"), f"--config.distill.teacher={location}"])
  assert f"error: distill.teacher: {location}: " in line, line
  assert not (tmp_path / "student").exists()
