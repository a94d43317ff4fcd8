"""MobileBERT's progressive knowledge transfer from IB-BERT (objective mobilebert_pkt, configs/mobilebert.py:
ib_bert, ib_tiny, pkt_tiny): the teacher's size against the paper and transformers, the feature-map and
attention losses against NumPy, exact freezing across a stage's steps, each stage's loss, and (slow) the
per-layer feature-map loss falling stage by stage on the embedded corpus."""
import functools
import json
import shutil

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bert_jax import cli, jobs, params_checkpoint, presets
from bert_jax.compress import general
from bert_jax.config_utils import load_config
from bert_jax.data_pipelines import embedded
from bert_jax.errors import UserError
from bert_jax.models import families
from bert_jax.models.config import ModelConfig
from bert_jax.ops import distill_losses as losses
from bert_jax.training import info, step as step_lib
from bert_jax.training.objectives import model_inputs
from bert_jax.training.objectives.mobilebert_pkt import ProgressiveTransfer, check
from core_helpers import random_batch, random_like, slow

VOCAB = 128
STUDENT = dict(vocab_size=VOCAB, hidden_size=16, num_layers=3, num_heads=2, intermediate_size=16,
               embedding_size=8, intra_bottleneck_size=8, num_feedforward_networks=2, max_position_embeddings=32,
               attention_dropout=0.0, initializer_range=0.3)  # wide weights: attention rows far from uniform
TEACHER = dict(STUDENT, intermediate_size=64, intra_bottleneck_size=32, num_feedforward_networks=1,
               key_query_shared_bottleneck=False, normalization_type="layer_norm", hidden_act="gelu")


def _model(**fields):
  return families.model_config({**fields, "family": "mobilebert"})


def _pkt_cfg(stage_steps=2, **overrides):
  """configs/mobilebert.py:pkt_tiny's distill section with `overrides`."""
  cfg = load_config("configs/mobilebert.py:pkt_tiny").distill.copy_and_resolve_references()
  cfg.update(dict(stage_steps=stage_steps, **overrides))
  return cfg


def _hand_count(m):
  """IB-BERT's backbone counted from the paper's figure 1(b): embeddings (E-wide tokens read as trigrams,
  projected to H, positions, types, LayerNorm), per layer an H -> I bottleneck and its LayerNorm, query, key
  and value from the H-wide block input, the I -> I attention output and LayerNorm, one FFN (I -> F -> I)
  and its LayerNorm, the I -> H bottleneck out and its LayerNorm; the pooler."""
  v, e, h, i, f, p = (m.vocab_size, m.embedding_size, m.hidden_size, m.intra_bottleneck_size,
                      m.intermediate_size, m.max_position_embeddings)
  embeddings = v * e + (3 * e * h + h) + p * h + 2 * h + 2 * h
  layer = ((h * i + i + 2 * i) + 3 * (h * i + i) + (i * i + i + 2 * i) + (i * f + f) + (f * i + i + 2 * i)
           + (i * h + h + 2 * h))
  return embeddings + m.num_layers * layer + h * h + h


@pytest.mark.parametrize("preset", ["ib_bert", "ib_tiny"])
def test_ib_bert_presets_have_the_papers_size(preset):
  """IB-BERT_LARGE: 294,467,840 backbone parameters (embeddings, encoder, pooler), the paper's 293M within
  0.6%, as counted by hand; its inter-block width, heads and layers are the student's. (transformers'
  MobileBertModel cannot hold it: with key_query_shared_bottleneck=False its query and key read the
  block input but are built intra_bottleneck_size wide.)"""
  config = load_config(f"configs/mobilebert.py:{preset}")
  counted = presets.backbone_params(config.model)
  assert counted == _hand_count(config.model)
  student = load_config(f"configs/mobilebert.py:{'base' if preset == 'ib_bert' else 'tiny'}").model
  assert (config.model.hidden_size, config.model.num_heads, config.model.num_layers) == (
      student.hidden_size, student.num_heads, student.num_layers)
  assert (config.model.normalization_type, config.model.hidden_act, config.model.num_feedforward_networks) == (
      "layer_norm", "gelu", 1)
  if preset == "ib_bert":
    assert counted == 294_467_840 and abs(counted / 293e6 - 1) < 0.006
    assert (config.model.intra_bottleneck_size, config.model.intermediate_size) == (1024, 4096)


