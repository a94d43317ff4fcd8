"""Each family pretrains end to end (trainer.pretrain on the embedded corpus) with a falling loss, and
progressive stacking carries a trained model into a deeper one through `bert-jax grow`."""
import json
import os

import pytest

from bert_jax import cli
from bert_jax.config_utils import load_config
from bert_jax.training import checkpoint, trainer
from bert_jax.data_pipelines import embedded, vocab
from core_helpers import slow

RUN = ["--config.train.batch_size=16", "--config.data.max_seq_length=64", "--config.train.num_steps=40",
       "--config.train.log_every_steps=5", "--config.train.eval_every_steps=0",
       "--config.checkpoint.every_steps=1000", "--config.checkpoint.async_save=False",
       "--config.data.num_shards=4", "--config.optimizer.warmup_steps=5",
       "--config.optimizer.learning_rate=2e-3"]
# Nats: the mean of the last 5 steps' losses vs the first 5 (batch-to-batch noise is ~0.05 here).
CLEAR_DROP = 0.4


@pytest.fixture(scope="module")
def bpe_vocab(tmp_path_factory):
  """RoBERTa trains its own (SentencePiece BPE) vocabulary; here a small one on the embedded corpus."""
  corpus, _ = embedded.ensure_embedded()
  return vocab.train_vocab(corpus, "sentencepiece", 2000, str(tmp_path_factory.mktemp("spm")),
                           lower_case=False, model_type="bpe")


def train_losses(spec, workdir, *overrides):
  config = load_config(spec, RUN + list(overrides))
  trainer.pretrain(config, str(workdir))
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  return [r for r in rows if "loss" in r]


@pytest.mark.parametrize("spec, overrides", [
    # LAMB scales each step to lr x the weight norm: small initial weights need a larger rate to move.
    pytest.param("configs/albert.py:tiny", ["--config.optimizer.learning_rate=2e-2"], marks=slow),  # 30 s
    pytest.param("configs/electra.py:tiny", [], marks=slow),  # 90 s; ELECTRA's two losses: test_family_models
    pytest.param("configs/spanbert.py:tiny", [], marks=slow),  # 36 s; its objective: test_family_models
])
def test_family_loss_falls(spec, overrides, tmp_path):
  rows = train_losses(spec, tmp_path, *overrides)
  assert rows[-1]["loss"] < rows[0]["loss"] - CLEAR_DROP, (rows[0]["loss"], rows[-1]["loss"])


@slow  # ~20 s; RoBERTa's BPE fine-tuning path: test_conversion_bpe
def test_roberta_trains_on_its_own_bpe_vocabulary(bpe_vocab, tmp_path):
  rows = train_losses("configs/roberta.py:tiny", tmp_path, f"--config.data.vocab={bpe_vocab}",
                      "--config.model.vocab_size=2048")
  assert rows[-1]["loss"] < rows[0]["loss"] - CLEAR_DROP, (rows[0]["loss"], rows[-1]["loss"])
  assert "nsp_loss" not in rows[-1]


@slow  # an end-to-end chain; its parts are tested in the suite (BERT_JAX_SLOW_TESTS=1)
def test_progressive_stacking_continues_from_the_grown_model(tmp_path):
  short = ["--config.train.num_steps=20"]
  stage1 = train_losses("configs/stacking.py:tiny", tmp_path / "stage1", *short)
  assert cli.main(["grow", "--from", str(tmp_path / "stage1"), "--to", str(tmp_path / "grown")]) == 0
  grown, config = checkpoint.load_params(str(tmp_path / "grown"))
  assert config["model"]["num_layers"] == 2
  assert grown["encoder"]["layers"]["attention"]["query"]["kernel"].shape[0] == 2
  stage2 = train_losses("configs/stacking.py:tiny-stage2", tmp_path / "stage2", *short,
                        f"--config.init_from={tmp_path / 'grown'}")
  # The grown model starts where stage 1 ended, far below a fresh model's first loss.
  assert stage2[0]["loss"] < stage1[0]["loss"] - 0.5, (stage1[0]["loss"], stage2[0]["loss"])
  assert stage2[-1]["loss"] < stage1[0]["loss"]
