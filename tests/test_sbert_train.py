"""The bi-encoder training job (bert_jax/sbert/train.py) at tiny sizes: each loss through `bert-jax finetune
--config configs/sbert.py:...` to a workdir that `bert-jax embed` reads (and `convert --to hf` exports as a
sentence-transformers folder with the same embeddings); the ranking loss's negatives are the global batch on
a 2x2x2 mesh (loss, gradients and the HLO's all-gather); training from a tiny checkpoint beats its untrained
pooling on the embedded STS set; a SIGTERM-stopped run resumes exactly."""
import json
import re

import numpy as np
import pytest

import jax
import bert_jax
import data_fixtures
from bert_jax import cli
from bert_jax.config_utils import load_config
from bert_jax.finetune import metrics
from bert_jax.sbert import embedded, evaluate, train
from core_helpers import slow

TINY = ["--config.model.num_layers=1", "--config.model.hidden_size=32", "--config.model.num_heads=2",
        "--config.model.intermediate_size=64", "--config.model.max_position_embeddings=32",
        "--config.data.max_seq_length=16", "--config.data.embedded_train=160", "--config.data.embedded_dev=48",
        "--config.train.batch_size=8", "--config.train.eval_batch_size=16", "--config.train.num_steps=4",
        "--config.train.log_every_steps=2", "--config.train.tensorboard=false"]


# sts in the default suite (the job's one run there: the learner, the cosine loss's scored pairs, the export);
# nli and mnr weekly: their losses' steps are the mesh tests' below
@pytest.mark.parametrize("preset", [pytest.param("nli", marks=slow), "sts", pytest.param("mnr", marks=slow)])
def test_each_loss_trains_to_a_workdir_that_embed_reads(preset, tmp_path, capsys):
  workdir = tmp_path / preset
  assert cli.main(["finetune", "--config", f"configs/sbert.py:{preset}", "--workdir", str(workdir), *TINY]) == 0
  out = capsys.readouterr().out
  assert "done: dev STS spearman" in out and f"bert-jax embed --model {workdir}" in out
  results = json.loads((workdir / "eval_results.json").read_text())
  assert {"spearman", "pearson", "initial/spearman"} <= set(results) and results["pairs"] == 48
  saved = json.loads((workdir / "config.json").read_text())
  assert saved["sentence_embedding"] == {"modes": ["mean"], "normalize": False, "max_seq_length": 16}
  embedder = bert_jax.Embedder.load(str(workdir), batch_size=8)
  # recorded as fine-tuning records it: everything trains (the encoder saved, and the NLI loss's classifier)
  trainable, saved_size = saved["trainable_parameters"], sum(x.size for x in jax.tree.leaves(embedder.params))
  assert trainable["count"] == trainable["total"] == saved_size + (3 * (3 * 32 + 1) if preset == "nli" else 0)
  assert trainable["share"] == 1.0 and f"{trainable['count']:,} of {trainable['total']:,} parameters train" in out
  assert embedder.dimension == 32 and "head" not in embedder.params  # the NLI classifier is not saved
  _, dev = embedded.splits(160, 48)
  u, v = embedder(dev.columns[0]), embedder(dev.columns[1])
  cosines = np.sum(u * v, 1) / np.linalg.norm(u, axis=1) / np.linalg.norm(v, axis=1)
  assert metrics.spearman(dev.target, cosines) == pytest.approx(results["spearman"], abs=1e-5)
  assert not (workdir / "state").exists()
  if preset == "sts":  # the workdir exports as a sentence-transformers folder with the same embeddings
    sentence_transformers = pytest.importorskip("sentence_transformers")
    assert cli.main(["convert", "--to", "hf", str(workdir), str(tmp_path / "hf")]) == 0
    reference = sentence_transformers.SentenceTransformer(str(tmp_path / "hf"), device="cpu")
    np.testing.assert_allclose(reference.encode(dev.columns[0][:8]), u[:8], atol=1e-5)
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


