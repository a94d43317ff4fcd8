"""GradCache in the bi-encoder job (bert_jax/sbert/gradcache.py): with train.grad_accum_steps=K the ranking
losses' step is the one-pass step (the global batch's loss, gradient and updated parameters), on one device
and on a 2x2x2 mesh, with dropout too (the same masks); and it takes less memory."""
import functools

import numpy as np
import pytest

import jax
from bert_jax.config_utils import load_config
from bert_jax.finetune import init
from bert_jax.sbert import model as model_lib, train
from bert_jax.training import partitioning

TINY = ["--config.model.num_layers=1", "--config.model.hidden_size=32", "--config.model.num_heads=2",
        "--config.model.intermediate_size=64", "--config.model.max_position_embeddings=32",
        "--config.model.vocab_size=128", "--config.data.max_seq_length=12", "--config.train.batch_size=16",
        "--config.train.num_steps=3", "--config.optimizer.learning_rate=1e-3", "--config.optimizer.warmup_ratio=0.0",
        "--config.train.tensorboard=false"]
NO_DROPOUT = ["--config.model.hidden_dropout=0.0", "--config.model.attention_dropout=0.0"]
MESH = ["--config.mesh.data=2", "--config.mesh.fsdp=2", "--config.mesh.tensor=2"]


def _batch(seed, rows=16, columns=3, length=12):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(3, length + 1, (rows, columns))
  mask = (np.arange(length) < lengths[..., None]).astype(np.int32)
  return {"input_ids": (rng.integers(5, 128, (rows, columns, length)) * mask).astype(np.int32),
          "attention_mask": mask}


def _setup(args, devices):
  config = load_config("configs/sbert.py:mnr", TINY + args)
  model = model_lib.SentenceEncoder(model_lib.encoder_config(init.model_config(config, None)), train.pooling(config))
  setup, _ = train.build_setup(config, train.objective_for(config, model), 3, 64,
                               partitioning.make_mesh(config.mesh, devices))
  return setup


def _run(args, devices, steps=3, initial=None):
  """(losses, gradient norms, parameters) after `steps` steps from the same initial parameters (`initial`,
  else the setup's init from key 0); then the setup and those initial parameters."""
  setup = _setup(args, devices)
  state = setup.init_state(jax.random.key(0)) if initial is None else setup.make_state(initial)
  losses, norms = [], []
  initial = jax.device_get(state.params)  # before the steps (they donate the state)
  for i in range(steps):
    state, metrics = setup.train_step(state, partitioning.global_batch(_batch(i), setup.mesh), jax.random.key(1))
    losses.append(float(metrics["loss"]))
    norms.append(float(metrics["grad_norm"]))
  return np.array(losses), np.array(norms), jax.device_get(state.params), setup, initial


def _same(run, reference, rtol=1e-5, atol=1e-5):
  np.testing.assert_allclose(run[0], reference[0], rtol=rtol)
  np.testing.assert_allclose(run[1], reference[1], rtol=10 * rtol)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=atol), run[2], reference[2])


SYMMETRIC = ["--config.ranking.directions=('query_to_doc','doc_to_query')",
             "--config.ranking.partition_mode=per_direction"]


@functools.lru_cache(maxsize=None)
def _one_pass(*args):
  return _run(list(args), jax.devices()[:1])


def test_cached_steps_are_the_one_pass_steps_with_its_dropout_masks():
  """K=8 chunks of 2 rows, dropout 0.1, on one device: the same losses, gradient norms and parameters after 3
  Adam steps as one pass over the 16 rows (batch_rows.chunk numbers a chunk's rows as the batch's, so the
  masks are the one pass's). Dropout is on (the loss is not the deterministic one), and the loss is the
  global batch's, not the mean of the 8 chunks' own. The symmetric loss (both directions), whose one-pass
  steps the mesh test below shares; the one-direction loss's chunks are the token-budget test's."""
  reference = _one_pass(*SYMMETRIC)
  _same(_run(SYMMETRIC + ["--config.train.grad_accum_steps=8"], jax.devices()[:1]), reference)
  assert len(set(np.round(reference[0], 4))) == 3  # the steps move the loss
  setup, params = reference[3], reference[4]  # the one pass's setup and initial parameters
  per_row = jax.jit(setup.objective.per_row)
  batch = _batch(0)
  assert abs(float(np.mean(per_row(params, batch))) - reference[0][0]) > 1e-3
  chunks = [float(np.mean(per_row(params, {k: v[i:i + 2] for k, v in batch.items()}))) for i in range(0, 16, 2)]
  assert abs(np.mean(chunks) - reference[0][0]) > 0.1


