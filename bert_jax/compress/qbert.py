"""Q-BERT (Shen et al. 2019): Hessian-aware mixed-precision quantization (`bert-jax quantize --mode hessian`).

1. Sensitivity. For each encoder layer, the top eigenvalue of the Hessian of the fine-tuned task loss
   with respect to that layer's matmul weights (ops/hessian.py: power iteration on jvp-of-grad products),
   on `batches` batches of the training set, one eigenvalue per batch. As in the paper, a layer's
   sensitivity is |mean| + std of those eigenvalues: a layer whose curvature is large, or varies a lot
   between samples, is sensitive.
2. Bits. Each encoder layer gets 2, 3, 4 or 8 bits (`allocate_bits`): the params' bytes stay within
   --budget-bytes, and a more sensitive layer never gets fewer bits than a less sensitive one. The
   greedy step raises, among the layers whose next width keeps that order and fits, the one that
   removes most second-order loss per byte: a weight's rounding error has variance ~ scale**2 ~
   4**-bits, so the expected loss increase of layer l is ~ sensitivity_l * n_l * 4**-bits_l.
   --bits-per-layer gives the widths instead (no Hessian is computed then).
3. Storage (ops/lowbit.py): the encoder layers' weights group-wise (a scale per group of output units,
   heads kept apart in the attention projections; --groups per matrix), packed to their bit width;
   embeddings, pooler and classifier int8 per channel (ops/int8.py), as Q-BERT keeps embeddings at 8
   bits; biases and LayerNorms float32.

The output is a quantized workdir like `bert-jax quantize`'s int8 one: config.json's `quantization`
records the bits per layer and the groups; `predict` loads it with the weights dequantized to float32
(there are no sub-8-bit kernels: activations stay float). eval_results.json holds the float and
quantized dev metrics, the sensitivities, the bits and the bytes.
"""
from __future__ import annotations

import json
import re
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

import bert_jax
from bert_jax import params_checkpoint, workdir as workdir_lib
from bert_jax.compress import quantize as int8_job
from bert_jax.errors import UserError
from bert_jax.finetune import heads, predict
from bert_jax.finetune.objective import FinetuneObjective
from bert_jax.finetune.task_registry import build_task
from bert_jax.models import families
from bert_jax.ops import hessian, int8, lowbit

_LAYER = re.compile(r"layer_(\d+)$")


def _layer_of(path: tuple[str, ...]) -> str | int | None:
  """"stacked" for a scanned encoder's leaf, the layer's index for an unrolled one, else None."""
  if len(path) < 2 or path[0] != "encoder":
    return None
  if path[1] == "layers":
    return "stacked"
  match = _LAYER.match(path[1])
  return int(match.group(1)) if match else None


def layer_kernels(params: Any, layer: int) -> dict[tuple[str, ...], Any]:
  """Layer `layer`'s matmul weights, by path (a scanned leaf's slice)."""
  out = {}
  for key_path, leaf in jax.tree_util.tree_leaves_with_path(params):
    path = tuple(k.key for k in key_path)
    where = _layer_of(path)
    if where == "stacked" and int8.contracted_axes(path, np.ndim(leaf) - 1) is not None:
      out[path] = leaf[layer]
    elif isinstance(where, int) and where == layer and int8.contracted_axes(path, np.ndim(leaf)) is not None:
      out[path] = leaf
  return out


def _replaced(tree: Any, path: tuple[str, ...], value: Any) -> Any:
  return value if not path else {**tree, path[0]: _replaced(tree[path[0]], path[1:], value)}


def with_layer(params: Any, layer: int, kernels: dict[tuple[str, ...], Any]) -> Any:
  for path, value in kernels.items():
    leaf = params
    for key in path:
      leaf = leaf[key]
    params = _replaced(params, path, leaf.at[layer].set(value) if _layer_of(path) == "stacked" else value)
  return params


def num_layers(config: dict, params: Any) -> int:
  """The encoder's layer count, once its weights are one set per layer (what Q-BERT assigns bits to)."""
  model = config["model"]
  if model.get("share_layers", "none") != "none" or "encoder" not in params:
    raise UserError("--mode hessian quantizes each encoder layer's own weights: this model shares its layers "
                    f"(model.share_layers={model.get('share_layers')!r}) or has no `encoder`; use --mode int8")
  count = int(model["num_layers"])
  if not all(layer_kernels(params, layer) for layer in range(count)):
    raise UserError(f"--mode hessian: the encoder's parameters are not laid out as {count} layers")
  return count


