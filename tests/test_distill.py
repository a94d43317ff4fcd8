"""Distillation: KD losses against NumPy, DistilBERT's layer init, and the task distillation job on the one
loop: SIGTERM saves and the same command resumes exactly, a busy workdir and an int8 teacher are refused."""
import json
import os
import signal

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import data_fixtures
from bert_jax import cli, params_checkpoint, run_lock
from bert_jax.finetune import heads, init
from bert_jax.training import checkpoint, metrics
from bert_jax.compress import distill, teacher as teacher_lib
from bert_jax.configs import distill as distill_configs
from bert_jax.errors import UserError
from bert_jax.models import families
from bert_jax.models.config import ModelConfig
from bert_jax.ops import distill_losses as losses
from core_helpers import slow

RNG = np.random.default_rng(0)


def _log_softmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_soft_target_loss_is_t_squared_kl_and_logit_mse_a_squared_distance():
  s, t, temperature = RNG.normal(size=(3, 4)), RNG.normal(size=(3, 4)) * 3, 2.5
  p, log_q = np.exp(_log_softmax(t / temperature)), _log_softmax(s / temperature)
  expected = temperature ** 2 * np.sum(p * (np.log(p) - log_q))
  np.testing.assert_allclose(losses.soft_target_sum(jnp.asarray(s), jnp.asarray(t), temperature), expected,
                             rtol=1e-5)
  assert float(losses.soft_target_sum(jnp.asarray(t), jnp.asarray(t), temperature)) == pytest.approx(0, abs=1e-5)
  np.testing.assert_allclose(losses.logit_mse_sum(jnp.asarray(s), jnp.asarray(t)), np.sum((s - t) ** 2), rtol=1e-5)


def test_hidden_and_attention_mse_average_over_valid_tokens_only():
  mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0]])
  hs, ht = RNG.normal(size=(2, 2, 4, 3)), RNG.normal(size=(2, 2, 4, 3))
  expected = sum(np.mean((hs[l, b, :n] - ht[l, b, :n]) ** 2) for l in range(2) for b, n in enumerate((3, 2)))
  np.testing.assert_allclose(losses.hidden_mse_sum(jnp.asarray(hs), jnp.asarray(ht), jnp.asarray(mask)),
                             expected, rtol=1e-5)
  a_s, a_t = RNG.random(size=(2, 2, 3, 4, 4)), RNG.random(size=(2, 2, 3, 4, 4))
  expected = sum(np.mean((a_s[l, b, :, :n] - a_t[l, b, :, :n]) ** 2) for l in range(2)
                 for b, n in enumerate((3, 2)))
  np.testing.assert_allclose(losses.attention_mse_sum(jnp.asarray(a_s), jnp.asarray(a_t), jnp.asarray(mask)),
                             expected, rtol=1e-5)


def test_pkd_loss_compares_unit_vectors():
  cs, ct = RNG.normal(size=(2, 3, 5)), RNG.normal(size=(2, 3, 5))
  unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
  np.testing.assert_allclose(losses.pkd_sum(jnp.asarray(cs), jnp.asarray(ct)),
                             np.sum((unit(cs) - unit(ct)) ** 2), rtol=1e-5)
  assert float(losses.pkd_sum(jnp.asarray(cs), jnp.asarray(cs * 7.0))) == pytest.approx(0, abs=1e-6)


def test_layer_maps():
  assert teacher_lib.chosen_layers("every_other", 6) == (0, 2, 4)
  assert distill.layer_map(3, 6, (0, 2, 4)) == (1, 3, 5)
  assert distill.layer_map(2, 6, None) == (3, 6)  # TinyBERT's uniform map, top to top