def test_cached_symmetric_steps_on_a_2x2x2_mesh_are_the_one_device_steps():
  """The symmetric loss (sentence-transformers' MultipleNegativesSymmetricRankingLoss) on data 2 x fsdp 2 x
  tensor 2, 2 chunks of 2 rows per device (the embeddings all-gathered, their gradients reduce-scattered back
  to their devices), dropout on: the one-device one-pass steps."""
  assert jax.device_count() == 8
  reference = _one_pass(*SYMMETRIC)
  # from the one device's initial parameters, put on the mesh (a sharded init equals one device's: test_sharding.py)
  _same(_run(MESH + SYMMETRIC + ["--config.train.grad_accum_steps=2"], jax.devices(), initial=reference[4]),
        reference)


def test_a_chunk_takes_less_memory_than_the_batch():
  """The compiled step's temporaries (memory_analysis) at batch 256: 32 chunks of 8 rows need well under half
  of one pass's."""
  args = NO_DROPOUT + ["--config.train.batch_size=256"]
  one = jax.devices()[:1]

  def temp_bytes(extra):
    setup = _setup(args + extra, one)
    batch = partitioning.global_batch(_batch(0, rows=256), setup.mesh)
    state = jax.eval_shape(setup.init_state, jax.random.key(0))
    return setup.train_step.lower(state, batch, jax.random.key(1)).compile().memory_analysis().temp_size_in_bytes

  whole, cached = temp_bytes([]), temp_bytes(["--config.train.grad_accum_steps=32"])
  assert cached < whole / 2, (cached, whole)


def _greedy_chunks(lengths, budget, buckets):
  """The number of token-budget chunks, planned by hand: sentences in length order, each chunk as many as fit
  at the smallest bucket holding its longest."""
  lengths, start, chunks = np.sort(lengths), 0, 0
  while start < len(lengths):
    rows = next(budget // b for b in buckets if lengths[min(start + budget // b, len(lengths)) - 1] <= b)
    start, chunks = start + rows, chunks + 1
  return chunks


def test_token_budget_chunks_are_the_one_pass_steps():
  """ranking.chunk_tokens=64 at max_seq_length 32 (buckets 16 and 32: 4 short or 2 long sentences a chunk),
  dropout off, one device: the one-pass steps; the step reports the chunks a hand-made plan of the 48
  sentences' lengths counts (fewer than one per 2 sentences, as the short ones share)."""
  args = NO_DROPOUT + ["--config.data.max_seq_length=32"]
  one = jax.devices()[:1]
  setup = _setup(args + ["--config.ranking.chunk_tokens=64", "--config.train.grad_accum_steps=2"], one)
  state, reference = setup.init_state(jax.random.key(0)), _setup(args, one)
  ref_state = reference.init_state(jax.random.key(0))
  for i in range(2):
    batch = _batch(i, length=32)
    state, metrics = setup.train_step(state, partitioning.global_batch(batch, setup.mesh), jax.random.key(1))
    ref_state, ref_metrics = reference.train_step(ref_state, partitioning.global_batch(batch, setup.mesh),
                                                  jax.random.key(1))
    assert float(metrics["loss"]) == pytest.approx(float(ref_metrics["loss"]), rel=1e-5)
    chunks = _greedy_chunks(batch["attention_mask"].sum(-1).ravel(), 64, (16, 32))
    assert int(metrics["chunks"]) == chunks < 24, chunks
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), jax.device_get(state.params),
               jax.device_get(ref_state.params))


def test_a_token_budget_as_large_as_the_batch_is_one_error():
  """A chunk that would hold a device's whole batch (16 rows x 3 sentences x 12 tokens) is a mistaken setting."""
  from bert_jax.errors import UserError
  with pytest.raises(UserError, match=r"ranking.chunk_tokens=576 is not below a device's whole batch \(576 tokens: "
                                      r"16 rows x 3 sentences x 12\)"):
    _setup(["--config.ranking.chunk_tokens=576"], jax.devices()[:1])