def _hvp_fn(objective: FinetuneObjective, stacked: bool):
  """jitted (params, batch, v, layer) -> H v, H the Hessian of the batch's loss in the layer's weights;
  a scanned encoder's layer is an argument (one compile for all layers), an unrolled one's static."""
  def loss(params, batch):
    return objective.sums(params, batch, None, True)["loss"] / objective.counts(batch)["labels"]

  def product(params, batch, v, layer):
    return hessian.hvp(lambda sub: loss(with_layer(params, layer, sub), batch),
                       layer_kernels(params, layer), v)
  return jax.jit(product, static_argnums=() if stacked else (3,))


def sample_batches(train: dict[str, np.ndarray], batch_size: int, count: int, seed: int) -> list[dict]:
  """`count` disjoint batches of the training rows, drawn at random (fewer when the set is small)."""
  n = len(train["input_ids"])
  order = np.random.default_rng(seed).permutation(n)
  batch_size = min(batch_size, n)
  return [{k: jnp.asarray(v[order[i * batch_size:(i + 1) * batch_size]]) for k, v in train.items()
           if np.issubdtype(np.asarray(v).dtype, np.number)}
          for i in range(min(count, n // batch_size))]


def sensitivities(objective: FinetuneObjective, params: Any, batches: Sequence[dict], layers: Sequence[int],
                  iterations: int = 100, tol: float = 1e-3, seed: int = 0) -> list[dict[str, Any]]:
  """For each of the encoder layers `layers`: the top Hessian eigenvalue on each batch, their mean and
  std, and the sensitivity |mean| + std (Q-BERT's)."""
  params = jax.tree.map(jnp.asarray, params)
  product = _hvp_fn(objective, "layers" in params["encoder"])
  out = []
  for layer in layers:
    like = layer_kernels(params, layer)
    eigenvalues = [hessian.top_eigenvalue(lambda v, b=batch, at=layer: product(params, b, v, at), like,
                                          jax.random.key(seed * 1009 + layer * 31 + i), iterations, tol)[0]
                   for i, batch in enumerate(batches)]
    mean, std = float(np.mean(eigenvalues)), float(np.std(eigenvalues))
    out.append({"eigenvalues": eigenvalues, "mean": mean, "std": std, "sensitivity": abs(mean) + std})
  return out


def allocate_bits(sensitivity: Sequence[float], costs: Sequence[dict[int, int]], counts: Sequence[int],
                  budget: int) -> list[int]:
  """Bits per layer from lowbit.BITS: costs[l][b] is layer l's bytes at b bits, counts[l] its weights,
  budget the bytes all layers may take. Starts every layer at 2 bits, then raises the layer that
  removes most of sensitivity * count * 4**-bits per byte, among the raises that fit and keep a more
  sensitive layer at least as wide as a less sensitive one (ties: the lower layer counts as more
  sensitive)."""
  layers = len(sensitivity)
  bits = [lowbit.BITS[0]] * layers
  used = sum(costs[layer][bits[layer]] for layer in range(layers))
  if used > budget:
    raise UserError(f"--budget-bytes leaves {budget} bytes for the encoder layers; they need {used} at "
                    f"{lowbit.BITS[0]} bits")
  rank = sorted(range(layers), key=lambda layer: (-sensitivity[layer], layer))
  while True:
    best, best_gain = None, -1.0
    for position, layer in enumerate(rank):
      if bits[layer] == lowbit.BITS[-1]:
        continue
      wider = lowbit.BITS[lowbit.BITS.index(bits[layer]) + 1]
      extra = costs[layer][wider] - costs[layer][bits[layer]]
      if used + extra > budget or any(bits[above] < wider for above in rank[:position]):
        continue
      gain = sensitivity[layer] * counts[layer] * (4.0 ** -bits[layer] - 4.0 ** -wider) / extra
      if gain > best_gain:
        best, best_gain = (layer, wider, extra), gain
    if best is None:
      return bits
    layer, bits[layer], extra = best[0], best[1], best[2]
    used += extra


def _layer_costs(params: Any, layer: int, groups: int) -> tuple[dict[int, int], int]:
  """({bits: the layer's packed bytes and scales}, its weight count)."""
  kernels = layer_kernels(params, layer)
  count = sum(np.size(w) for w in kernels.values())
  costs = {}
  for bits in lowbit.BITS:
    costs[bits] = 0
    for path, w in kernels.items():
      outputs = [np.shape(w)[a] for a in range(np.ndim(w)) if a not in int8.contracted_axes(path, np.ndim(w))]
      costs[bits] += lowbit.packed_bytes(np.size(w), bits) + 4 * lowbit.group_count(outputs, groups)
  return costs, count


def quantize_tree(params: Any, bits_per_layer: Sequence[int], groups: int) -> Any:
  def bits_of(path):
    where = _layer_of(path)
    if where == "stacked":
      return list(bits_per_layer)
    return None if where is None else bits_per_layer[where]
  return lowbit.quantize_params(params, bits_of, groups)


def parse_bits(text: str, layers: int) -> list[int]:
  """--bits-per-layer: a JSON list (one width per layer, lowest layer first) or one number for all."""
  try:
    value = json.loads(text)
  except json.JSONDecodeError as e:
    raise UserError(f"--bits-per-layer={text!r} is not JSON: {e.msg}") from None
  value = [value] * layers if isinstance(value, int) else value
  if not isinstance(value, list) or len(value) != layers or any(v not in lowbit.BITS for v in value):
    raise UserError(f"--bits-per-layer={text!r}: give {layers} widths (a JSON list, or one number) from "
                    f"{list(lowbit.BITS)}")
  return [int(v) for v in value]


def _sensitivity_report(config: dict, params: Any, tokenizer, layers: int, batches: int, iterations: int,
                        seed: int) -> list[dict[str, Any]]:
  task = build_task(ml_collections.ConfigDict(config), tokenizer, need_train=True)
  if task.train is None or not len(task.train["input_ids"]):
    raise UserError("--mode hessian --budget-bytes reads the training set for the Hessian: the task has none "
                    "here; give --bits-per-layer instead")
  kind, num_labels, _ = predict.head_info(config, "model")
  model = heads.FinetuneModel(families.model_config(config["model"]), kind, num_labels,
                              config["head"]["pooling"], config["head"]["dropout"])
  sample = sample_batches(task.train, int(config["train"]["batch_size"]), batches, seed)
  return sensitivities(FinetuneObjective(model), params, sample, range(layers), iterations, seed=seed)


def quantize(model: str, output: str, *, budget_bytes: int | None = None, bits_per_layer: str | None = None,
             groups: int = 128, batches: int = 4, iterations: int = 100, batch_size: int = 0,
             seed: int = 0) -> dict[str, Any]:
  """Writes the Q-BERT quantization of the fine-tuning workdir `model` to `output`; returns eval_results."""
  if (budget_bytes is None) == (bits_per_layer is None):
    raise UserError("--mode hessian needs one of --budget-bytes N and --bits-per-layer JSON")
  if groups < 1 or batches < 1 or iterations < 1:
    raise UserError("--groups, --hessian-batches and --power-iterations must be positive")
  config, out = int8_job.check_source(model, output)
  params, _ = params_checkpoint.load_params(model)
  params = jax.device_get(params)
  tokenizer = bert_jax.load_tokenizer(model)
  layers = num_layers(config, params)
  costs, counts = zip(*(_layer_costs(params, layer, groups) for layer in range(layers)))
  report = None
  if bits_per_layer is not None:
    bits = parse_bits(bits_per_layer, layers)
  else:
    lowest = [lowbit.BITS[0]] * layers
    smallest = int8.tree_bytes(quantize_tree(params, lowest, groups))
    if budget_bytes < smallest:
      raise UserError(f"--budget-bytes={budget_bytes} is below the smallest this model quantizes to: "
                      f"{smallest} bytes, every encoder layer at {lowest[0]} bits")
    report = _sensitivity_report(config, params, tokenizer, layers, batches, iterations, seed)
    fixed = smallest - sum(c[lowest[0]] for c in costs)
    bits = allocate_bits([r["sensitivity"] for r in report], costs, counts, budget_bytes - fixed)
  quantized = quantize_tree(params, bits, groups)
  average = sum(b * n for b, n in zip(bits, counts)) / sum(counts)
  saved = {**config, "quantization": {"weights": "mixed-precision", "activations": "float", "mode": "hessian",
                                      "bits_per_layer": bits, "average_bits": average, "groups": groups,
                                      "source": str(workdir_lib.path(model))}}
  params_checkpoint.save_params(out, quantized, saved, tokenizer.files)
  results = int8_job.compare(model, output, config, params, saved, quantized, tokenizer, batch_size, "quantized")
  results.update({"bits_per_layer": bits, "average_bits": average, "groups": groups, "sensitivity": report,
                  "layer_bytes": [c[b] for c, b in zip(costs, bits)], "budget_bytes": budget_bytes})
  workdir_lib.write_json(out / workdir_lib.EVAL_RESULTS, results)
  return results