def test_feature_map_and_attention_losses_against_numpy():
  rng = np.random.default_rng(0)
  layers, batch, heads, length, width = 2, 3, 2, 5, 4
  mask = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 0, 0, 0]], np.float32)
  hs, ht = rng.normal(size=(2, layers, batch, length, width))
  expected = np.sum(np.mean((hs - ht) ** 2, -1) * mask, axis=(1, 2))
  np.testing.assert_allclose(losses.feature_map_sums(jnp.asarray(hs), jnp.asarray(ht), jnp.asarray(mask)),
                             expected, rtol=1e-5)

  def probs(logits):  # softmax over the real keys; padding keys exactly 0, as the model's
    logits = np.where(mask[None, :, None, None, :] > 0, logits, -np.inf)
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)

  a_s, a_t = (probs(rng.normal(size=(layers, batch, heads, length, length))) for _ in range(2))
  with np.errstate(divide="ignore", invalid="ignore"):
    kl = np.nansum(np.where(a_t > 0, a_t * np.log(a_t / a_s), 0.0), -1)  # [L, B, N, T]
  expected = np.sum(kl.mean(2) * mask, axis=(1, 2))
  got = losses.attention_kl_sums(jnp.asarray(a_s, jnp.float32), jnp.asarray(a_t, jnp.float32), jnp.asarray(mask))
  np.testing.assert_allclose(got, expected, rtol=1e-5)
  assert expected.min() > 0
  grad = jax.grad(lambda s: losses.attention_kl_sums(s, jnp.asarray(a_t, jnp.float32), jnp.asarray(mask)).sum())(
      jnp.asarray(a_s, jnp.float32))
  assert np.isfinite(np.asarray(grad)).all()


def _objective(stage_steps=2, **distill):
  return ProgressiveTransfer(_model(**STUDENT), _model(**TEACHER), "unused", _pkt_cfg(stage_steps, **distill))


def _init(objective, batch):
  """Student and teacher weights, wide (std 0.3) so that attention rows are far from uniform."""
  student = nn.meta.unbox(jax.eval_shape(objective.init, jax.random.key(0), batch))
  teacher = nn.meta.unbox(jax.eval_shape(lambda r: objective.teacher.init(r, **model_inputs(batch))["params"],
                                         jax.random.key(1)))
  return (jax.tree.map(jnp.asarray, random_like(student, STUDENT["initializer_range"], 0)),
          jax.tree.map(jnp.asarray, random_like(teacher, TEACHER["initializer_range"], 1)))


@pytest.fixture(scope="module")
def setting():
  """A 3-layer student and teacher, a batch, and a jitted staged step with AdamW (weight decay, momentum)."""
  objective = _objective(stage_steps=2)
  batch = {k: jnp.asarray(v) for k, v in random_batch(seed=1, batch=4, vocab=VOCAB).items()}
  student, teacher = _init(objective, batch)
  tx = optax.adamw(1e-2, weight_decay=0.1)
  run = jax.jit(functools.partial(step_lib.staged_step, objective=objective, tx=tx,
                                  schedule=optax.constant_schedule(1e-2), grad_accum_steps=1, param_specs=None,
                                  axis_rules=()))
  return objective, batch, student, teacher, tx, run


def _layer(params, i):
  return jax.tree.map(lambda x: np.asarray(x[i]), params["encoder"]["layers"])


def _same(a, b):
  return all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def test_a_stage_moves_its_layer_only_and_frozen_params_stay_bit_identical(setting):
  """Two steps of stage 0 (layer 0 and the embeddings), then two of stage 1: in stage 1 layer 0 and the
  embeddings keep their values bit for bit although AdamW's moments and weight decay would move them; layer 1
  moves; layer 2, the pooler and the heads never move before distillation."""
  objective, batch, student, teacher, tx, run = setting
  state = step_lib.TrainState(jnp.zeros((), jnp.int32), student, tx.init(student))
  history = [state.params]
  stages = []
  for _ in range(4):
    state, metrics = run(state, batch, jax.random.key(0), teacher)
    history.append(jax.device_get(state.params))
    stages.append(int(metrics["stage"]))
  assert stages == [0, 0, 1, 1]
  start, after0, after1 = history[0], history[2], history[4]
  assert not _same(_layer(start, 0), _layer(after0, 0))
  assert not _same(start["embeddings"], after0["embeddings"])
  assert _same(_layer(after0, 0), _layer(after1, 0)) and _same(after0["embeddings"], after1["embeddings"])
  assert _same(_layer(start, 1), _layer(after0, 1)) and not _same(_layer(after0, 1), _layer(after1, 1))
  assert _same(_layer(start, 2), _layer(after1, 2))
  for head in ("pooler", "mlm_head", "sentence_classifier"):
    assert _same(start[head], after1[head]), head