def test_the_matryoshka_loss_is_sentence_transformers_over_the_prefixes():
  """ranking.matryoshka_dims=(32, 8) with weights (1, 0.5): the loss of random embeddings is 1 x
  sentence-transformers' MultipleNegativesRankingLoss of all 32 dimensions + 0.5 x that of the first 8."""
  torch = pytest.importorskip("torch")
  st_losses = pytest.importorskip("sentence_transformers.sentence_transformer.losses")
  setup = _setup(["--config.ranking.matryoshka_dims=(32,8)", "--config.ranking.matryoshka_weights=(1.0,0.5)"],
                 jax.devices()[:1])
  e = np.random.default_rng(3).normal(size=(6, 3, 32)).astype(np.float32)
  reference = st_losses.MultipleNegativesRankingLoss(torch.nn.Module(), scale=20.0)
  want = sum(w * float(reference.compute_loss_from_embeddings([torch.tensor(e[:, k, :d]) for k in range(3)], None))
             for d, w in [(32, 1.0), (8, 0.5)])
  assert float(np.mean(setup.objective.rows_loss(e, e, 0))) == pytest.approx(want, rel=1e-5)
  from bert_jax.errors import UserError
  with pytest.raises(UserError, match="ranking.matryoshka_dims=\\[64\\]: 64 is not between 1 and the embedding's 32"):
    _setup(["--config.ranking.matryoshka_dims=(64,)"], jax.devices()[:1])


def test_embed_dim_keeps_the_first_floats(sst2_finetuned, tmp_path, capsys):
  """`bert-jax embed --dim 8`: the first 8 floats of each of the model's embeddings; more than it has is one line."""
  import bert_jax
  from bert_jax import cli
  _, model, _ = sst2_finetuned
  (tmp_path / "in.txt").write_text("a short sentence\nanother one, a little longer than the first\n")
  args = ["embed", "--model", model, "--input", str(tmp_path / "in.txt"), "--output", str(tmp_path / "out.npy")]
  assert cli.main([*args, "--dim", "8"]) == 0
  full = bert_jax.Embedder.load(model)(["a short sentence", "another one, a little longer than the first"])
  np.testing.assert_allclose(np.load(tmp_path / "out.npy"), full[:, :8], atol=1e-6)
  assert full.shape[1] > 8 and "2 embeddings of 8 floats" in capsys.readouterr().err
  assert cli.main([*args, "--dim", str(full.shape[1] + 1)]) == 2
  err = capsys.readouterr().err
  assert f"--dim {full.shape[1] + 1}: the model's embeddings have {full.shape[1]} dimensions" in err
  assert len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("directions,mode", [
    (("query_to_doc",), "joint"), (("query_to_doc", "doc_to_query"), "per_direction"),
    (("query_to_doc", "query_to_query", "doc_to_query", "doc_to_doc"), "joint"),
    (("query_to_doc", "doc_to_doc"), "joint")])
def test_ranking_rows_is_sentence_transformers_loss(directions, mode):
  """losses.ranking_rows against sentence-transformers' MultipleNegativesRankingLoss (its directions and
  partition modes) on random (query, positive, hard negative) embeddings: the batch's mean, and rows 2..3
  scored against the whole batch as a chunk of them is."""
  torch = pytest.importorskip("torch")
  st_losses = pytest.importorskip("sentence_transformers.sentence_transformer.losses")
  from bert_jax.sbert import losses
  e = np.random.default_rng(0).normal(size=(6, 3, 8)).astype(np.float32)
  reference = st_losses.MultipleNegativesRankingLoss(torch.nn.Module(), scale=20.0, directions=directions,
                                                     partition_mode=mode)
  want = float(reference.compute_loss_from_embeddings([torch.tensor(e[:, k]) for k in range(3)], None))
  rows = np.asarray(losses.ranking_rows(e, e, 0, 20.0, directions, mode))
  assert float(rows.mean()) == pytest.approx(want, rel=1e-5)
  np.testing.assert_allclose(losses.ranking_rows(e[2:4], e, 2, 20.0, directions, mode), rows[2:4], rtol=1e-5)
