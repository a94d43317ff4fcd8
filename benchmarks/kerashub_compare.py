"""Train-step throughput on CPU: bert_jax against KerasHub's BertMaskedLM on the JAX backend, the living peer
(Hugging Face's Flax classes left transformers in v5; BENCHMARKS.md keeps their last comparison as a dated row).

  pip install -e '.[bench]'          # keras-hub
  python benchmarks/kerashub_compare.py --size mini --batch-size 16 --seq-length 128 --rounds 7 --steps 3

The same model size (configs/bert.py's SIZES, vocabulary 30,522), batch, sequence length and masked positions
(20 at seq 128) for both, masked-LM only (KerasHub's BertMaskedLM has no next-sentence head, so bert_jax runs
with model.sentence_head=none), dropout 0.1 on the hidden states and on the attention probabilities (KerasHub's
one `dropout`), AdamW (lr 1e-4, b1 0.9, b2 0.999, eps 1e-6, weight decay 0.01 except biases and LayerNorm,
global-norm clipping at 1.0), fp32. bert_jax: its jitted train step (training/benchmark.py: TimedStep);
KerasHub: `model.compile(..., jit_compile=True)` then one `train_on_batch` per step (XLA-compiled on the first).
Each runs in its own worker process (KERAS_BACKEND=jax for KerasHub's); the driver alternates them, round by
round, and reports the median tokens/s and the median of the per-round ratios (benchmarks/hf_compare.py's
driver; `--frameworks bert_jax,kerashub,torch` adds PyTorch). `--dump-hlo DIR` also reports each compiled step's
matmul FLOPs (benchmarks/hlo_dots.py): with the step times, what bounds the ratio (BENCHMARKS.md, "KerasHub on
CPU, profiled").
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import hf_compare  # noqa: E402  pylint: disable=wrong-import-position

DEFAULTS = ["--frameworks", "bert_jax,kerashub", "--jax-override=--config.model.sentence_head=none",
            "--jax-override=--config.model.use_pooler=False"]

if __name__ == "__main__":
  hf_compare.main(DEFAULTS + sys.argv[1:])