@pytest.mark.parametrize("scan", [True, False])
def test_what_each_stage_trains(scan):
  """Stage 0: layer 0 and the embeddings; stage 1: layer 1; stage L: everything (scanned, stacked layers get a
  column; unrolled ones a scalar each)."""
  objective = ProgressiveTransfer(_model(**STUDENT, scan_layers=scan), _model(**TEACHER), "unused", _pkt_cfg())
  batch = {k: jnp.asarray(v) for k, v in random_batch(batch=1, vocab=VOCAB).items()}
  params = nn.meta.unbox(jax.eval_shape(objective.init, jax.random.key(0), batch))

  def trained(stage):
    flags = objective.trains(jnp.asarray(stage), params)
    layers = ([bool(np.all(jax.tree.leaves(flags["encoder"])[0][i])) for i in range(3)] if scan else
              [bool(jax.tree.leaves(flags["encoder"][f"layer_{i}"])[0]) for i in range(3)])
    heads = {bool(x) for k in ("pooler", "mlm_head", "sentence_classifier") for x in jax.tree.leaves(flags[k])}
    return layers, {bool(x) for x in jax.tree.leaves(flags["embeddings"])}, heads

  assert trained(0) == ([True, False, False], {True}, {False})
  assert trained(1) == ([False, True, False], {False}, {False})
  assert trained(2) == ([False, False, True], {False}, {False})
  assert trained(3) == ([True, True, True], {True}, {True})


def test_each_stage_has_its_loss(setting):
  """Stage l's loss is feature_weight x FMT_l + attention_weight x AT_l (the logged per-layer losses, against
  a NumPy recomputation from the models' outputs); the last stage's is alpha MLM + (1 - alpha) KD + NSP."""
  _, batch, student, teacher, _, _ = setting
  objective = _objective(stage_steps=2, feature_weight=2.0, attention_weight=3.0, alpha=0.25)
  bound = objective.with_teacher(teacher)

  @jax.jit
  def scored(stage):
    staged = bound.at_stage(stage)
    sums = staged.sums(student, batch, None, deterministic=True)
    counts = staged.counts(batch)
    return staged.loss(sums, counts), staged.metrics(sums, counts)

  kwargs = dict(**model_inputs(batch), output_hidden_states=True, output_attentions=True)
  s, t = jax.jit(lambda s, t: (objective.model.apply({"params": s}, **kwargs),
                               objective.teacher.apply({"params": t}, **kwargs)))(student, teacher)
  mask = np.asarray(batch["input_mask"], np.float64)
  hs, ht = (np.asarray(x.hidden_states, np.float64) for x in (s, t))
  a_s, a_t = (np.asarray(x.attentions, np.float64) for x in (s, t))
  for layer in range(3):
    loss, metrics = scored(layer)
    fmt = np.sum(np.mean((hs[layer + 1] - ht[layer + 1]) ** 2, -1) * mask) / mask.sum()
    with np.errstate(divide="ignore", invalid="ignore"):
      kl = np.where(a_t[layer] > 0, a_t[layer] * np.log(a_t[layer] / a_s[layer]), 0.0).sum(-1)
    at = np.sum(kl.mean(1) * mask) / mask.sum()
    np.testing.assert_allclose(metrics[f"feature_loss_l{layer}"], fmt, rtol=1e-4)
    np.testing.assert_allclose(metrics[f"attention_loss_l{layer}"], at, rtol=1e-4)
    np.testing.assert_allclose(loss, 2.0 * fmt + 3.0 * at, rtol=1e-4)
    assert int(metrics["stage"]) == layer
  loss, metrics = scored(3)
  expected = 0.25 * metrics["mlm_loss"] + 0.75 * metrics["soft_loss"] + metrics["nsp_loss"]
  np.testing.assert_allclose(loss, expected, rtol=1e-5)
  assert float(metrics["soft_loss"]) > 0


