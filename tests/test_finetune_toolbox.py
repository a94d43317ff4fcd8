"""Issue 16's fine-tuning toolbox against independent references: adapters (identity at init, the
trainable mask counted by hand, frozen weights unchanged by steps, a delta checkpoint that evaluates
as the full model), the feature-based mode, layer mix for token and span heads (NumPy), SMART's
symmetric KL, perturbation step and momentum teacher (NumPy and the paper's formulas), separate seeds,
and the expected maximum of n runs (closed form vs enumeration)."""
import itertools
import json

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from bert_jax.config_utils import load_config
from bert_jax.errors import UserError
from bert_jax.finetune import heads, modes, smart, sweep, trainer
from bert_jax.finetune.tasks import Task
from bert_jax.models import bert, head_kinds
from bert_jax.models.config import ModelConfig
from core_helpers import random_like, slow

TINY = dict(vocab_size=40, hidden_size=8, num_layers=2, num_heads=2, intermediate_size=16,
            max_position_embeddings=16)
X = jnp.arange(12, dtype=jnp.int32).reshape(2, 6) % 40


def _init(kind="classification", pooling="pooled", abstract=False, random=False, **model):
  """(config, model, params as numpy: the model's init, or NumPy random (`random`), or only their shapes:
  nothing computed)."""
  cfg = heads.encoder_config(ModelConfig(**{**TINY, **model}), kind, pooling)
  net = heads.FinetuneModel(cfg, kind, 3, pooling, 0.0)
  args = (jax.random.key(0), X, jnp.ones_like(X), jnp.zeros_like(X))
  if abstract or random:
    params = bert.nn.meta.unbox(jax.eval_shape(net.init, *args)["params"])
    return cfg, net, random_like(params) if random else params
  return cfg, net, jax.tree.map(np.asarray, bert.nn.meta.unbox(jax.jit(net.init)(*args)["params"]))


def _apply(net, params, x=X):
  return jax.jit(net.apply)({"params": params}, x, jnp.ones_like(x), jnp.zeros_like(x))


# ---- adapters ----

def test_fresh_adapters_are_the_identity_and_compute_houlsby_bottleneck():
  cfg, net, params = _init(adapter_size=4)
  plain_net = heads.FinetuneModel(cfg.replace(adapter_size=0), "classification", 3, "pooled", 0.0)
  layers = {k: v for k, v in params["encoder"]["layers"].items() if not k.endswith("_adapter")}
  plain = {**params, "encoder": {**params["encoder"], "layers": layers}}  # the same weights, no adapters
  assert len(layers) < len(params["encoder"]["layers"])
  assert np.allclose(_apply(net, params)["logits"], _apply(plain_net, plain)["logits"], atol=1e-6)
  # x + up(gelu(down(x))) by hand, with non-zero weights
  rng = np.random.default_rng(0)
  w = {"down": {"kernel": rng.normal(size=(8, 4)), "bias": rng.normal(size=4)},
       "up": {"kernel": rng.normal(size=(4, 8)), "bias": rng.normal(size=8)}}
  x = rng.normal(size=(2, 3, 8)).astype(np.float32)
  got = bert.Adapter(cfg).apply({"params": w}, x)
  h = x @ w["down"]["kernel"] + w["down"]["bias"]
  gelu = 0.5 * h * (1 + np.vectorize(__import__("math").erf)(h / np.sqrt(2)))
  assert np.allclose(got, x + gelu @ w["up"]["kernel"] + w["up"]["bias"], atol=1e-5)