def _steps(mesh_args, devices, steps=2, initial=None):
  from bert_jax.training import partitioning
  setup, objective = _setup("ranking", mesh_args, devices)
  state = setup.init_state(jax.random.key(0)) if initial is None else setup.make_state(initial)
  losses, norms = [], []
  initial = jax.device_get(state.params)  # before the steps (they donate the state)
  for i in range(steps):
    state, metrics = setup.train_step(state, partitioning.global_batch(_ranking_batch(i), setup.mesh),
                                      jax.random.key(1))
    losses.append(float(metrics["loss"]))
    norms.append(float(metrics["grad_norm"]))
  return losses, norms, jax.device_get(state.params), objective, initial


def test_ranking_negatives_are_the_global_batch_on_a_2x2x2_mesh():
  """The multiple-negatives ranking step on 8 devices (data 2 x fsdp 2 x tensor 2) is the one-device step:
  the same loss, gradient norm and updated parameters over two steps; and that loss is the global batch's,
  not a mean of each data shard's own (which the per-shard rows would give)."""
  assert jax.device_count() == 8
  mesh = ["--config.mesh.data=2", "--config.mesh.fsdp=2", "--config.mesh.tensor=2"]
  ref_losses, ref_norms, ref_params, objective, fresh = _steps([], jax.devices()[:1])
  # from the one device's initial parameters, put on the mesh (a sharded init equals one device's: test_sharding.py)
  losses, norms, params, _, _ = _steps(mesh, jax.devices(), initial=fresh)
  np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
  np.testing.assert_allclose(norms, ref_norms, rtol=1e-4)
  assert losses[1] != losses[0]
  # Adam's first steps move each weight by ~lr * sign(gradient): a gradient near zero, summed in another
  # order on the mesh, may move by up to ~3e-5 (1 of 1,024 entries once).
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-4), params, ref_params)
  batch = _ranking_batch(0)  # fresh: the one-device run's initial parameters
  per_row = jax.jit(objective.per_row)  # compiled: eager, each op of the encoder compiles on its own
  whole = float(np.mean(per_row(fresh, batch)))
  shards = [float(np.mean(per_row(fresh, {k: v[i:i + 4] for k, v in batch.items()}))) for i in (0, 4, 8, 12)]
  assert whole == pytest.approx(ref_losses[0], rel=1e-5) and abs(whole - np.mean(shards)) > 0.1


@slow  # weekly suite (BERT_JAX_SLOW_TESTS=1): the suite's 15 minutes; the family's HF-equality test stays
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


def test_a_run_from_a_checkpoint_starts_at_its_pooled_encoders_dev_score(sst2_finetuned, tmp_path, capsys):
  """init_from a fine-tuned workdir (the session's sst2 model): the run says so, and its starting dev Spearman
  is the one `Embedder.load` of that checkpoint scores independently (the learning chain is weekly, below)."""
  _, start, _ = sst2_finetuned
  workdir = tmp_path / "sts"
  args = [f"--config.init_from={start}", "--config.data.max_seq_length=32", "--config.data.embedded_train=64",
          "--config.data.embedded_dev=48", "--config.train.batch_size=16", "--config.train.eval_batch_size=16",
          "--config.train.num_steps=2", "--config.train.tensorboard=false"]
  assert cli.main(["finetune", "--config", "configs/sbert.py:sts", "--workdir", str(workdir), *args]) == 0
  assert f"initialised the encoder from {start}" in capsys.readouterr().out
  _, dev = embedded.splits(64, 48)
  baseline = evaluate.sts(bert_jax.Embedder.load(start, batch_size=16), dev)["spearman"]
  results = json.loads((workdir / "eval_results.json").read_text())
  assert results["initial/spearman"] == pytest.approx(baseline, abs=1e-5) and abs(baseline) > 0.05


