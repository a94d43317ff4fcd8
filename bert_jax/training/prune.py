"""Head pruning (Michel et al. 2019): remove attention heads from a trained model's parameters.

Heads are named as in HF's `prune_heads`: {layer: [head, ...]} with the original head indices, also
after earlier pruning (heads already gone are ignored, as HF does). The pruned layers' q/k/v/out
kernels keep only the other heads, and `model.pruned_heads` records what went, so the checkpoint
fine-tunes, converts (HF's `config.pruned_heads`) and loads like any other. A pruned model computes
what the unpruned one computes with those heads' head_mask at 0 (tests/test_bertology_model.py).
Layers of different widths cannot be stacked, so a scanned encoder comes out unrolled.

`select_least_important` picks a fraction of the remaining heads from an importance table (`bert-jax
analyze heads` writes one), least important first, never the last head of a layer.
"""
from __future__ import annotations

import copy
import json
import math
from typing import Any, Mapping

import jax
import numpy as np
from etils import epath

from bert_jax import params_checkpoint
from bert_jax.conversion import native
from bert_jax.conversion.params import relayout
from bert_jax.errors import UserError
from bert_jax.models.config import ModelConfig


def parse_heads(text: str) -> dict[int, list[int]]:
  """HF's prune_heads dict from JSON, e.g. '{"0": [0, 5], "2": [1]}'."""
  try:
    heads = json.loads(text)
    if not isinstance(heads, dict):
      raise ValueError("not a JSON object")
    return {int(layer): [int(h) for h in hs] for layer, hs in heads.items()}
  except (ValueError, TypeError) as e:
    raise UserError(f"--heads {text!r} is not a JSON object of layer -> list of heads, e.g. "
                    f"'{{\"0\": [0, 5], \"2\": [1]}}' ({e})") from None


def pruned_config(config: ModelConfig, heads: Mapping[int, Any]) -> ModelConfig:
  """`config` with `heads` pruned on top of what it has pruned already (and an unrolled encoder)."""
  if config.share_layers != "none":
    raise UserError(f"model.share_layers={config.share_layers!r}: heads of shared layers cannot be pruned "
                    "per layer; only unshared encoders prune")
  combined = {i: set(hs) for i, hs in config.pruned_heads_dict().items()}
  for layer, hs in heads.items():
    combined.setdefault(int(layer), set()).update(int(h) for h in hs)
  return config.replace(scan_layers=False, pruned_heads={i: sorted(hs) for i, hs in combined.items()})


def prune_params(params: dict, config: ModelConfig, heads: Mapping[int, Any]) -> tuple[dict, ModelConfig]:
  """(params, config) without `heads`; params is a tree with a top-level `encoder` (model or fine-tuned)."""
  new_config = pruned_config(config, heads)
  params = relayout(params, config, scan_layers=False)
  encoder = dict(params["encoder"])
  for i in range(config.num_layers):
    old, new = config.kept_heads(i), new_config.kept_heads(i)
    if old != new:
      encoder[f"layer_{i}"] = _keep_heads(encoder[f"layer_{i}"], [old.index(h) for h in new])
  return {**params, "encoder": encoder}, new_config


def _keep_heads(layer: dict, rows: list[int]) -> dict:
  attention = dict(layer["attention"])
  for name in ("query", "key", "value"):
    attention[name] = {"kernel": np.asarray(attention[name]["kernel"])[:, rows],
                       "bias": np.asarray(attention[name]["bias"])[rows]}
  attention["out"] = {"kernel": np.asarray(attention["out"]["kernel"])[rows],
                      "bias": np.asarray(attention["out"]["bias"])}
  return {**layer, "attention": attention}


def read_importance(path: str, config: ModelConfig) -> np.ndarray:
  """[L, N] head importance from a JSON file: `bert-jax analyze heads`' heads.json, or a bare table."""
  try:
    data = json.loads(epath.Path(path).read_text(encoding="utf-8"))  # local or in a bucket
  except (OSError, ValueError) as e:
    raise UserError(f"--importance {path}: cannot read it as JSON ({e})") from None
  table = np.asarray(data["importance"] if isinstance(data, dict) and "importance" in data else data, float)
  if table.shape != (config.num_layers, config.num_heads):
    raise UserError(f"--importance {path}: a {list(table.shape)} table for a model of "
                    f"{config.num_layers} layers x {config.num_heads} heads; compute it on this model "
                    "(bert-jax analyze heads)")
  return table


def active_heads(config: ModelConfig) -> np.ndarray:
  """bool[L, N]: the heads a model has (False where pruned)."""
  active = np.zeros((config.num_layers, config.num_heads), bool)
  for layer in range(config.num_layers):
    active[layer, list(config.kept_heads(layer))] = True
  return active


def least_important(importance: np.ndarray, active: np.ndarray, count: int) -> dict[int, list[int]]:
  """{layer: heads}: `count` of the `active` heads, least important first, never a layer's last one
  (fewer when only last ones are left)."""
  left = active.sum(axis=1)
  chosen: dict[int, list[int]] = {}
  for _, i, h in sorted((importance[i, h], i, h) for i, h in zip(*np.nonzero(active))):
    if sum(map(len, chosen.values())) == count:
      break
    if left[i] > 1:
      chosen.setdefault(int(i), []).append(int(h))
      left[i] -= 1
  return chosen


def select_least_important(importance: np.ndarray, config: ModelConfig, fraction: float
                           ) -> dict[int, list[int]]:
  """round(fraction x the model's heads) of its least important heads."""
  if not 0 < fraction < 1:
    raise UserError(f"--fraction {fraction} must be between 0 and 1")
  active = active_heads(config)
  return least_important(importance, active, int(round(fraction * active.sum())))


def _num_params(params: Any) -> int:
  return sum(math.prod(np.shape(x)) for x in jax.tree.leaves(params))


def prune(source: str, destination: str, *, heads: Mapping[int, Any] | None = None, fraction: float = 0.0,
          importance_path: str = "") -> dict[str, Any]:
  """Writes to `destination` a params checkpoint of `source` without `heads` (or, with `fraction` and
  `importance_path`, without that share of its least important heads); returns a summary."""
  params, saved = params_checkpoint.load_params(source)
  if "encoder" not in params:
    raise UserError(f"{source}: no top-level `encoder` in its parameters (keys {sorted(params)}); prune a "
                    "BERT-style model, a fine-tuned workdir or a converted checkpoint")
  config = ModelConfig.from_dict(saved["model"])
  if heads is None:
    heads = select_least_important(read_importance(importance_path, config), config, fraction)
  pruned, new_config = prune_params(params, config, heads)
  saved = copy.deepcopy(saved)
  saved["model"] = json.loads(json.dumps(new_config.to_dict()))
  tok = native.tokenizer(source)
  if tok is not None:
    saved.setdefault("data", {}).update(vocab=next(iter(tok.files)), tokenizer=tok.kind, lower_case=tok.lower_case)
  params_checkpoint.save_params(destination, pruned, saved, tok.files if tok else None)
  total = config.num_layers * config.num_heads
  return {"from": source, "to": destination, "pruned_heads": new_config.pruned_heads_dict(),
          "heads_left": total - sum(map(len, new_config.pruned_heads)), "heads_total": total,
          "num_params": [_num_params(params), _num_params(pruned)]}
