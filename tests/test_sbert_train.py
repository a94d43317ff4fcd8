"""The bi-encoder training job (bert_jax/sbert/train.py) at tiny sizes: each loss through `bert-jax finetune
--config configs/sbert.py:...` to a workdir that `bert-jax embed` reads; the job's per-row losses against
sbert/losses.py on the embeddings; the ranking loss's negatives are the global batch on a 2x2x2 mesh."""
import json
import re

import numpy as np
import pytest

import jax
import bert_jax
from bert_jax import cli
from bert_jax.config_utils import load_config
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


MESH_TINY = ["--config.model.vocab_size=128", "--config.model.hidden_dropout=0.0",
             "--config.model.attention_dropout=0.0", "--config.data.max_seq_length=12", "--config.train.batch_size=16",
             "--config.train.num_steps=2", "--config.optimizer.learning_rate=1e-2"]


def _ranking_batch(seed, rows=16, columns=3, length=12):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(3, length + 1, (rows, columns))
  mask = (np.arange(length) < lengths[..., None]).astype(np.int32)
  return {"input_ids": (rng.integers(5, 128, (rows, columns, length)) * mask).astype(np.int32),
          "attention_mask": mask}


def _setup(loss, mesh_args, devices):
  from bert_jax.finetune import init
  from bert_jax.sbert import model as model_lib, train
  from bert_jax.training import partitioning
  config = load_config(f"configs/sbert.py:{ {'ranking': 'mnr', 'cosine': 'sts'}[loss]}", TINY + MESH_TINY + mesh_args)
  model = model_lib.SentenceEncoder(model_lib.encoder_config(init.model_config(config, None)), train.pooling(config))
  objective = train.BiEncoderObjective(model, loss, scale=config.ranking.scale)
  setup, _ = train.build_setup(config, objective, 3, 64, partitioning.make_mesh(config.mesh, devices))
  return setup, objective


def _steps(mesh_args, devices, steps=2):
  from bert_jax.training import partitioning
  setup, _ = _setup("ranking", mesh_args, devices)
  state, losses, norms = setup.init_state(jax.random.key(0)), [], []
  for i in range(steps):
    state, metrics = setup.train_step(state, partitioning.global_batch(_ranking_batch(i), setup.mesh),
                                      jax.random.key(1))
    losses.append(float(metrics["loss"]))
    norms.append(float(metrics["grad_norm"]))
  return losses, norms, jax.device_get(state.params)


def test_ranking_negatives_are_the_global_batch_on_a_2x2x2_mesh():
  """The multiple-negatives ranking step on 8 devices (data 2 x fsdp 2 x tensor 2) is the one-device step:
  the same loss, gradient norm and updated parameters over two steps; and that loss is the global batch's,
  not a mean of each data shard's own (which the per-shard rows would give)."""
  assert jax.device_count() == 8
  mesh = ["--config.mesh.data=2", "--config.mesh.fsdp=2", "--config.mesh.tensor=2"]
  losses, norms, params = _steps(mesh, jax.devices())
  ref_losses, ref_norms, ref_params = _steps([], jax.devices()[:1])
  np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
  np.testing.assert_allclose(norms, ref_norms, rtol=1e-4)
  assert losses[1] != losses[0]
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), params, ref_params)
  setup, objective = _setup("ranking", [], jax.devices()[:1])
  fresh = setup.init_params(jax.random.key(0))
  batch = _ranking_batch(0)
  whole = float(np.mean(objective.per_row(fresh, batch)))
  shards = [float(np.mean(objective.per_row(fresh, {k: v[i:i + 4] for k, v in batch.items()}))) for i in (0, 4, 8, 12)]
  assert whole == pytest.approx(ref_losses[0], rel=1e-5) and abs(whole - np.mean(shards)) > 0.1


@pytest.mark.parametrize("loss,gathers", [("ranking", True), ("cosine", False)])
def test_the_compiled_ranking_step_all_gathers_the_embeddings(loss, gathers):
  """On a data-parallel mesh of 8 (weights whole on each device, so no collective moves them) the ranking
  step's HLO all-gathers the candidates' embeddings (2 per row, the global batch's 16 rows); the per-row cosine loss has none."""
  from bert_jax.training import partitioning
  setup, _ = _setup(loss, ["--config.mesh.data=8"], jax.devices())
  batch = {**_ranking_batch(0), **({"label": np.linspace(0, 1, 16, dtype=np.float32)} if loss == "cosine" else {})}
  batch = partitioning.global_batch(batch, setup.mesh)
  hlo = setup.train_step.lower(setup.init_state(jax.random.key(0)), batch, jax.random.key(1)).compile().as_text()
  shapes = [tuple(map(int, s.split(","))) for s in re.findall(r"= \(?f32\[([\d,]+)\][^ ]* all-gather", hlo)]
  # [candidates per row (2: positive, hard negative), 16 rows, 32 hidden]: each device gets every row's
  assert any(shape[-1] == 32 and np.prod(shape[:-1]) == 2 * 16 for shape in shapes) == gathers, shapes