def test_adapter_mask_trains_adapters_layer_norms_pooler_and_head_only():
  _, _, params = _init(adapter_size=4, abstract=True)
  mask = modes.trainable_mask(params, "adapters")
  count, total = modes.trainable_count(params, mask)
  h, m, layers, labels = 8, 4, 2, 3
  adapters = layers * 2 * (h * m + m + m * h + h)
  norms = 2 * h + layers * 2 * 2 * h  # embeddings LN + two per layer, scale and bias
  pooler, head = h * h + h, h * labels + labels
  assert count == adapters + norms + pooler + head
  assert total == sum(int(np.prod(p.shape)) for p in jax.tree.leaves(params))
  assert not mask["encoder"]["layers"]["attention"]["query"]["kernel"]
  assert not mask["embeddings"]["word_embeddings"]["embedding"]
  feature = modes.trainable_mask(params, "feature")
  assert modes.trainable_count(params, feature)[0] == head
  _, _, mixed = _init(pooling="layer_mix", abstract=True)  # feature-based on a mix of L + 1 [CLS] vectors
  assert modes.trainable_count(mixed, modes.trainable_mask(mixed, "feature"))[0] == head + layers + 1 + 1
  frozen = modes.model_config(ModelConfig(**TINY), ml_collections.ConfigDict({"mode": "feature"}))
  assert (frozen.hidden_dropout, frozen.attention_dropout) == (0.0, 0.0)  # fixed features
  with pytest.raises(UserError, match="train.mode"):
    modes.validate(ml_collections.ConfigDict({"mode": "lora", "adapter_size": 4}))


def _setup(config, model_cfg, kind="classification", num_labels=2):
  task = Task("t", kind, num_labels, None, [], [], ("accuracy",))
  return trainer.build_train_setup(config, model_cfg, task, num_train=64)[0]


def _config(*overrides):
  return load_config("configs/glue.py:sst2", ["--config.data.max_seq_length=8", "--config.train.batch_size=8",
                                              "--config.train.epochs=1", *overrides])


def _batch(kind="classification"):
  rng = np.random.default_rng(1)
  batch = {"input_ids": rng.integers(1, 40, (8, 8)).astype(np.int32), "attention_mask": np.ones((8, 8), np.int32),
           "token_type_ids": np.zeros((8, 8), np.int32), "label": rng.integers(0, 2, 8).astype(np.int32)}
  if kind == "token":
    batch.update(token_labels=rng.integers(0, 2, (8, 8)).astype(np.int32),
                 label_weights=(rng.random((8, 8)) > 0.3).astype(np.float32))
  return batch


@pytest.mark.parametrize("mode", ["adapters", "feature"])
def test_frozen_parameters_do_not_move_and_trainable_ones_do(mode):
  config = _config(f"--config.train.mode={mode}", "--config.train.adapter_size=4",
                   "--config.optimizer.weight_decay=0.1")
  model_cfg = modes.model_config(heads.encoder_config(ModelConfig(**TINY), "classification", "pooled"),
                                 config.train)
  setup = _setup(config, model_cfg)
  state = setup.make_state(random_like(setup.abstract_state.params))  # not the init program: ~3 s to compile
  before = jax.device_get(state.params)
  mask = modes.trainable_mask(before, mode)
  batch = trainer.partitioning.global_batch(_batch(), setup.mesh)
  for _ in range(3):
    state, _ = setup.train_step(state, batch, jax.random.key(1))
  after = jax.device_get(state.params)
  moved = jax.tree.map(lambda a, b: not np.array_equal(a, b), before, after)
  assert jax.tree.leaves(moved) == jax.tree.leaves(mask)  # exactly the trainable leaves changed
  # frozen parameters keep no Adam moments: the optimizer state holds only the trainable count
  moments = [x.size for x in jax.tree.leaves(state.opt_state) if getattr(x, "ndim", 0) > 0]
  assert sum(moments) == 2 * modes.trainable_count(before, mask)[0]


