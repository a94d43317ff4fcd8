"""configs/distill.py:mobilebert: MobileBERT's architecture alone as a task-distillation student of a BERT
teacher (the compression table's MobileBERT row, benchmarks/released_row.py --methods mobilebert)."""
import jax
import jax.numpy as jnp
import pytest

from bert_jax import jobs
from bert_jax.compress import distill
from bert_jax.config_utils import load_config
from bert_jax.configs import distill as distill_configs
from bert_jax.errors import UserError
from bert_jax.finetune import heads
from bert_jax.models.config import ModelConfig
from bert_jax.models.mobilebert import MobileBertConfig


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