@slow  # a learning chain (~30 s quiet); the job's steps and losses are covered by the default tests
def test_training_from_a_checkpoint_beats_its_untrained_pooling_on_the_embedded_sts_set(sst2_finetuned, tmp_path, capsys):
  """A tiny encoder (the session's fine-tuned sst2 model, tests/conftest.py) trained with the cosine loss for
  40 steps on the embedded STS set: dev Spearman rises about 0.1 above that of its untrained mean pooling,
  measured independently with `Embedder.load` of the starting checkpoint."""
  _, start, _ = sst2_finetuned
  workdir = tmp_path / "sts"
  args = [f"--config.init_from={start}", "--config.data.max_seq_length=32", "--config.data.embedded_train=1000",
          "--config.data.embedded_dev=200", "--config.train.batch_size=32", "--config.train.eval_batch_size=64",
          "--config.train.num_steps=40", "--config.train.log_every_steps=20", "--config.optimizer.learning_rate=1e-3",
          "--config.train.tensorboard=false"]
  assert cli.main(["finetune", "--config", "configs/sbert.py:sts", "--workdir", str(workdir), *args]) == 0
  assert f"initialised the encoder from {start}" in capsys.readouterr().out
  _, dev = embedded.splits(1000, 200)
  baseline = evaluate.sts(bert_jax.Embedder.load(start, batch_size=64), dev)["spearman"]
  results = json.loads((workdir / "eval_results.json").read_text())
  assert results["initial/spearman"] == pytest.approx(baseline, abs=1e-5)
  # README's "Sentence embeddings" quotes these bands (measured: 0.384 -> 0.485)
  assert 0.34 <= baseline <= 0.42 and 0.45 <= results["spearman"] <= 0.52, (results, baseline)
  assert results["spearman"] > baseline + 0.08, (results, baseline)
  # config.json records what trained, as fine-tuning's does (before: not recorded): the whole encoder
  trainable = json.loads((workdir / "config.json").read_text())["trainable_parameters"]
  size = sum(x.size for x in jax.tree.leaves(bert_jax.Embedder.load(str(workdir)).params))
  assert trainable == {"count": size, "total": size, "share": 1.0}


@slow  # the preset as README runs it: 124 steps, about a minute of CPU (several on a busy 2-core machine)
def test_the_tiny_preset_trains_a_random_encoder_to_the_readme_scores(tmp_path, capsys):
  """configs/sbert.py:tiny has no init_from: the run says it trains a random encoder, and on the embedded STS
  set (scored by the content words a pair shares) random weights' mean pooling already ranks the pairs well.
  README's "Sentence embeddings" quotes these bands (measured: 0.776 -> 0.816)."""
  assert cli.main(["finetune", "--config", "configs/sbert.py:tiny", "--workdir", str(tmp_path / "tiny"),
                   "--config.train.tensorboard=false"]) == 0
  assert train.RANDOM_ENCODER in capsys.readouterr().out.splitlines()[:2]  # before the steps (after the count)
  results = json.loads((tmp_path / "tiny" / "eval_results.json").read_text())
  assert 0.75 <= results["initial/spearman"] <= 0.80 and 0.80 <= results["spearman"] <= 0.84, results
  assert results["spearman"] - results["initial/spearman"] >= 0.02, results
  assert json.loads((tmp_path / "tiny" / "finished.json").read_text())["num_steps"] == 124