def test_stage_of_the_step_and_config_errors():
  objective = _objective(stage_steps=5)
  assert [int(objective.stage_of(jnp.asarray(s))) for s in (0, 4, 5, 14, 15, 99)] == [0, 0, 1, 2, 3, 3]
  student, teacher = _model(**STUDENT), _model(**TEACHER)
  with pytest.raises(UserError, match="distill.stage_steps=0 must be >= 1"):
    check(student, teacher, _pkt_cfg(0))
  with pytest.raises(UserError, match="num_heads 2 differs from the teacher's 4"):
    check(student, _model(**{**TEACHER, "num_heads": 4}), _pkt_cfg(1))
  with pytest.raises(UserError, match="distill.alpha"):
    check(student, teacher, _pkt_cfg(1, alpha=1.5))
  with pytest.raises(UserError, match="from a MobileBERT-family teacher"):
    check(student, ModelConfig(num_layers=3, hidden_size=16, num_heads=2, vocab_size=VOCAB), _pkt_cfg(1))
  with pytest.raises(UserError, match="student_layers='every_other'"):
    check(student, teacher, _pkt_cfg(1, student_layers="every_other"))


def test_ib_bert_export_to_hf_is_refused_in_one_line():
  config = families.model_config(load_config("configs/mobilebert.py:ib_tiny").model.to_dict())
  with pytest.raises(UserError, match="has no Hugging Face layout"):
    families.get("mobilebert").hf.write_config(config)
  assert families.get("mobilebert").hf.write_config(families.model_config(
      load_config("configs/mobilebert.py:tiny").model.to_dict()))["intra_bottleneck_size"] == 32


def test_the_teacher_preset_builds_through_the_pretraining_job():
  """ib_tiny is a pretraining preset like any: `bert-jax info`'s count of its step is the presets table's."""
  config = load_config("configs/mobilebert.py:ib_tiny")
  built = jobs.with_step(config, "configs/mobilebert.py:ib_tiny", "info").step(config, None)
  assert presets.backbone_params(config.model) == info.model_info(*built)["num_params"]


# On the embedded corpus: a 2-layer student (pkt_tiny's network, narrower) and a random 2-layer IB-BERT teacher.
NARROW = ["--config.model.num_layers=2", "--config.model.hidden_size=32", "--config.model.intermediate_size=32",
          "--config.model.embedding_size=16", "--config.model.intra_bottleneck_size=16"]
RUN = NARROW + [
    "--config.data.max_seq_length=32", "--config.data.max_predictions_per_seq=5", "--config.train.batch_size=16",
    "--config.data.num_shards=2", "--config.data.shuffle_buffer=50", "--config.train.eval_every_steps=0",
    "--config.checkpoint.every_steps=0", "--config.checkpoint.async_save=false", "--config.train.tensorboard=false",
    "--config.optimizer.decay=constant", "--config.optimizer.warmup_steps=0", "--config.train.log_every_steps=1"]


def _ib_teacher(directory, initialised=True):
  """An IB-BERT teacher's workdir (ib_tiny's kind of network at the student's width, random init, wide enough
  weights that its attention rows are far from uniform) with the embedded corpus's vocabulary; not
  `initialised`: zeros of the same shapes, for a test that reads only its config and shapes (no init program
  to compile)."""
  student = load_config("configs/mobilebert.py:pkt_tiny", NARROW)
  model = load_config("configs/mobilebert.py:ib_tiny", NARROW[:2] + [
      "--config.model.embedding_size=16", "--config.model.intermediate_size=128",
      "--config.model.intra_bottleneck_size=64", "--config.model.initializer_range=0.2"]).model.to_dict()
  network = families.build(families.model_config(model))
  batch = random_batch(batch=1, vocab=VOCAB)
  init = lambda r: network.init(r, **model_inputs(batch))["params"]  # noqa: E731
  params = nn.meta.unbox(jax.jit(init)(jax.random.key(7)) if initialised else
                         jax.tree.map(lambda a: np.zeros(a.shape, a.dtype), jax.eval_shape(init, jax.random.key(7))))
  directory.mkdir()
  shutil.copy(embedded.default_vocab(student.data), directory / "vocab.txt")
  params_checkpoint.save_params(directory, params, {"objective": "bert", "model": model,
                                                    "data": {"vocab": "vocab.txt", "tokenizer": "wordpiece",
                                                             "lower_case": True}})
  return directory


@pytest.fixture(scope="module")
def ib_teacher(tmp_path_factory):
  return _ib_teacher(tmp_path_factory.mktemp("ib") / "teacher")