@slow  # a fine-tuning run, evaluate, predict and export end to end (~15 s in the suite)
def test_adapter_run_saves_a_delta_that_evaluates_predicts_and_exports_as_the_full_model(tmp_path, capsys):
  import test_finetune_e2e as e2e  # pylint: disable=import-outside-toplevel
  import test_finetune_predict as hf_base  # pylint: disable=import-outside-toplevel
  from bert_jax import cli  # pylint: disable=import-outside-toplevel
  data = e2e._glue_dir(tmp_path / "data", lambda i, s, y: f"{s}\t{y}", ("0", "1"), ("sentence", "label"),
                       n_train=64, n_dev=32)
  # the base: a (tiny, random) BERT from transformers, converted, as a MiniLM would be
  assert cli.main(["convert", "--from", "hf", hf_base._hf_bert(tmp_path / "hf_base"), str(tmp_path / "base")]) == 0
  adapters = e2e.TINY + [f"--config.data.data_dir={data}", "--config.train.tensorboard=false",
                         f"--config.init_from={tmp_path / 'base'}", "--config.train.mode=adapters",
                         "--config.train.adapter_size=4", "--config.train.epochs=2"]
  trainer.finetune(load_config("configs/glue.py:sst2", adapters), str(tmp_path / "adapters"))
  saved = json.loads((tmp_path / "adapters" / "config.json").read_text())
  assert saved["base_checkpoint"] == str(tmp_path / "base") and saved["model"]["adapter_size"] == 4
  # trained by hand (H 32, 2 layers, adapters of 4, 2 labels): adapters, LayerNorms, pooler, head
  count = 2 * 2 * (32 * 4 + 4 + 4 * 32 + 32) + (1 + 2 * 2) * 2 * 32 + (32 * 32 + 32) + (32 * 2 + 2)
  trained = saved["trainable_parameters"]
  assert trained["count"] == count and trained["share"] == pytest.approx(count / trained["total"])
  assert f"{count:,} of {trained['total']:,} parameters train" in capsys.readouterr().out
  delta = trainer.params_checkpoint._own_metadata(tmp_path / "adapters")
  assert set(delta) == {"embeddings", "encoder", "pooler", "head"}
  assert "word_embeddings" not in delta["embeddings"] and "attention" not in delta["encoder"]["layers"]
  full, _ = trainer.checkpoint.load_params(tmp_path / "adapters")
  base_params, _ = trainer.checkpoint.load_params(tmp_path / "base")
  assert np.array_equal(full["embeddings"]["word_embeddings"]["embedding"],
                        base_params["embeddings"]["word_embeddings"]["embedding"])
  assert "attention_adapter" in full["encoder"]["layers"]
  # `bert-jax predict` reads the delta too, and agrees with the dev predictions the run wrote
  assert cli.main(["predict", "--model", str(tmp_path / "adapters"), "--input", f"{data}/dev.tsv",
                   "--output", str(tmp_path / "dev.jsonl")]) == 0
  ours = [json.loads(line) for line in (tmp_path / "dev.jsonl").read_text().splitlines()]
  written = (tmp_path / "adapters" / "predictions" / "SST-2.dev.tsv").read_text().splitlines()[1:]
  assert [r["label"] for r in ours] == [line.split("\t")[1] for line in written]
  # the HF export of the delta, through transformers' pipeline: the same labels and scores
  transformers = pytest.importorskip("transformers")
  assert cli.main(["convert", "--to", "hf", str(tmp_path / "adapters"), str(tmp_path / "hf")]) == 0
  assert "trust_remote_code=True" in capsys.readouterr().out
  with pytest.raises(ValueError, match="trust_remote_code"):  # a plain load cannot drop the adapters unseen
    transformers.AutoConfig.from_pretrained(tmp_path / "hf")
  sentences = [line.split("\t")[0] for line in open(f"{data}/dev.tsv").read().splitlines()[1:]]
  pipe = transformers.pipeline("text-classification", model=str(tmp_path / "hf"), device="cpu",
                               trust_remote_code=True)
  theirs = pipe(sentences, truncation=True)
  assert [r["label"] for r in theirs] == [r["label"] for r in ours]
  np.testing.assert_allclose([r["score"] for r in theirs], [r["score"] for r in ours], atol=1e-5)
  (tmp_path / "base").rename(tmp_path / "moved")
  with pytest.raises(UserError, match="not there"):
    trainer.checkpoint.load_params(tmp_path / "adapters")


