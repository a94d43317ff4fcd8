"""benchmarks/compress_tpu.py, the compression table's TPU column: its analytic FLOP counts of the MobileBERT,
BiLSTM and BERT classifiers against the matmuls in the traced forward (every dot_general of the jaxpr,
scans multiplied by their length), and the compiled estimate of a BiLSTM counting each scanned time step."""
import importlib.util
import math
import os
import sys

import jax
import jax.numpy as jnp
import pytest

from bert_jax.finetune import heads
from bert_jax.models.bilstm import BiLSTMConfig
from bert_jax.models.config import ModelConfig
from bert_jax.models.mobilebert import MobileBertConfig

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks"))
import compress_tpu  # noqa: E402  pylint: disable=wrong-import-position

BATCH, SEQ = 2, 8


def _dot_flops(jaxpr) -> float:
  """2 x multiply-adds of every dot_general in `jaxpr`, nested jaxprs included (a scan's body times its length)."""
  total = 0.0
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "dot_general":
      (_, rhs_contract), (_, rhs_batch) = eqn.params["dimension_numbers"]
      lhs, rhs = (v.aval.shape for v in eqn.invars[:2])
      kept = [n for d, n in enumerate(rhs) if d not in tuple(rhs_contract) + tuple(rhs_batch)]
      total += 2 * math.prod(lhs) * math.prod(kept)
      continue
    assert eqn.primitive.name != "while", "a while loop's trip count is not known from the jaxpr"
    times = eqn.params["length"] if eqn.primitive.name == "scan" else 1
    for value in eqn.params.values():
      for sub in value if isinstance(value, (tuple, list)) else (value,):
        inner = getattr(sub, "jaxpr", sub)
        if hasattr(inner, "eqns"):
          total += times * _dot_flops(inner)
  return total


def _traced_flops(cfg) -> float:
  model = heads.FinetuneModel(cfg, "classification", compress_tpu.NUM_LABELS, "pooled", 0.0)
  ids = jnp.ones((BATCH, SEQ), jnp.int32)
  params = jax.eval_shape(lambda: model.init(jax.random.key(0), ids, ids, ids)["params"])
  return _dot_flops(jax.make_jaxpr(lambda p: model.apply({"params": p}, ids, ids, ids * 0))(params).jaxpr)


MOBILEBERT = dict(vocab_size=64, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=24, embedding_size=8,
                  intra_bottleneck_size=16, num_feedforward_networks=3, max_position_embeddings=16, mlm_head=False,
                  sentence_head="none")


@pytest.mark.parametrize("overrides", [
    {},  # MobileBERT's own: queries and keys from a shared bottleneck, values from the block input
    {"use_bottleneck_attention": True},
    {"use_bottleneck": False, "trigram_input": False, "embedding_size": 32, "num_heads": 4},
    {"classifier_activation": False, "key_query_shared_bottleneck": False},
])
def test_mobilebert_count_is_the_traced_matmuls(overrides):
  cfg = MobileBertConfig(**{**MOBILEBERT, **overrides})
  assert compress_tpu.mobilebert_forward_flops(cfg, BATCH, SEQ) == _traced_flops(cfg)


@pytest.mark.parametrize("layers", [1, 2])
def test_bilstm_count_is_the_traced_matmuls(layers):
  cfg = BiLSTMConfig(vocab_size=50, embedding_size=12, lstm_size=8, hidden_size=10, num_layers=layers)
  flops = compress_tpu.bilstm_forward_flops(cfg, BATCH, SEQ)
  # By hand for one layer: 2 directions x 8 tokens x 2 rows x 2 x 32 gates x (12 + 8); ReLU 16 -> 10; classifier.
  assert layers == 2 or flops == 2 * 16 * 2 * 32 * 20 + 2 * (2 * 16 * 10 + 2 * 10 * 2)
  assert flops == _traced_flops(cfg)


def test_bert_count_is_the_traced_matmuls():
  cfg = ModelConfig(vocab_size=64, hidden_size=32, num_heads=4, intermediate_size=48, num_layers=2,
                    max_position_embeddings=16, mlm_head=False, sentence_head="none")
  assert compress_tpu.bert_forward_flops(cfg, BATCH, SEQ) == _traced_flops(cfg)


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="libtpu is not installed")
def test_compiled_bilstm_estimate_counts_every_time_step(monkeypatch):
  """The BiLSTM row's estimate: libtpu compiles the scan over time as a loop, and tpu/estimate.py multiplies
  its body by the trip count, so the compiled FLOPs reach the analytic count (the cost analysis adds the
  gates' elementwise math on top); counting the body once would give about 1/SEQ of it."""
  cfg = BiLSTMConfig(vocab_size=50, embedding_size=12, lstm_size=8, hidden_size=10)
  monkeypatch.setitem(compress_tpu.SHAPES, "tiny", compress_tpu.Shape(lambda: cfg, compress_tpu.bilstm_forward_flops,
                                                                      "compiled"))
  r = compress_tpu.compile_shape("tiny", "v5litepod-1", BATCH, SEQ)
  assert r["device_kind"] == "TPU v5 lite" and r["flops"] == compress_tpu.bilstm_forward_flops(cfg, BATCH, SEQ)
  assert r["flops"] <= r["compiled_flops"] <= 4 * r["flops"], r
  assert r["compiled_seconds"] >= r["roofline_seconds"]