@pytest.mark.parametrize("scan", [True, False])
def test_student_layers_equal_the_teachers_chosen_layers(scan):
  cfg = ModelConfig(vocab_size=50, hidden_size=16, num_layers=5, num_heads=2, intermediate_size=32,
                    max_position_embeddings=16, scan_layers=scan)
  ids = jnp.ones((1, 8), jnp.int32)
  teacher = heads.FinetuneModel(heads.encoder_config(cfg, "classification", "pooled"), "classification", 2)
  params = jax.jit(lambda r: teacher.init(r, ids, ids, ids * 0)["params"])(jax.random.key(1))
  chosen = (0, 2, 4)
  student_params = teacher_lib.take_layers(params, cfg, chosen)
  student = heads.FinetuneModel(heads.encoder_config(cfg.replace(num_layers=3), "classification", "pooled"),
                                "classification", 2)
  abstract = jax.eval_shape(lambda: student.init(jax.random.key(0), ids, ids, ids * 0)["params"])
  assert jax.tree.structure(abstract) == jax.tree.structure(student_params)
  for j, i in enumerate(chosen):
    if scan:
      got = jax.tree.map(lambda x: x[j], student_params["encoder"]["layers"])  # noqa: B023
      want = jax.tree.map(lambda x: x[i], params["encoder"]["layers"])  # noqa: B023
    else:
      got, want = student_params["encoder"][f"layer_{j}"], params["encoder"][f"layer_{i}"]
    jax.tree.map(np.testing.assert_array_equal, got, want)
  np.testing.assert_array_equal(student_params["head"]["classifier"]["kernel"],
                                params["head"]["classifier"]["kernel"])


TEACHER = ModelConfig(vocab_size=8192, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                      max_position_embeddings=32)
STUDENT = ["--config.model.vocab_size=8192", "--config.model.num_layers=1", "--config.model.hidden_size=32",
           "--config.model.num_heads=2", "--config.model.intermediate_size=64", "--config.model.max_position_embeddings=32",
           "--config.data.max_seq_length=32", "--config.train.batch_size=16", "--config.train.eval_batch_size=32",
           "--config.train.log_every_steps=1", "--config.train.epochs=1", "--config.train.tensorboard=false",
           "--config.train.keep_best=false", "--config.distill.hidden_weight=1"]


@pytest.fixture(scope="module")
def task_teacher(tmp_path_factory):
  """A fine-tuning workdir of sst2 with random 2-layer parameters and the embedded vocabulary, and 64
  training rows of the first-word task: (teacher, data)."""
  directory = tmp_path_factory.mktemp("distill") / "teacher"
  model = heads.encoder_config(TEACHER, "classification", "pooled")
  ids = jnp.ones((1, 8), jnp.int32)
  params = nn.meta.unbox(jax.jit(lambda r: heads.FinetuneModel(model, "classification", 2).init(
      r, ids, ids, ids * 0)["params"])(jax.random.key(0)))
  vocab = data_fixtures.embedded_paths()[1]
  params_checkpoint.save_params(directory, params, {
      "task": {"family": "glue", "name": "sst2", "head": "classification", "num_labels": 2, "labels": ["0", "1"]},
      "model": model.to_dict(), "head": {"pooling": "pooled", "dropout": 0.1},
      "data": {"vocab": "vocab.txt", "tokenizer": "wordpiece", "lower_case": True}}, {"vocab.txt": vocab})
  data = data_fixtures.write_first_word_sst2(tmp_path_factory.mktemp("sst2"), n_train=64, n_dev=32)
  return str(directory), data


def _command(workdir, teacher, data, *extra):
  return ["distill", "--config", "configs/distill.py:sst2", "--workdir", str(workdir), *STUDENT,
          f"--config.distill.teacher={teacher}", f"--config.data.data_dir={data}", *extra]