@slow  # two runs (stopped + uninterrupted); the loop's own signal tests stay in the default suite
def test_a_sigterm_stopped_run_resumes_to_the_uninterrupted_result(tmp_path, monkeypatch, capsys):
  """SIGTERM while step 2's row is written: the state is saved at step 3, where the loop reads it (exit
  143); the same command resumes it and ends with the parameters and dev scores (the starting encoder's
  included) of the run that was never stopped."""
  import os
  import signal
  from bert_jax.training import checkpoint, metrics as metrics_lib
  args = [*TINY, "--config.train.log_every_steps=1"]
  assert cli.main(["finetune", "--config", "configs/sbert.py:mnr", "--workdir", str(tmp_path / "straight"), *args]) == 0
  command = ["finetune", "--config", "configs/sbert.py:mnr", "--workdir", str(tmp_path / "stopped"), *args]
  log_train = metrics_lib.MetricsLogger.log_train

  def terminate_at_2(self, step, *a, **kw):
    row = log_train(self, step, *a, **kw)
    if step == 2:
      os.kill(os.getpid(), signal.SIGTERM)
    return row

  capsys.readouterr()
  with monkeypatch.context() as m:
    m.setattr(metrics_lib.MetricsLogger, "log_train", terminate_at_2)
    assert cli.main(command) == 143
  assert f"stopped at step 3/4 by SIGTERM | train state in {tmp_path}/stopped/state" in capsys.readouterr().out
  assert cli.main(command) == 0
  assert f"resumed from {tmp_path}/stopped/state/3" in capsys.readouterr().out
  assert (json.loads((tmp_path / "stopped" / "eval_results.json").read_text())
          == json.loads((tmp_path / "straight" / "eval_results.json").read_text()))
  a, _ = checkpoint.load_params(tmp_path / "straight")
  b, _ = checkpoint.load_params(tmp_path / "stopped")
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-6), a, b)


@pytest.mark.parametrize("preset", ["nli", "sts", "mnr", "tiny"])
def test_every_preset_passes_the_shared_schema(preset):
  from bert_jax import jobs
  from bert_jax.sbert import train
  config = load_config(f"configs/sbert.py:{preset}")
  job = jobs.get(config)
  assert (job.name, job.command, job.schema.kind) == ("sbert", "finetune", "dataset")
  train.validate(config)
  assert config.loss == {"nli": "softmax", "sts": "cosine", "mnr": "ranking", "tiny": "cosine"}[preset]


@pytest.mark.parametrize("command,args,named", [
    ("finetune", ["--config.train.grad_accum_steps=128"], "train.batch_size=64 must be divisible by data-parallel "
                                                           "size (mesh.data x mesh.fsdp = 8) x train.grad_accum_steps "
                                                           "(128) = 1024"),
    ("finetune", ["--config.ranking.chunk_tokens=100"], "ranking.chunk_tokens=100 is below one sentence of "
                                                        "data.max_seq_length=128 tokens"),
    ("finetune", ["--config.ranking.directions=('doc_to_query',)"], "ranking.directions=['doc_to_query']: "
                                                                    "query_to_doc and any of"),
    ("finetune", ["--config.loss=triplet"], "loss='triplet' is not one of ('softmax', 'cosine', 'ranking')"),
    ("finetune", ["--config.pooling.modes=('weighted',)"], "pooling modes ['weighted']: each must be one of"),
    ("sweep", [], "configs/sbert.py:mnr is not a fine-tuning config: bert-jax sweep runs configs of job finetune"),
])
def test_bad_bi_encoder_configs_are_one_line(command, args, named, tmp_path, capsys):
  assert cli.main([command, "--config", "configs/sbert.py:mnr", "--workdir", str(tmp_path), *args]) == 2
  err = capsys.readouterr().err
  assert named in err and len(err.strip().splitlines()) == 1, err