@pytest.mark.parametrize("family,kind", [("roberta", "token"), ("electra", "span")])  # BERT: the run above
def test_hf_export_of_adapters_reproduces_logits(tmp_path, family, kind):
  transformers = pytest.importorskip("transformers")
  import test_conversion_heads as exports  # pylint: disable=import-outside-toplevel
  from bert_jax import cli  # pylint: disable=import-outside-toplevel
  from bert_jax.finetune.predict import Predictor  # pylint: disable=import-outside-toplevel
  config, params = exports.fine_tuned_workdir(tmp_path / "ft", family, kind, adapter_size=5)
  assert cli.main(["convert", "--to", "hf", str(tmp_path / "ft"), str(tmp_path / "hf")]) == 0
  task_class = exports.FAMILIES[family][0] + exports.HF_CLASSES[kind]
  model = getattr(transformers, f"AutoModel{exports.HF_CLASSES[kind]}").from_pretrained(
      tmp_path / "hf", trust_remote_code=True).eval()
  assert type(model).__name__ == task_class.replace("For", "AdaptersFor")
  plain = getattr(transformers, task_class).from_pretrained(tmp_path / "hf").eval()  # drops the adapters
  rows = exports.batch(config)
  ours = Predictor.build(config, params, tokenizer=None).run(rows)
  theirs, without = exports.hf_logits(model, kind, rows), exports.hf_logits(plain, kind, rows)
  keep = rows["attention_mask"] > 0 if kind != "classification" else slice(None)
  for key, value in theirs.items():
    assert np.abs(ours[key][keep] - value[keep]).max() <= 1e-5, key
    assert np.abs(without[key][keep] - value[keep]).max() > 0.05, key  # the adapters do change the output


