"""Small configs and batches shared by the core tests, and the marker of the slow chains."""
import os

import numpy as np
import pytest

from bert_jax.config_utils import load_config

TINY = ["--config.model.vocab_size=128", "--config.model.hidden_size=32", "--config.model.num_heads=4",
        "--config.model.intermediate_size=64", "--config.model.num_layers=2",
        "--config.model.max_position_embeddings=32", "--config.data.max_seq_length=16",
        "--config.data.max_predictions_per_seq=4", "--config.train.batch_size=8"]


def xla_flags(devices: int = 8) -> str:
  """XLA_FLAGS for the tests' processes: `devices` host CPU devices, and what makes XLA:CPU compile faster.
  Compiling, not running, is most of a tiny test's time. LLVM's optimisations off: test_sharding's four mesh
  tests 107 s -> 67 s (2026-11-27). XLA:CPU's older elemental emitters instead of its MLIR fusion emitters: the
  2x2x2-mesh step with 2 micro-batches compiles in 5.3-6.4 s instead of 7.8-12.2 s, with the same loss to the last
  digit (2026-11-28, 3 alternating runs). Not `--xla_llvm_disable_expensive_passes`: little faster still, and it
  moved a Hessian eigenvalue (tests/test_qbert.py, unrolled layers) by 5e-3 relative."""
  return (f"--xla_force_host_platform_device_count={devices} --xla_backend_optimization_level=0 "
          "--xla_cpu_use_fusion_emitters=false")


def random_like(abstract, std=0.1, seed=0):
  """NumPy weights of `abstract`'s shapes: N(0, std), biases included, LayerNorm scales 1 + N(0, std). For tests
  that do not depend on the model's own initialisation: its program (many RNG calls) takes XLA:CPU ~3-4 s to
  compile, about a tiny train step's."""
  import jax  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(seed)
  return jax.tree_util.tree_map_with_path(
      lambda path, x: (jax.tree_util.keystr(path).endswith("['scale']") + std * rng.standard_normal(x.shape))
      .astype(x.dtype), abstract)


def tiny_config(*overrides):
  return load_config("configs/bert.py:tiny", TINY + list(overrides))


def random_batch(seed=0, batch=8, seq=16, predictions=4, vocab=128):
  rng = np.random.RandomState(seed)
  lengths = rng.randint(seq // 2, seq + 1, batch)
  mask = (np.arange(seq)[None] < lengths[:, None]).astype(np.int32)
  return {"input_ids": (rng.randint(5, vocab, (batch, seq)) * mask).astype(np.int32),
          "input_mask": mask,
          "segment_ids": ((np.arange(seq)[None] >= lengths[:, None] // 2) * mask).astype(np.int32),
          "masked_lm_positions": np.sort(rng.randint(1, seq // 2, (batch, predictions)), -1).astype(np.int32),
          "masked_lm_ids": rng.randint(5, vocab, (batch, predictions)).astype(np.int32),
          "masked_lm_weights": (rng.rand(batch, predictions) < 0.8).astype(np.float32),
          "next_sentence_labels": rng.randint(0, 2, batch).astype(np.int32)}


# Long end-to-end chains, run weekly (README: "Tests"): BERT_JAX_SLOW_TESTS=1 python3 -m pytest ...
slow = pytest.mark.skipif(not os.environ.get("BERT_JAX_SLOW_TESTS"),
                          reason="a long end-to-end chain; set BERT_JAX_SLOW_TESTS=1 (the weekly run)")
