"""`bert-jax analyze heads`: head importance and pruning on a fine-tuned task's dev set (Michel et al.
2019, "Are sixteen heads really better than one?").

  importance    I_h = E_x |d loss(x) / d xi_h| at the current head mask xi (per-example gradients,
                padding rows left out), then divided by the L2 norm of its layer's importances
  disable_one   dev score with head h of layer l masked, minus the full model's
  keep_one      dev score with only head h kept in layer l (the other layers whole), minus the full
                model's; per layer, the best such head
  pruning_curve mask 10% of the heads at a time (of those the model has; never a layer's last head),
                the least important first, importance recomputed under the current mask after each step
                as Michel et al. do; dev score at each step
The dev score is what fine-tuning's model selection maximises (accuracy, F1/accuracy mean, MCC, ...).
Writes heads.json (its `importance` is what `bert-jax prune --importance` reads), importance.png and
pruning_curve.png.
"""
from __future__ import annotations

import json
import os

import numpy as np

from bert_jax import workdir
from bert_jax.analysis import finetuned, plots
from bert_jax.analysis.maps import tolist
from bert_jax.errors import UserError
from bert_jax.training import prune


def normalise_per_layer(importance: np.ndarray) -> np.ndarray:
  norms = np.sqrt(np.sum(np.square(importance), axis=1, keepdims=True))
  return importance / np.where(norms > 0, norms, 1.0)


def disable_one(ft: finetuned.FineTuned, active: np.ndarray, base: float) -> np.ndarray:
  deltas = np.full(active.shape, np.nan)
  for layer, head in zip(*np.nonzero(active)):
    mask = active.astype(float)
    mask[layer, head] = 0.0
    deltas[layer, head] = finetuned.dev_score(ft, mask) - base
  return deltas


def keep_one(ft: finetuned.FineTuned, active: np.ndarray, base: float) -> np.ndarray:
  deltas = np.full(active.shape, np.nan)
  for layer, head in zip(*np.nonzero(active)):
    mask = active.astype(float)
    mask[layer] = 0.0
    mask[layer, head] = 1.0
    deltas[layer, head] = finetuned.dev_score(ft, mask) - base
  return deltas


def pruning_curve(ft: finetuned.FineTuned, active: np.ndarray, step: float) -> tuple[list[dict], list]:
  """[{fraction, heads_pruned, score}] and the order in which heads were masked."""
  mask, order, points = active.astype(float), [], []
  total = int(active.sum())
  targets = sorted({int(round(k * step * total)) for k in range(int(np.ceil(1 / step)))})
  for target in targets:
    while len(order) < target:
      importance = normalise_per_layer(finetuned.mean_abs_gradient(ft, mask))
      chosen = prune.least_important(importance, mask > 0, target - len(order))
      if not chosen:
        break
      for layer, heads in chosen.items():
        mask[layer, heads] = 0.0
        order += [[layer, h] for h in heads]
    if points and points[-1]["heads_pruned"] == len(order):
      break  # only the last head of each layer is left
    points.append({"fraction": len(order) / total, "heads_pruned": len(order),
                   "score": finetuned.dev_score(ft, mask)})
    print(f"analyze heads: {len(order)}/{total} heads masked, dev score {points[-1]['score']:.4f}", flush=True)
  return points, order


def analyze_heads(checkpoint: str, out_dir: str, *, eval_limit: int = 0, ablations: bool = True,
                  step: float = 0.1) -> dict:
  """Importance, ablations and the pruning curve of a fine-tuned workdir, into out_dir/heads.json."""
  if not 0 < step < 1:
    raise UserError(f"--step {step} must be between 0 and 1")
  plots.pyplot()
  ft = finetuned.load(checkpoint, eval_limit)
  active = prune.active_heads(ft.config)
  raw = finetuned.mean_abs_gradient(ft, active.astype(float))
  base = finetuned.dev_score(ft, active.astype(float))
  print(f"analyze heads: dev score {base:.4f}; importance done", flush=True)
  report = {"checkpoint": checkpoint, "task": ft.task.name, "score": list(ft.task.selection),
            "dev_examples": int(ft.dev.features["example_weight"].sum()), "base_score": base,
            "importance": tolist(normalise_per_layer(raw)), "importance_raw": tolist(raw)}
  tables = {"importance": normalise_per_layer(raw)}
  if ablations:
    tables["disable one head"] = disable_one(ft, active, base)
    tables["keep one head in the layer"] = keep_one_deltas = keep_one(ft, active, base)
    report["disable_one"] = tolist(tables["disable one head"])
    report["keep_one"] = {"deltas": tolist(keep_one_deltas),
                          "best_head": [int(np.nanargmax(row)) for row in keep_one_deltas],
                          "best_delta": [float(np.nanmax(row)) for row in keep_one_deltas]}
  report["pruning_curve"], report["pruning_order"] = pruning_curve(ft, active, step)
  workdir.create(out_dir, "--out")
  workdir.write_text(os.path.join(out_dir, "heads.json"), json.dumps(report, indent=1))
  plots.heatmaps(tables, os.path.join(out_dir, "importance.png"), f"heads of {ft.task.name}")
  curve = report["pruning_curve"]
  plots.lines([100 * p["fraction"] for p in curve], {"dev score": [p["score"] for p in curve]},
              os.path.join(out_dir, "pruning_curve.png"), "% heads masked", "dev score",
              f"{ft.task.name}: pruning by importance")
  return report