def test_adapter_exports_without_a_place_for_them_are_refused_in_one_line(tmp_path, capsys):
  import test_conversion_heads as exports  # pylint: disable=import-outside-toplevel
  from bert_jax import cli  # pylint: disable=import-outside-toplevel
  exports.fine_tuned_workdir(tmp_path / "albert", "albert", "classification", adapter_size=4)
  exports.fine_tuned_workdir(tmp_path / "bert", "bert", "classification", adapter_size=4)
  for src, fmt, says in (("albert", "hf", "no Hugging Face export in albert"),
                         ("bert", "tf", "original TF BERT checkpoints have no place for")):
    assert cli.main(["convert", "--to", fmt, str(tmp_path / src), str(tmp_path / f"{src}-{fmt}")]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and "adapter_size=4" in err and len(err.splitlines()) == 1
    assert not (tmp_path / f"{src}-{fmt}").exists()


# ---- layer mix for token and span heads ----

@pytest.mark.parametrize("kind", ["token", "span"])
def test_layer_mix_for_token_and_span_heads_matches_numpy(kind):
  cfg, net, params = _init(kind, "layer_mix", random=True)
  assert "layer_mix" in params["head"]
  params["head"]["layer_mix"]["layer_weights"] = np.array([0.3, -1.0, 1.2], np.float32)
  params["head"]["layer_mix"]["gamma"] = np.float32(0.7)
  out = _apply(net, params)
  encoder = {k: v for k, v in params.items() if k != "head"}
  hidden = np.asarray(jax.jit(lambda p: bert.BertModel(cfg).apply({"params": p}, X, output_hidden_states=True)
                              .hidden_states)(encoder))
  w = np.exp([0.3, -1.0, 1.2]) / np.exp([0.3, -1.0, 1.2]).sum()
  mixed = 0.7 * np.einsum("l,lbth->bth", w, hidden)
  dense = params["head"]["classifier" if kind == "token" else "span"]
  logits = mixed @ dense["kernel"] + dense["bias"]
  if kind == "token":
    assert np.allclose(out["logits"], logits, atol=1e-5)
  else:
    assert np.allclose(out["start_logits"], logits[..., 0], atol=1e-5)
    assert np.allclose(out["end_logits"], logits[..., 1], atol=1e-5)


# ---- SMART ----

def _np_symkl(a, b):
  p = np.exp(a - a.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
  q = np.exp(b - b.max(-1, keepdims=True)); q /= q.sum(-1, keepdims=True)
  return (p * np.log(p / q)).sum(-1) + (q * np.log(q / p)).sum(-1)


def test_symmetric_kl_and_divergences_match_numpy():
  rng = np.random.default_rng(0)
  a, b = rng.normal(size=(4, 5)), rng.normal(size=(4, 5))
  assert np.allclose(head_kinds.symmetric_kl(a, b), _np_symkl(a, b), atol=1e-5)
  weights = np.array([1.0, 0.0, 1.0, 1.0])
  got = smart.divergence("token", {"logits": a[None]}, {"logits": b[None]}, {"label_weights": weights[None]})
  assert float(got) == pytest.approx((_np_symkl(a, b) * weights).sum(), rel=1e-5)
  span = smart.divergence("span", {"start_logits": a, "end_logits": b}, {"start_logits": b, "end_logits": a}, {})
  assert float(span) == pytest.approx(_np_symkl(a, b).sum(), rel=1e-5)  # symmetric: (s + e) / 2 = s
  assert float(smart.divergence("regression", {"logits": a[:, 0]}, {"logits": b[:, 0]}, {})) == pytest.approx(
      ((a[:, 0] - b[:, 0]) ** 2).sum(), rel=1e-5)


def _np_perturbation(x, w, target_logits, step, eps):
  """One step of Algorithm 1 from delta_0 = 0, with the symmetric-KL gradient written out by hand:
  d l_s / dz = p (l - <p, l>) + (p - q), l = log p - log q, for logits z = sum_t (x + delta)_t W."""
  z = x.sum(1) @ w
  p = np.exp(z - z.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
  q = np.exp(target_logits - target_logits.max(-1, keepdims=True)); q /= q.sum(-1, keepdims=True)
  log_ratio = np.log(p) - np.log(q)
  dz = p * (log_ratio - (p * log_ratio).sum(-1, keepdims=True)) + (p - q)
  grad = np.broadcast_to((dz @ w.T)[:, None, :], x.shape)
  norm = np.abs(grad).max(axis=(1, 2), keepdims=True)
  return np.clip(step * grad / norm, -eps, eps)


@pytest.mark.parametrize("eps", [1.0, 2e-4])  # the normalised step itself; then the projection
def test_perturbation_step_matches_numpy(eps):
  rng = np.random.default_rng(0)
  x, w = rng.normal(size=(3, 4, 5)).astype(np.float32), rng.normal(size=(5, 3)).astype(np.float32)
  target = rng.normal(size=(3, 3)).astype(np.float32)
  cfg = ml_collections.ConfigDict({"noise_std": 0.0, "step_size": 1e-3, "epsilon": eps, "iterations": 1})
  run = lambda d: {"logits": jnp.einsum("bth,hc->bc", x + d, w)}  # noqa: E731
  got = smart.perturbation(run, {"logits": jnp.asarray(target)}, x.shape, jax.random.key(0), cfg,
                           "classification", {})
  want = _np_perturbation(x, w, target, 1e-3, eps)
  assert np.allclose(got, want, atol=1e-9, rtol=1e-4)
  assert float(jnp.max(jnp.abs(got))) == pytest.approx(min(1e-3, eps), rel=1e-5)


def test_smart_loss_and_momentum_teacher_in_the_shared_step():
  config = _config("--config.smart.enabled=true", "--config.smart.adversarial_weight=3.0",
                   "--config.smart.bregman_weight=2.0", "--config.smart.epsilon=0.1",
                   "--config.optimizer.warmup_ratio=0.0", "--config.optimizer.learning_rate=1e-2",
                   "--config.train.epochs=10", "--config.model.hidden_dropout=0.0",
                   "--config.model.attention_dropout=0.0", "--config.head.dropout=0.0")
  model_cfg = heads.encoder_config(ModelConfig(**TINY, hidden_dropout=0.0, attention_dropout=0.0),
                                   "classification", "pooled")
  setup = _setup(config, model_cfg)
  assert setup.num_steps == 80
  state = setup.make_state(random_like(setup.abstract_state.params))  # not the init program: ~3 s to compile
  theta0 = jax.device_get(state.params)
  assert all(jax.tree.leaves(jax.tree.map(np.array_equal, jax.device_get(state.teacher), theta0)))
  batch = trainer.partitioning.global_batch(_batch(), setup.mesh)
  state, metrics = setup.train_step(state, batch, jax.random.key(1))
  # the loss is task + 3 R_s + 2 D_Breg, each per row; at step 0 the teacher is theta itself: D_Breg = 0
  assert float(metrics["smart_bregman"]) == pytest.approx(0.0, abs=1e-7)
  assert float(metrics["loss"]) == pytest.approx(
      float(metrics["task_loss"]) + 3 * float(metrics["smart_adversarial"]), rel=1e-6)
  assert float(metrics["smart_adversarial"]) > 0
  theta1 = jax.device_get(state.params)
  want = jax.tree.map(lambda t, o: 0.01 * t + 0.99 * o, theta1, theta0)  # beta 0.99 in the first 10%
  assert all(jax.tree.leaves(jax.tree.map(lambda a, b: np.allclose(a, b, atol=1e-7),
                                          jax.device_get(state.teacher), want)))
  beta = smart.momentum(config.smart, 80)
  assert [float(beta(s)) for s in (0, 7, 8, 79)] == pytest.approx([0.99, 0.99, 0.999, 0.999])
  state, metrics = setup.train_step(state, batch, jax.random.key(1))
  assert float(metrics["smart_bregman"]) > 0


# ---- seeds and expected maximum ----

@slow  # an end-to-end chain; its parts are tested in the suite (BERT_JAX_SLOW_TESTS=1)
def test_each_seed_drives_only_its_own_stream(tmp_path):
  """One run with three different seeds: its initial parameters, first batch and first step are those of
  the head seed, the data seed and the dropout seed alone (train.seed, 0, drives none of them)."""
  import test_finetune_e2e as e2e  # pylint: disable=import-outside-toplevel
  data = e2e._glue_dir(tmp_path / "data", lambda i, s, y: f"{s}\t{y}", ("0", "1"), ("sentence", "label"),
                       n_train=64, n_dev=32)
  run = trainer.start(load_config("configs/glue.py:sst2", e2e.TINY + [
      f"--config.data.data_dir={data}", "--config.train.tensorboard=false", "--config.train.head_seed=1",
      "--config.train.data_seed=2", "--config.train.dropout_seed=3",
      "--config.optimizer.warmup_ratio=0.0"]), str(tmp_path / "run"))  # the first step moves the parameters
  setup, get = run.setup, jax.device_get
  same = lambda a, b: all(jax.tree.leaves(jax.tree.map(np.array_equal, get(a), get(b))))  # noqa: E731
  assert same(run.state.params, setup.init_params(jax.random.key(1)))
  assert not same(run.state.params, setup.init_params(jax.random.key(0)))
  batches = {seed: next(trainer.train_batches(run.learner.task.train, 16, seed, 0, 1)) for seed in (0, 2)}
  assert not np.array_equal(batches[0]["input_ids"], batches[2]["input_ids"])
  batch = trainer.partitioning.global_batch(batches[2], setup.mesh)
  fresh = lambda: setup.make_state(setup.init_params(jax.random.key(1)))  # noqa: E731  (compiled by the run)
  by_seed = {seed: get(setup.train_step(fresh(), batch, jax.random.key(seed))[0].params)  # the state is donated
             for seed in (0, 3)}
  run.advance(1)
  assert same(run.state.params, by_seed[3]) and not same(by_seed[0], by_seed[3])
  assert trainer.seeds(ml_collections.ConfigDict({"seed": 7, "head_seed": -1, "data_seed": 3,
                                                  "dropout_seed": -1})) == {"head": 7, "data": 3, "dropout": 7}


def test_expected_max_matches_enumeration_and_hand_value():
  assert sweep.expected_max([0.5, 0.7, 0.9], 2) == pytest.approx(0.5 / 9 + 0.7 * 3 / 9 + 0.9 * 5 / 9)
  scores = [0.61, 0.55, 0.61, 0.72, 0.58]  # a tie included
  for n in (1, 2, 3):
    draws = [max(c) for c in itertools.product(scores, repeat=n)]
    assert sweep.expected_max(scores, n) == pytest.approx(np.mean(draws))
  assert sweep.expected_max(scores, 1) == pytest.approx(np.mean(scores))
  row = sweep.summarize({sweep.Setting(1e-3, 16, 1.0): {"scores": scores, "fraction": 1.0}})[0]
  assert row["expected_max"][0] == pytest.approx(np.mean(scores)) and row["expected_max"][-1] < 0.72
  assert all(np.diff(row["expected_max"]) >= 0)


def test_sweep_varies_the_chosen_seed_only():
  config = _config("--config.sweep.vary_seed=data", "--config.train.mode=adapters")
  c = sweep.run_config(config, sweep.Setting(1e-3, 16, 2.0), 5)
  assert (c.train.seed, c.train.data_seed, c.train.head_seed) == (0, 5, -1)
  assert c.optimizer.frozen_learning_rate == 1e-3 and c.optimizer.learning_rate == 2e-5
