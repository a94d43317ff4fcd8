"""Post-training int8 quantization (`bert-jax quantize`): a fine-tuning workdir in, an int8 one out,
both measured on the task's dev set.

The output is a fine-tuning workdir like its source (config.json, params/, tokenizer) whose params/
holds int8 weights with float32 per-channel scales (compress/int8.py) and whose config.json records
`quantization` = {weights, activations, source}. `bert-jax predict` and bert_jax.Predictor load it
(params_checkpoint.load_params puts the weights back on their int8 grid in float32), running every
matmul in int8 with dynamic activations when quantization.activations is "int8". Fine-tuning,
distilling or quantizing it again is refused: those start from the float model.

eval_results.json gets the dev metrics of both models, the share of the float score the int8 model
keeps, how often their predictions agree, the seconds of one pass over the dev set for each (after a
warm-up call that compiles) and the bytes: of the arrays, and of params/ on disk. Q-BERT's mixed precision
(`--mode hessian`, compress/qbert.py) checks its source and measures its output with the same
`check_source` and `compare`.
"""
from __future__ import annotations

import time
from typing import Any

import jax
import ml_collections
import numpy as np

import bert_jax
from bert_jax import params_checkpoint, workdir as workdir_lib
from bert_jax.ops import int8, lowbit
from bert_jax.errors import UserError
from bert_jax.finetune import predict
from bert_jax.finetune.task_registry import build_task
from bert_jax.finetune.tasks import merge_metrics, score

ACTIVATIONS = ("int8", "float")


def _timed_outputs(predictor: predict.Predictor, features: dict[str, np.ndarray]
                   ) -> tuple[dict[str, np.ndarray], float]:
  predictor.run({k: v[:1] for k, v in features.items()})  # compiles
  start = time.perf_counter()
  outputs = predictor.run(features)
  return outputs, time.perf_counter() - start


def evaluate(predictor: predict.Predictor, config: dict) -> tuple[dict[str, float], dict[str, np.ndarray], float]:
  """The model's dev metrics (merged over eval sets), its outputs on the first set, and the seconds."""
  task = build_task(ml_collections.ConfigDict(config), predictor.tokenizer, need_train=False)
  per_set, first, seconds = {}, None, 0.0
  for eval_set in task.evals:
    outputs, spent = _timed_outputs(predictor, eval_set.features)
    per_set[eval_set.name] = eval_set.evaluate(outputs)
    first = outputs if first is None else first
    seconds += spent
  metrics = merge_metrics(per_set)
  metrics["score"] = score(task, per_set[task.evals[0].name])
  return metrics, first, seconds


def _agreement(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
  """Share of rows (tokens, for token heads) where both models predict the same class; for regression
  and spans, the share of outputs within 1e-2 of each other."""
  key = "logits" if "logits" in a else sorted(a)[0]
  if a[key].ndim >= 2 and key == "logits" and a[key].shape[-1] > 1:
    return float(np.mean(a[key].argmax(-1) == b[key].argmax(-1)))
  return float(np.mean(np.abs(a[key] - b[key]) <= 1e-2))


def check_source(model: str, output: str) -> tuple[dict, Any]:
  """(the float model's config, the output path) once both are fit to quantize from and into."""
  config = workdir_lib.read_config(model)
  if config.get("quantization"):
    raise UserError(f"{model} is already quantized ({config['quantization'].get('weights')}, from "
                    f"{config['quantization'].get('source')}); quantize the float model it came from")
  predict.head_info(config, model)
  out = workdir_lib.path(output)
  if out == workdir_lib.path(model):
    raise UserError("--output must differ from --model: the float model is the reference")
  return config, out


def compare(model: str, output: str, config: dict, params: Any, saved: dict, quantized: Any, tokenizer,
            batch_size: int, name: str) -> dict[str, Any]:
  """Dev metrics, seconds and bytes of the float model and its quantized copy (`name` in the results),
  written to eval_results.json in `output`; the quantized copy runs from its dequantized weights."""
  float_metrics, float_out, float_s = evaluate(
      predict.Predictor.build(config, params, tokenizer, batch_size, model), config)
  q_metrics, q_out, q_s = evaluate(
      predict.Predictor.build(saved, lowbit.dequantize_params(quantized), tokenizer, batch_size, output), saved)
  float_bytes, q_bytes = int8.tree_bytes(params), int8.tree_bytes(quantized)
  float_disk = int8.directory_bytes(params_checkpoint.params_location(model)[0])
  q_disk = int8.directory_bytes(workdir_lib.path(output) / workdir_lib.PARAMS)
  results = {"float": {**float_metrics, "seconds": float_s}, name: {**q_metrics, "seconds": q_s},
             "retained": q_metrics["score"] / float_metrics["score"] if float_metrics["score"] else float("nan"),
             "agreement": _agreement(float_out, q_out), "speedup": float_s / q_s,
             "bytes": {"float": float_bytes, name: q_bytes, "ratio": q_bytes / float_bytes,
                       "float_disk": float_disk, f"{name}_disk": q_disk, "disk_ratio": q_disk / float_disk},
             "activations": saved["quantization"]["activations"]}
  workdir_lib.write_json(workdir_lib.path(output) / workdir_lib.EVAL_RESULTS, results)
  return results


def quantize(model: str, output: str, activations: str = "int8", batch_size: int = 0) -> dict[str, Any]:
  """Writes the int8 version of the fine-tuning workdir `model` to `output`; returns eval_results."""
  if activations not in ACTIVATIONS:
    raise UserError(f"--activations={activations!r} is not one of {ACTIVATIONS}")
  config, out = check_source(model, output)
  params, _ = params_checkpoint.load_params(model)
  tokenizer = bert_jax.load_tokenizer(model)
  quantized = int8.quantize_params(jax.device_get(params))
  saved = {**config, "quantization": {"weights": "int8", "activations": activations,
                                      "source": str(workdir_lib.path(model))}}
  params_checkpoint.save_params(out, quantized, saved, tokenizer.files)
  return compare(model, output, config, params, saved, quantized, tokenizer, batch_size, "int8")
