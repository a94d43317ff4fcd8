"""Compression end to end on a learnable GLUE-format task: a float teacher is fine-tuned through the
CLI; a student distilled from it beats the same student trained without it; the teacher's int8
version keeps its accuracy at under 30% of its bytes and `predict` serves it."""
import json
import os

import pytest

import data_fixtures
from bert_jax import cli
from core_helpers import slow

pytest.importorskip("qwix")

MODEL = ["--config.model.num_heads=2", "--config.model.max_position_embeddings=32",
         "--config.data.max_seq_length=32", "--config.train.batch_size=16",
         "--config.train.eval_batch_size=32", "--config.train.log_every_steps=16",
         "--config.optimizer.learning_rate=3e-3", "--config.train.tensorboard=false"]
STUDENT = ["--config.model.num_layers=1", "--config.model.hidden_size=32", "--config.model.intermediate_size=64"]


def _results(workdir):
  with open(os.path.join(workdir, "eval_results.json")) as f:
    return json.load(f)


@pytest.fixture(scope="module")
def teacher(sst2_finetuned):
  """The session's fine-tuned sst2 model (tests/conftest.py; 2 layers): (data_dir, workdir)."""
  data, workdir, _ = sst2_finetuned
  assert _results(workdir)["accuracy"] >= 0.95
  return data, workdir


@slow  # two 4-epoch student runs: ~60 s on 2 cores; the losses are tested against NumPy in the suite
def test_distilled_student_beats_the_student_without_teacher(teacher, tmp_path):
  """The distillation set's labels are coin flips: without the teacher the student stays near chance;
  with the teacher's soft targets (temperature 1, no hard loss) it learns the teacher's rule."""
  _, teacher_dir = teacher
  noisy = data_fixtures.write_first_word_sst2(tmp_path / "noisy", n_dev=64, random_train_labels=True)
  common = [*MODEL, *STUDENT, f"--config.data.data_dir={noisy}", "--config.train.epochs=4",
            "--config.train.seed=1"]
  student, alone = str(tmp_path / "student"), str(tmp_path / "alone")
  assert cli.main(["distill", "--config", "configs/distill.py:sst2", "--workdir", student, *common,
                   f"--config.distill.teacher={teacher_dir}", "--config.distill.hard_weight=0",
                   "--config.distill.temperature=1"]) == 0
  assert cli.main(["finetune", "--config", "configs/glue.py:sst2", "--workdir", alone, *common]) == 0
  distilled, baseline = _results(student)["accuracy"], _results(alone)["accuracy"]
  assert distilled >= 0.9 and baseline <= 0.75, (distilled, baseline)
  saved = json.load(open(os.path.join(student, "config.json")))  # a normal fine-tuning workdir
  assert saved["model"]["num_layers"] == 1 and saved["task"]["head"] == "classification"


def test_int8_teacher_keeps_accuracy_and_predict_serves_it(teacher, tmp_path, capsys):
  data, teacher_dir = teacher
  out = str(tmp_path / "int8")
  assert cli.main(["quantize", "--model", teacher_dir, "--output", out]) == 0
  results = _results(out)
  float_acc = _results(teacher_dir)["accuracy"]
  assert results["float"]["accuracy"] == pytest.approx(float_acc)  # the same model, measured the same way
  assert results["int8"]["accuracy"] >= float_acc - 0.02 and results["agreement"] >= 0.95, results
  assert results["bytes"]["ratio"] <= 0.3, results["bytes"]
  capsys.readouterr()
  accuracy = data_fixtures.predict_accuracy(out, data, tmp_path / "predictions.jsonl")
  # predict loads the int8 workdir on its own path and agrees with the quantize job's measurement
  assert accuracy == pytest.approx(results["int8"]["accuracy"])
  assert cli.main(["quantize", "--model", out, "--output", str(tmp_path / "again")]) == 2
  assert "already quantized" in capsys.readouterr().err


@pytest.mark.skipif(not os.environ.get("BERT_JAX_SLOW_TESTS"), reason="a ~90 s chain; set BERT_JAX_SLOW_TESTS=1")
def test_a_converted_hf_encoder_teaches_a_3_layer_student_that_quantizes(tmp_path):
  """The released-checkpoint recipe (README) on a MiniLM-shaped HF encoder without an MLM head (as
  sentence-transformers ships MiniLM): convert, fine-tune the teacher, distil 3 of its 4 layers, quantize."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  vocab = data_fixtures.embedded_paths()[1]
  torch.manual_seed(0)
  config = transformers.BertConfig(vocab_size=sum(1 for _ in open(vocab)), hidden_size=32, num_hidden_layers=4,
                                   num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)
  transformers.BertModel(config).save_pretrained(tmp_path / "hf")
  (tmp_path / "hf" / "vocab.txt").write_bytes(open(vocab, "rb").read())
  data = data_fixtures.write_first_word_sst2(tmp_path / "sst2", n_dev=64)
  run = ["--config.data.max_seq_length=32", "--config.train.batch_size=16", "--config.train.eval_batch_size=32",
         "--config.optimizer.learning_rate=3e-3", "--config.train.tensorboard=false", f"--config.data.data_dir={data}",
         "--config.train.epochs=4"]
  d = {name: str(tmp_path / name) for name in ("ckpt", "teacher", "student", "int8")}
  assert cli.main(["convert", "--from", "hf", str(tmp_path / "hf"), d["ckpt"]]) == 0
  assert cli.main(["finetune", "--config", "configs/glue.py:sst2", "--workdir", d["teacher"],
                   f"--config.init_from={d['ckpt']}", *run]) == 0
  assert cli.main(["distill", "--config", "configs/distill.py:sst2", "--workdir", d["student"], *run,
                   f"--config.distill.teacher={d['teacher']}", "--config.distill.student_layers=0,2,3"]) == 0
  assert cli.main(["quantize", "--model", d["student"], "--output", d["int8"]]) == 0
  teacher, student, int8 = (_results(d[k]) for k in ("teacher", "student", "int8"))
  assert json.load(open(os.path.join(d["student"], "config.json")))["model"]["num_layers"] == 3
  assert student["accuracy"] >= 0.9 * teacher["accuracy"] and teacher["accuracy"] >= 0.9, (teacher, student)
  assert int8["int8"]["accuracy"] >= 0.99 * int8["float"]["accuracy"] and int8["bytes"]["ratio"] <= 0.3, int8