def test_a_student_copied_from_its_teacher_starts_at_zero_distillation_loss(task_teacher, tmp_path, capsys):
  """A student made of all the teacher's layers (student_layers=0,1), dropout off: its first step's soft-target
  KL and hidden-state MSE are 0 (the teacher's params reached the step and the student starts as the teacher);
  the run ends with a `done:` line and the student's params without the distillation extras."""
  teacher, data = task_teacher
  workdir = tmp_path / "copy"
  assert cli.main(_command(workdir, teacher, data, "--config.distill.student_layers=0,1",
                           "--config.model.hidden_dropout=0", "--config.model.attention_dropout=0",
                           "--config.head.dropout=0", "--config.train.epochs=1")) == 0
  assert capsys.readouterr().out.strip().splitlines()[-1].startswith("done: dev accuracy ")
  rows = [json.loads(line) for line in open(workdir / "metrics.jsonl")]
  first = next(r for r in rows if r["step"] == 1 and not r.get("eval"))
  assert first["soft_loss"] == pytest.approx(0, abs=1e-6) and first["hidden_loss"] == pytest.approx(0, abs=1e-6)
  assert first["hard_loss"] > 0.1  # random labels of a random teacher: the hard loss is not 0
  last = [r for r in rows if not r.get("eval")][-1]
  assert last["step"] == 4 and last["soft_loss"] > 1e-8  # the student moved away from its teacher
  params, _ = checkpoint.load_params(workdir)
  assert "distill" not in params


@slow  # ~20 s quiet: the one driver's pause path is covered by pretraining's and fine-tuning's SIGTERM tests
def test_sigterm_during_distill_saves_says_where_and_the_same_command_resumes(task_teacher, tmp_path, monkeypatch,
                                                                               capsys):
  """SIGTERM while step 2's row is written: the student's state is saved at step 3, the run says so and
  exits 143; the same command resumes there and ends with the parameters of a run never stopped, and
  with a `done:` line like every job."""
  teacher, data = task_teacher
  assert cli.main(_command(tmp_path / "straight", teacher, data)) == 0
  log_train = metrics.MetricsLogger.log_train

  def terminate_at_2(self, step, *args, **kwargs):
    row = log_train(self, step, *args, **kwargs)
    if step == 2:
      os.kill(os.getpid(), signal.SIGTERM)
    return row

  capsys.readouterr()
  with monkeypatch.context() as m:
    m.setattr(metrics.MetricsLogger, "log_train", terminate_at_2)
    assert cli.main(_command(tmp_path / "student", teacher, data)) == 143
  out = capsys.readouterr().out
  assert "SIGTERM: saved a checkpoint at step 3; rerun the same command to resume" in out
  assert out.strip().splitlines()[-1] == (f"stopped at step 3/4 by SIGTERM | train state in {tmp_path}/student/state | "
                                          "next: the same command resumes")
  assert cli.main(_command(tmp_path / "student", teacher, data)) == 0
  out = capsys.readouterr().out
  assert f"resumed from {tmp_path}/student/state/3" in out
  assert out.strip().splitlines()[-1].startswith("done: dev accuracy ")
  assert f"next: bert-jax predict --model {tmp_path}/student --input FILE" in out
  rows = [json.loads(line) for line in open(tmp_path / "student" / "metrics.jsonl")]
  assert [r["step"] for r in rows if not r.get("eval")] == [1, 2, 3, 4]
  a, _ = checkpoint.load_params(tmp_path / "straight")
  b, _ = checkpoint.load_params(tmp_path / "student")
  assert "distill" not in b  # the projection stays out of the student's params
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-6), a, b)


@pytest.fixture(scope="module")
def mlm_teacher(tmp_path_factory):
  """A pretraining checkpoint (MLM head, zeros) with the embedded vocabulary: general distillation's teacher."""
  model = TEACHER.replace(mlm_head=True)
  ids = jnp.ones((1, 8), jnp.int32)
  shapes = jax.eval_shape(lambda: families.build(model).init(jax.random.key(0), ids)["params"])
  directory = tmp_path_factory.mktemp("distill") / "mlm_teacher"
  params_checkpoint.save_params(directory, jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), nn.meta.unbox(shapes)),
                                {"objective": "bert", "model": model.to_dict(),
                                 "data": {"vocab": "vocab.txt", "tokenizer": "wordpiece", "lower_case": True}},
                                {"vocab.txt": data_fixtures.embedded_paths()[1]})
  return str(directory)


