"""`bert-jax benchmark`: the compiled train step on synthetic batches; tokens/s, step time and MFU.

Model FLOPs are counted analytically (matmuls only, 2 per multiply-add; backward = 2x forward) with
the MLM head at the predicted positions only, so MFU does not reward computing wasted logits. The
peak is the device's bf16/fp32 spec-sheet number where known, else a matmul peak measured in the
same run (on CPU always measured: fp32 matmul of 2048 x 2048).
"""
from __future__ import annotations

import statistics
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from bert_jax.errors import UserError
from bert_jax.models import attention, bert, families
from bert_jax.models.config import ModelConfig
from bert_jax.models.modernbert import ModernBertConfig
from bert_jax.training import partitioning
from bert_jax.training.step import build_train_setup

# Dense peak FLOP/s per device from vendor spec sheets, by (device_kind prefix, compute dtype).
PEAK_FLOPS = {
    ("NVIDIA H100", "bfloat16"): 989e12,
    ("NVIDIA H200", "bfloat16"): 989e12,
    ("NVIDIA A100", "bfloat16"): 312e12,
    ("TPU v3", "bfloat16"): 61.5e12,
    ("TPU v4", "bfloat16"): 275e12,
    ("TPU v5 lite", "bfloat16"): 197e12,
    ("TPU v5p", "bfloat16"): 459e12,
    ("TPU v6 lite", "bfloat16"): 918e12,
}


def predictions_for(seq_length: int) -> int:
  """BERT's max_predictions_per_seq for a length: 20 at 128, 80 at 512."""
  return max(1, round(seq_length * 20 / 128))


def _attention_widths(cfg: ModelConfig) -> list[int]:
  """Each layer's attention width: the heads it keeps (model.pruned_heads) x head_dim."""
  head_dim = cfg.hidden_size // cfg.num_heads
  return [len(cfg.kept_heads(layer)) * head_dim for layer in range(cfg.num_layers)]


def attention_forward_flops(cfg: ModelConfig | ModernBertConfig, batch: int, seq: int,
                            last_layer: bool = True) -> float:
  """The scores and the weighted sum (q k^T and p v) of one forward pass, every layer (but the last when
  not `last_layer`): what a fused attention kernel (splash) computes, so what a cost analysis of the
  compiled step cannot see."""
  own = families.of(cfg).flops
  if own is not None:
    return own.attention(cfg, batch, seq)
  widths = _attention_widths(cfg)
  return float(batch * seq * sum(2 * 2 * seq * w for w in (widths if last_layer else widths[:-1])))


def heads_only_applies(cfg: ModelConfig | ModernBertConfig) -> bool:
  """Whether the pretraining objective runs this model's last layer at the heads' positions only, with
  dot's attention (models/bert.py, BertModel's heads_only)."""
  return families.of(cfg).flops is None and bert.runs_heads_only(cfg)


def train_flops_per_step(cfg: ModelConfig | ModernBertConfig, batch: int, seq: int, predictions: int,
                         heads_only: bool = False) -> float:
  """heads_only: BertModel's last layer counted where the pretraining objective runs it, at [CLS] and the
  predictions only (models/bert.py, BertModel's heads_only)."""
  own = families.of(cfg).flops
  if own is not None:
    return 3.0 * own.forward(cfg, batch, seq, predictions)
  h, i, e, v = cfg.hidden_size, cfg.intermediate_size, cfg.embed_dim, cfg.vocab_size
  tokens = batch * seq
  widths = _attention_widths(cfg)
  # Per layer: q,k,v,out over the kept heads' columns; FFN; then the attention itself.
  forward = tokens * sum(2 * 4 * h * w + 2 * 2 * h * i for w in widths)
  forward += attention_forward_flops(cfg, batch, seq)
  if heads_only and heads_only_applies(cfg):
    # The last layer's q, output projection, FFN and attention rows at 1 + predictions positions of each row.
    w = widths[-1]
    forward -= (tokens - batch * (1 + predictions)) * (2 * 2 * h * w + 2 * 2 * h * i + 2 * 2 * seq * w)
  if e != h:
    forward += tokens * 2 * e * h
  if cfg.use_pooler:
    forward += batch * 2 * h * h
  if cfg.sentence_head != "none":
    forward += batch * 2 * h * 2
  if cfg.mlm_head:
    forward += batch * predictions * (2 * h * e + 2 * e * v)
  return 3.0 * forward


def measured_matmul_peak(dtype=jnp.float32, n: int = 2048, repeats: int = 5) -> float:
  a = jnp.ones((n, n), dtype)
  f = jax.jit(lambda x: x @ x)
  f(a).block_until_ready()
  best = min(_timed(lambda: f(a).block_until_ready()) for _ in range(repeats))
  return 2 * n ** 3 / best


