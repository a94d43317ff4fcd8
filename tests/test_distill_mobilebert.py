"""configs/distill.py:mobilebert: MobileBERT's architecture alone as a task-distillation student of a BERT
teacher (the compression table's MobileBERT row, benchmarks/released_row.py --methods mobilebert)."""
import json

import jax
import jax.numpy as jnp
import pytest

from bert_jax import cli, jobs, params_checkpoint
from bert_jax.compress import distill
from bert_jax.config_utils import load_config
from bert_jax.configs import distill as distill_configs
from bert_jax.errors import UserError
from bert_jax.finetune import heads
from bert_jax.models.config import ModelConfig
from bert_jax.models.mobilebert import MobileBertConfig
import test_distill
from core_helpers import slow

task_teacher = test_distill.task_teacher  # the fixture: a 2-layer BERT teacher and its first-word sst2 rows


def test_the_mobilebert_preset_is_a_fresh_tiny_mobilebert_over_the_teachers_vocabulary():
  """The student is configs/mobilebert.py's `tiny` MobileBERT (no init_from, no teacher layers) over BERT
  uncased's 30,522 word pieces; a MiniLM-shaped BERT teacher (6 x 384, 12 heads) accepts it with the soft
  and hard losses, and the attention loss is refused (2 heads against 12)."""
  c = distill_configs.get_config("mobilebert")
  assert not c.init_from and not c.distill.student_layers
  student = distill.student_config(c, None, None)
  assert isinstance(student, MobileBertConfig)
  assert (student.vocab_size, student.num_layers, student.hidden_size, student.num_heads, student.embedding_size,
          student.intra_bottleneck_size, student.num_feedforward_networks) == (30522, 4, 128, 2, 32, 32, 2)
  assert (student.normalization_type, student.hidden_act, student.trigram_input) == ("no_norm", "relu", True)
  assert c.optimizer.learning_rate == 1e-3 and (c.distill.soft_weight, c.distill.hard_weight) == (1.0, 1.0)
  teacher = ModelConfig(vocab_size=30522, hidden_size=384, num_heads=12, num_layers=6, intermediate_size=1536)
  student = heads.encoder_config(student, "classification", "pooled")
  distill.validate(c.distill, student, teacher, "classification")
  with c.unlocked():
    c.distill.attention_weight = 1.0
  with pytest.raises(UserError, match=r"as many heads in the student \(2\) as in the teacher \(12\)"):
    distill.validate(c.distill, student, teacher, "classification")
  ids = jnp.ones((2, 8), jnp.int32)
  model = heads.FinetuneModel(student, "classification", 2)
  variables = jax.eval_shape(lambda: model.init(jax.random.key(0), ids, ids, ids * 0))
  logits = jax.eval_shape(lambda v: model.apply(v, ids, ids, ids * 0), variables)["logits"]
  assert logits.shape == (2, 2)
  sizes = [leaf.shape for leaf in jax.tree.leaves(variables["params"])]
  assert (30522, 32) in sizes  # the 32-wide word-piece table read as trigrams


def test_the_mobilebert_preset_passes_the_distill_schema():
  spec = "configs/distill.py:mobilebert"
  config = load_config(spec)
  jobs.get(config, spec).schema.check(config)
  assert config.job == "distill" and config.model.family == "mobilebert"


@slow  # a distillation run (the default suite keeps the preset's checks above)
def test_a_mobilebert_student_distils_from_a_bert_teacher_on_soft_and_hard_labels(task_teacher, tmp_path):
  """configs/distill.py:mobilebert (2 of its layers) from test_distill's 2-layer BERT teacher (the embedded
  vocabulary): every logged step's loss is the hard plus the soft loss (both weighted 1), the workdir is a
  MobileBERT fine-tuning workdir without the width projection, and `predict` reads it."""
  teacher, data = task_teacher
  workdir = tmp_path / "mobilebert"
  assert cli.main(["distill", "--config", "configs/distill.py:mobilebert", "--workdir", str(workdir),
                   f"--config.distill.teacher={teacher}", f"--config.data.data_dir={data}",
                   "--config.model.vocab_size=8192", "--config.model.num_layers=2", "--config.model.scan_unroll=2",
                   "--config.data.max_seq_length=32",
                   "--config.train.batch_size=16", "--config.train.eval_batch_size=32", "--config.train.epochs=1",
                   "--config.train.log_every_steps=1", "--config.train.tensorboard=false"]) == 0
  saved = json.loads((workdir / "config.json").read_text())
  assert saved["model"]["family"] == "mobilebert" and saved["model"]["vocab_size"] == 8192
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  train = [r for r in rows if "soft_loss" in r and not r.get("eval")]
  assert len(train) == 4, rows
  assert all(r["loss"] == pytest.approx(r["hard_loss"] + r["soft_loss"], rel=1e-5) for r in train), train
  params, _ = params_checkpoint.load_params(str(workdir))
  assert "distill" not in params and (8192, 32) in [leaf.shape for leaf in jax.tree.leaves(params)]
  sentences = tmp_path / "sentences.txt"
  sentences.write_text("the film was good .\nthe film was bad .\n")
  out = tmp_path / "predictions.jsonl"
  assert cli.main(["predict", "--model", str(workdir), "--input", str(sentences), "--output", str(out)]) == 0
  assert len(out.read_text().splitlines()) == 2