@pytest.mark.parametrize("config, teacher", [("configs/distill.py:sst2", "task_teacher"),
                                             ("configs/distill.py:general-tiny", "mlm_teacher")])
def test_a_second_distill_in_a_busy_workdir_is_refused(request, tmp_path, capsys, config, teacher):
  """The teacher is read and checked first (before anything is written), then the workdir's lock refuses."""
  location = request.getfixturevalue(teacher)
  location = location[0] if isinstance(location, tuple) else location
  with run_lock.hold(str(tmp_path)):
    code = cli.main(["distill", "--config", config, "--workdir", str(tmp_path),
                     f"--config.distill.teacher={location}"])
  err = capsys.readouterr().err.strip()
  assert code == 2 and f"workdir {tmp_path} is in use by another run (host " in err and "\n" not in err, err
  assert os.listdir(tmp_path) == []  # nothing written; the holder's lock went with it


@pytest.mark.parametrize("config, task", [("configs/distill.py:sst2", {"task": {"name": "sst2"}}),
                                          ("configs/distill.py:general-tiny", {})])
def test_an_int8_teacher_is_refused_before_anything_else(tmp_path, capsys, config, task):
  (tmp_path / "int8").mkdir()
  (tmp_path / "int8" / "config.json").write_text(json.dumps(
      {**task, "model": {"vocab_size": 99}, "quantization": {"weights": "int8", "source": "runs/float"}}))
  code = cli.main(["distill", "--config", config, "--workdir", str(tmp_path / "s"),
                   f"--config.distill.teacher={tmp_path / 'int8'}"])
  err = capsys.readouterr().err.strip()
  assert code == 2 and err.endswith(f"distill.teacher={tmp_path / 'int8'} holds int8 weights (bert-jax quantize); "
                                    "distil from the float model it came from: distill.teacher=runs/float"), err


def _pd_command(teacher, data):
  return ["distill", "--config", "configs/distill.py:pd", "--config.train.batch_size=16",
          "--config.train.epochs=1", "--config.data.max_seq_length=8", "--config.train.log_every_steps=1",
          "--config.train.tensorboard=false", f"--config.distill.teacher={teacher}", f"--config.data.data_dir={data}"]


def test_pre_trained_distillation_without_a_pretrained_student_is_one_line(task_teacher, tmp_path, capsys):
  """configs/distill.py:pd (Turc et al. 2019) without init_from: one line and exit 2 before anything is written."""
  teacher, data = task_teacher
  command = _pd_command(teacher, data)
  assert cli.main([*command, "--workdir", str(tmp_path / "refused")]) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("bert-jax distill: error: pre-trained distillation distils a pretrained compact student: set "
                        "--config.init_from"), err
  assert not (tmp_path / "refused").exists() or os.listdir(tmp_path / "refused") == []


@slow  # a distillation run; the refusal above is the default suite's
def test_pre_trained_distillation_learns_from_the_pretrained_student_and_soft_labels_alone(task_teacher, tmp_path):
  """configs/distill.py:pd with init_from (here the teacher's own workdir stands in for a pretrained compact
  student): the student starts from init_from's encoder (at learning rate 1e-9 it ends there within 1e-6)
  and its loss is the soft-label loss alone (hard_weight 0, temperature 1)."""
  teacher, data = task_teacher
  command = _pd_command(teacher, data)
  assert cli.main([*command, "--workdir", str(tmp_path / "pd"), f"--config.init_from={teacher}",
                   "--config.optimizer.learning_rate=1e-9"]) == 0
  student, _ = checkpoint.load_params(tmp_path / "pd")
  start, _ = checkpoint.load_params(teacher)
  encoder = [k for k in init.ENCODER_KEYS if k in start]
  assert encoder and all(k in student for k in encoder)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6),  # a fresh init is ~0.02 away
               {k: student[k] for k in encoder}, {k: start[k] for k in encoder})
  rows = [json.loads(line) for line in (tmp_path / "pd" / "metrics.jsonl").read_text().splitlines()]
  train = [r for r in rows if "soft_loss" in r and not r.get("eval")]
  assert len(train) == 4 and all(r["loss"] == pytest.approx(r["soft_loss"], rel=1e-6) for r in train), train
  assert all(r["hard_loss"] > 0 for r in train)  # computed and logged, weighted 0