def test_a_dev_file_spearman_cannot_score_is_one_line(tmp_path, capsys):
  """Equal dev scores (or a header alone) leave Spearman undefined: the run stops before training, not with a
  dev score of 0.0 and NumPy's warnings."""
  train_file, dev = tmp_path / "train.tsv", tmp_path / "dev.tsv"
  train_file.write_text("".join(f"a {i}\tb {i}\t{i % 5}\n" for i in range(16)))
  for text, named in [("a\tb\t3\nc\td\t3\n", f"data.dev_file={dev}: 2 pairs, all scored 3: Spearman and Pearson"),
                      ("sentence1\tsentence2\tscore\n", f"{dev}: only a header line, no examples")]:
    dev.write_text(text)
    assert cli.main(["finetune", "--config", "configs/sbert.py:sts", "--workdir", str(tmp_path / "run"),
                     f"--config.data.train_file={train_file}", f"--config.data.dev_file={dev}"]) == 2
    err = capsys.readouterr().err
    assert named in err and len(err.strip().splitlines()) == 1, err
  assert cli.main(["finetune", "--config", "configs/sbert.py:tiny", "--workdir", str(tmp_path / "run"),
                   "--config.data.embedded_dev=0"]) == 2
  err = capsys.readouterr().err
  assert "data.embedded_dev=0 (the embedded STS set's dev pairs): no sentence pairs to score" in err, err


def test_the_training_files_read_as_written(tmp_path):
  from bert_jax.errors import UserError
  from bert_jax.sbert import data
  labels = ("contradiction", "entailment", "neutral")
  nli = tmp_path / "nli.tsv"
  nli.write_text("premise\thypothesis\tlabel\nA man sleeps.\tA man rests.\tentailment\nA cat.\tNo cat.\tcontradiction\n")
  pairs = data.read_labelled_pairs(str(nli), labels)
  assert pairs.columns == [["A man sleeps.", "A cat."], ["A man rests.", "No cat."]]
  assert pairs.target.tolist() == [1, 0] and pairs.target.dtype == np.int32
  nli.write_text("a\tb\tentailment\nc\td\tmaybe\n")
  with pytest.raises(UserError, match=r"nli.tsv, line 2: the label 'maybe' is not one of \['contradiction'"):
    data.read_labelled_pairs(str(nli), labels)
  triples = tmp_path / "triples.tsv"
  triples.write_text("q1\tp1\tn1\nq2\tp2\tn2\n")
  assert data.read_text_pairs(str(triples)).columns == [["q1", "q2"], ["p1", "p2"], ["n1", "n2"]]
  triples.write_text("q1\tp1\tn1\nq2\tp2\n")
  with pytest.raises(UserError, match="triples.tsv, line 2: 2 tab-separated fields; expected anchor<TAB>positive"):
    data.read_text_pairs(str(triples))


@slow  # a conversion and a run; init_from conversion is tested for fine-tuning in the default suite
def test_init_from_a_hugging_face_folder(tmp_path, capsys):
  """A HF BertModel folder as init_from is converted into the workdir and its encoder is where training
  starts: the run's initial dev Spearman is that of the folder's own mean pooling (Embedder.load)."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  import shutil
  folder = tmp_path / "hf"
  torch.manual_seed(0)
  config = transformers.BertConfig(vocab_size=8192, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                   intermediate_size=64, max_position_embeddings=32)
  transformers.BertModel(config).eval().save_pretrained(folder)
  shutil.copy(data_fixtures.embedded_paths()[1], folder / "vocab.txt")
  (folder / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True, "tokenizer_class": "BertTokenizer"}))
  workdir = tmp_path / "run"
  args = [a for a in TINY if not a.startswith(("--config.model.", "--config.data.max_seq_length"))] + [
      f"--config.init_from={folder}", "--config.data.max_seq_length=32", "--config.train.num_steps=2"]
  assert cli.main(["finetune", "--config", "configs/sbert.py:sts", "--workdir", str(workdir), *args]) == 0
  out = capsys.readouterr().out
  assert f"is a Hugging Face folder: converted it to {workdir}/init_from" in out, out
  _, dev = embedded.splits(160, 48)
  baseline = evaluate.sts(bert_jax.Embedder.load(str(folder), batch_size=16), dev)["spearman"]
  results = json.loads((workdir / "eval_results.json").read_text())
  assert results["initial/spearman"] == pytest.approx(baseline, abs=1e-5)