def test_info_builds_the_staged_student_from_an_ib_bert_workdir(tmp_path, capsys):
  """`bert-jax info` of pkt_tiny reads the MobileBERT teacher's config, builds the staged step without data
  and counts the student."""
  ib_teacher = _ib_teacher(tmp_path / "teacher", initialised=False)
  assert cli.main(["info", "--json", "--config", "configs/mobilebert.py:pkt_tiny", *NARROW,
                   f"--config.distill.teacher={ib_teacher}", "--config.data.max_seq_length=32"]) == 0
  counted = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["num_params"]
  assert counted == presets.backbone_params(load_config("configs/mobilebert.py:pkt_tiny", NARROW).model)


def _distil(teacher, workdir, *extra):
  config = load_config("configs/mobilebert.py:pkt_tiny", RUN + [f"--config.distill.teacher={teacher}", *extra])
  return general.distill(config, str(workdir))


def _rows(workdir):
  return [r for r in map(json.loads, open(workdir / "metrics.jsonl")) if "stage" in r]


@slow  # ~1 min of CPU, mostly compiling (BERT_JAX_SLOW_TESTS=1)
def test_each_layers_transfer_losses_fall_in_its_stage(ib_teacher, tmp_path):
  """Two stages of 30 steps, then 10 of pre-training distillation, from a random teacher whose attention is far
  from uniform. Seen (means of 5 steps, stage start -> end): layer 0's feature-map loss 0.87 -> 0.36 and
  attention KL 0.38 -> 0.34 in stage 0; layer 1's 0.95 -> 0.44 and 0.26 -> 0.23 in stage 1, where layer 0's
  stays at 0.34-0.35 (frozen; it moves only with the batches)."""
  result = _distil(ib_teacher, tmp_path / "pkt", "--config.distill.stage_steps=30", "--config.train.num_steps=70",
                   "--config.optimizer.name=adamw", "--config.optimizer.learning_rate=1e-2")
  rows = _rows(tmp_path / "pkt")
  assert [r["stage"] for r in rows] == [0] * 30 + [1] * 30 + [2] * 10
  mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
  for layer in range(2):
    for loss, factor in (("feature", 0.6), ("attention", 0.95)):
      stage = [r[f"{loss}_loss_l{layer}"] for r in rows if r["stage"] == layer]
      assert mean(stage[-5:]) < factor * mean(stage[:5]), (layer, loss, stage)
  frozen = [r["feature_loss_l0"] for r in rows if r["stage"] == 1]
  assert abs(mean(frozen[-5:]) / mean(frozen[:5]) - 1) < 0.05, frozen
  mlm = [r["mlm_loss"] for r in rows if r["stage"] == 2]
  assert mean(mlm[-3:]) < mean(mlm[:3]) - 0.5, mlm
  saved = json.load(open(tmp_path / "pkt" / "config.json"))
  assert saved["objective"] == "mobilebert_pkt" and result["step"] == 70


@slow  # three short runs (BERT_JAX_SLOW_TESTS=1)
def test_a_run_stopped_and_resumed_across_a_stage_boundary_equals_the_uninterrupted_run(ib_teacher, tmp_path):
  """Stages of 2 steps: steps 0-1 train layer 0, 2-3 layer 1, 4-5 distil. Stopped after 3 steps (in stage 1)
  and resumed to 6, the run's params and last metrics equal the uninterrupted run's."""
  steps = ["--config.distill.stage_steps=2", "--config.optimizer.learning_rate=1e-2"]
  whole = _distil(ib_teacher, tmp_path / "whole", *steps, "--config.train.num_steps=6")
  _distil(ib_teacher, tmp_path / "parts", *steps, "--config.train.num_steps=3")
  parts = _distil(ib_teacher, tmp_path / "parts", *steps, "--config.train.num_steps=6")
  assert parts["step"] == whole["step"] == 6
  a, _ = params_checkpoint.load_params(str(tmp_path / "whole"))
  b, _ = params_checkpoint.load_params(str(tmp_path / "parts"))
  jax.tree.map(np.testing.assert_array_equal, a, b)
  assert [r["stage"] for r in _rows(tmp_path / "parts")] == [0, 0, 1, 1, 2, 2]
  assert {k: v for k, v in parts["train"].items() if "per_sec" not in k} == {
      k: v for k, v in whole["train"].items() if "per_sec" not in k}