@slow  # a distillation run (suite time: two quiet CIs at 898.9 s and 902.6 s); the BiLSTM's numerics: test_bilstm
def test_a_bilstm_student_distils_predicts_and_refuses_hf_export(task_teacher, tmp_path, capsys):
  """configs/distill.py:bilstm (Tang et al. 2019): the BiLSTM student trains on hard labels + logit MSE; its
  workdir is a fine-tuning workdir: `predict` on the dev file agrees with the run's own final dev accuracy;
  `convert --to hf` and a transformer-only loss are one line and exit 2."""
  teacher, data = task_teacher
  command = ["distill", "--config", "configs/distill.py:bilstm", "--config.model.vocab_size=8192",
             "--config.model.embedding_size=16", "--config.model.lstm_size=8", "--config.model.hidden_size=16",
             "--config.data.max_seq_length=32", "--config.train.batch_size=16", "--config.train.epochs=1",
             "--config.train.log_every_steps=1", "--config.train.tensorboard=false", "--config.train.keep_best=false",
             f"--config.distill.teacher={teacher}", f"--config.data.data_dir={data}"]
  assert cli.main([*command, "--workdir", str(tmp_path / "refused"), "--config.distill.hidden_weight=1"]) == 2
  assert "the bilstm student has no transformer layers to match the teacher's" in capsys.readouterr().err
  student = str(tmp_path / "bilstm")
  assert cli.main([*command, "--workdir", student]) == 0
  assert json.loads((tmp_path / "bilstm" / "config.json").read_text())["model"]["family"] == "bilstm"
  rows = [json.loads(line) for line in (tmp_path / "bilstm" / "metrics.jsonl").read_text().splitlines()]
  train = [r for r in rows if "soft_loss" in r and not r.get("eval")]
  assert len(train) == 4 and all(r["loss"] == pytest.approx(0.5 * (r["hard_loss"] + r["soft_loss"]), rel=1e-5)
                                 for r in train), train
  accuracy = data_fixtures.predict_accuracy(student, data, tmp_path / "predictions.jsonl")
  final = json.loads((tmp_path / "bilstm" / "eval_results.json").read_text())["accuracy"]
  assert accuracy == pytest.approx(final)
  capsys.readouterr()
  assert cli.main(["convert", "--to", "hf", student, str(tmp_path / "hf")]) == 2
  err = capsys.readouterr().err.strip()
  assert err.endswith("the bilstm family has no Hugging Face layout (transformers has no such model); keep it in "
                    "bert_jax's format (predict reads it)") and "\n" not in err, err


def test_a_bilstm_wider_than_the_teacher_needs_no_projection_but_a_wider_bert_student_does():
  """A BiLSTM's hidden_size is its ReLU layer (Tang et al.'s 400 over a 384-wide MiniLM teacher): only the
  logits are compared, so no projection is asked for; a wider transformer student still needs one."""
  cfg = distill_configs.get_config("bilstm").distill
  teacher = ModelConfig(hidden_size=384, num_heads=12, num_layers=6, intermediate_size=1536)
  distill.validate(cfg, families.model_config({"family": "bilstm", "hidden_size": 400}), teacher, "classification")
  wide = ModelConfig(hidden_size=400, num_heads=4, num_layers=2, intermediate_size=800)
  with pytest.raises(UserError, match="is wider than the teacher"):
    distill.validate(cfg, wide, teacher, "classification")