def _timed(fn) -> float:
  start = time.perf_counter()
  fn()
  return time.perf_counter() - start


def spec_peak(dtype: str) -> float | None:
  kind = jax.devices()[0].device_kind
  for (prefix, peak_dtype), peak in PEAK_FLOPS.items():
    if kind.startswith(prefix) and peak_dtype == dtype:
      return peak
  return None


def synthetic_batch(batch: int, seq: int, predictions: int, vocab: int, seed: int = 0) -> dict:
  rng = np.random.default_rng(seed)
  positions = np.sort(np.stack([rng.choice(seq - 1, predictions, replace=False) + 1 for _ in range(batch)]), -1)
  return {"input_ids": rng.integers(5, vocab, (batch, seq), dtype=np.int32),
          "input_mask": np.ones((batch, seq), np.int32),
          "segment_ids": (np.arange(seq)[None] >= seq // 2).astype(np.int32).repeat(batch, 0),
          "masked_lm_positions": positions.astype(np.int32),
          "masked_lm_ids": rng.integers(5, vocab, (batch, predictions), dtype=np.int32),
          "masked_lm_weights": np.ones((batch, predictions), np.float32),
          "next_sentence_labels": rng.integers(0, 2, (batch,), dtype=np.int32)}


class TimedStep:
  """The compiled train step on one synthetic batch, built once; `run(n)` times n steps (seconds)."""

  def __init__(self, config: ml_collections.ConfigDict, batch: int, seq: int):
    if config.objective != "bert":
      raise UserError(f"benchmark counts FLOPs for objective=bert, got {config.objective!r}")
    self.predictions = predictions_for(seq)
    with config.unlocked():
      config.train.batch_size, config.data.max_seq_length = batch, seq
      config.data.max_predictions_per_seq = self.predictions
    attention.check(config.model, seq)  # the step runs here
    setup = build_train_setup(config)
    self.model_config = setup.objective.config
    self.flops = train_flops_per_step(self.model_config, batch, seq, self.predictions, heads_only=True)
    self._step = setup.train_step
    self._state = setup.init_state(jax.random.key(0))
    self._data = partitioning.global_batch(
        synthetic_batch(batch, seq, self.predictions, self.model_config.vocab_size), setup.mesh)
    self._rng = jax.random.key(1)
    self.metrics = None

  def run(self, steps: int) -> float:
    start = time.perf_counter()
    for _ in range(steps):
      self._state, self.metrics = self._step(self._state, self._data, self._rng)
    jax.block_until_ready(self.metrics)
    return time.perf_counter() - start


def run_benchmark(config: ml_collections.ConfigDict, batch: int, seq: int, steps: int,
                  warmup: int = 2, repeats: int = 3) -> dict[str, Any]:
  """Times `steps` train steps after `warmup`, `repeats` times; reports the median.

  Without a spec-sheet peak, the matmul peak is measured after each repeat and MFU is the median of
  the per-repeat ratios: on a shared CPU the load changes within a run, and adjacent measurements
  see about the same load.
  """
  timed = TimedStep(config, batch, seq)
  model_cfg = timed.model_config
  timed.run(warmup)
  peak = spec_peak(model_cfg.dtype)
  times, peaks = [], []
  for _ in range(repeats):
    times.append(timed.run(steps) / steps)
    if peak is None:
      peaks.append(measured_matmul_peak(jnp.dtype(model_cfg.dtype)) * jax.device_count())
  if peaks:
    peak_source, peak = "measured matmul", statistics.median(peaks)
    mfu = statistics.median(timed.flops / t / p for t, p in zip(times, peaks))
  else:
    peak_source, peak = "spec sheet", peak * jax.device_count()
    mfu = timed.flops / statistics.median(times) / peak
  step_time = statistics.median(times)
  return {"device": jax.devices()[0].device_kind, "devices": jax.device_count(),
          "dtype": model_cfg.dtype, "batch_size": batch, "seq_length": seq,
          "max_predictions": timed.predictions, "step_time_s": step_time,
          "step_times_s": times, "tokens_per_sec": batch * seq / step_time,
          "model_flops_per_step": timed.flops, "model_tflops_per_sec": timed.flops / step_time / 1e12,
          "peak_tflops_per_sec": peak / 1e12, "peak_source": peak_source,
          "peak_tflops_per_repeat": [p / 1e12 for p in peaks], "mfu": mfu,
          "loss": float(timed.metrics["loss"])}
