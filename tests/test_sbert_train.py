"""The bi-encoder training job (bert_jax/sbert/train.py) at tiny sizes: each loss through `bert-jax finetune
--config configs/sbert.py:...` to a workdir that `bert-jax embed` reads; the job's per-row losses against
sbert/losses.py on the embeddings; the ranking loss's negatives are the global batch on a 2x2x2 mesh."""
import json

import numpy as np
import pytest

import bert_jax
from bert_jax import cli
from bert_jax.sbert import embedded

TINY = ["--config.model.num_layers=1", "--config.model.hidden_size=32", "--config.model.num_heads=2",
        "--config.model.intermediate_size=64", "--config.model.max_position_embeddings=32",
        "--config.data.max_seq_length=24", "--config.data.embedded_train=160", "--config.data.embedded_dev=48",
        "--config.train.batch_size=8", "--config.train.eval_batch_size=16", "--config.train.num_steps=4",
        "--config.train.log_every_steps=2", "--config.train.tensorboard=false"]


@pytest.mark.parametrize("preset", ["nli", "sts", "mnr"])
def test_each_loss_trains_to_a_workdir_that_embed_reads(preset, tmp_path, capsys):
  workdir = tmp_path / preset
  assert cli.main(["finetune", "--config", f"configs/sbert.py:{preset}", "--workdir", str(workdir), *TINY]) == 0
  out = capsys.readouterr().out
  assert "done: dev STS spearman" in out and f"bert-jax embed --model {workdir}" in out
  results = json.loads((workdir / "eval_results.json").read_text())
  assert {"spearman", "pearson", "initial/spearman"} <= set(results) and results["pairs"] == 48
  saved = json.loads((workdir / "config.json").read_text())
  assert saved["sentence_embedding"] == {"modes": ["mean"], "normalize": False, "max_seq_length": 24}
  embedder = bert_jax.Embedder.load(str(workdir), batch_size=8)
  assert embedder.dimension == 32 and "head" not in embedder.params  # the NLI classifier is not saved
  _, dev = embedded.splits(160, 48)
  u, v = embedder(dev.columns[0]), embedder(dev.columns[1])
  cosines = np.sum(u * v, 1) / np.linalg.norm(u, axis=1) / np.linalg.norm(v, axis=1)
  from bert_jax.finetune import metrics
  assert metrics.spearman(dev.target, cosines) == pytest.approx(results["spearman"], abs=1e-5)
  assert not (workdir / "state").exists()
  assert cli.main(["finetune", "--config", f"configs/sbert.py:{preset}", "--workdir", str(workdir), *TINY]) == 0
  assert "this run finished at step 4" in capsys.readouterr().out
