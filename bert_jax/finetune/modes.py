"""What trains (`train.mode`): the whole model, Houlsby adapters, or the head on frozen features.

  finetune  every parameter (the BERT paper).
  adapters  Houlsby et al. (2019): bottleneck adapters of width train.adapter_size after every layer's
            attention and feed-forward sublayers (models/bert.py: Adapter), every LayerNorm and the
            task head train; the rest of the pretrained encoder stays as loaded. The pooler trains
            too: it only serves the [CLS] head, and distilled checkpoints (MiniLM) ship it untrained.
            The workdir keeps only those parameters, next to a reference to the base checkpoint
            (params_checkpoint: a delta).
  feature   the encoder is frozen and runs without dropout (fixed features, as the BERT paper's
            feature-based NER); only the head trains, on the pooled vector or, with
            head.pooling=layer_mix, on a learned mix of every layer.
Frozen parameters get no gradient (training/step.py: freeze, so the backward pass skips them), no
optimizer state and no update (finetune/optim.py: optax.multi_transform with set_to_zero). In the
adapters and feature modes the base rate is optimizer.frozen_learning_rate (Houlsby et al. tune
adapters over 1e-4..1e-3; the pretrained weights' 2e-5 barely moves freshly initialised ones).
"""
from __future__ import annotations

from typing import Any

import jax
import ml_collections
import numpy as np

from bert_jax.errors import UserError
from bert_jax.models import families

MODES = ("finetune", "adapters", "feature")
_ADAPTER_TRAINS = ("head", "pooler")  # top-level keys that train with the adapters


def validate(train: ml_collections.ConfigDict) -> None:
  if train.mode not in MODES:
    raise UserError(f"train.mode={train.mode!r} is not one of {MODES}")
  if train.mode == "adapters" and train.adapter_size <= 0:
    raise UserError(f"train.adapter_size={train.adapter_size} must be positive with train.mode=adapters "
                    "(Houlsby et al. use 8, 64 or 256)")


def model_config(model: families.Config, train: ml_collections.ConfigDict) -> families.Config:
  """The encoder a mode trains: adapters added (adapters), dropout off (feature)."""
  if train.mode == "adapters":
    if not families.of(model).adapters:
      raise UserError(f"train.mode=adapters: Houlsby adapters sit in BertModel's layers (BERT, RoBERTa, ALBERT, "
                      f"ELECTRA); a {model.family} model has none: use train.mode=finetune or feature")
    return model.replace(adapter_size=train.adapter_size)
  if train.mode == "feature":
    return families.of(model).with_dropout(model, 0.0, 0.0)
  return model


def _names(path) -> list[str]:
  return [str(getattr(k, "key", k)) for k in path]


def _trains(mode: str, names: list[str]) -> bool:
  if mode == "finetune":
    return True
  if mode == "feature":
    return names[0] == "head"
  return (names[0] in _ADAPTER_TRAINS or any(n.endswith("_adapter") for n in names)
          or any(n.endswith("layer_norm") for n in names))


def trainable_mask(params: Any, mode: str) -> Any:
  """A tree of bools like `params` (arrays or abstract): True where the parameter trains in `mode`."""
  return jax.tree_util.tree_map_with_path(lambda path, _: _trains(mode, _names(path)), params)


def trainable_count(params: Any, mask: Any) -> tuple[int, int]:
  """(trainable parameter count, all parameters)."""
  sizes = [int(np.prod(p.shape)) for p in jax.tree.leaves(params)]
  return sum(s for s, t in zip(sizes, jax.tree.leaves(mask)) if t), sum(sizes)


def trainable_parameters(params: Any, mode: str) -> dict[str, Any]:
  """What a fine-tuning-style run records in config.json and says at its start: {"count", "total", "share"} of
  the parameters that train in `mode`."""
  count, total = trainable_count(params, trainable_mask(params, mode))
  print(f"train.mode={mode}: {count:,} of {total:,} parameters train ({100 * count / total:.2f}%)", flush=True)
  return {"count": count, "total": total, "share": count / total}


def trainable_subtree(params: Any, mask: Any) -> dict:
  """The nested dict of the trainable leaves only (what an adapter workdir keeps)."""
  out: dict = {}
  for (path, leaf), keep in zip(jax.tree_util.tree_leaves_with_path(params), jax.tree.leaves(mask)):
    if keep:
      node = out
      for name in _names(path)[:-1]:
        node = node.setdefault(name, {})
      node[_names(path)[-1]] = leaf
  return out
