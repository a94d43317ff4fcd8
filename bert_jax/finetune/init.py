"""Where fine-tuning starts: the model and tokenizer a checkpoint implies, and the initial parameters.

`init_from` may be a pretraining workdir, a params checkpoint (converted or grown) or a fine-tuning
workdir (two-stage fine-tuning, e.g. MNLI then RTE). The encoder (embeddings, encoder, pooler) comes
from it; the pretraining heads are dropped; its fine-tuning head is kept only when it was trained on
the same task with the same shapes, otherwise the head starts fresh. `train.reinit_layers` = k puts
the top k encoder layers and the pooler back to their initial distribution (Zhang et al. 2021).
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from bert_jax.errors import UserError
from bert_jax.models.config import ModelConfig
from bert_jax.training import checkpoint

ENCODER_KEYS = ("embeddings", "encoder", "pooler")


def load_checkpoint(path: str) -> tuple[Any, dict] | tuple[None, None]:
  if not path:
    return None, None
  return checkpoint.load_params(path)


def model_config(config: ml_collections.ConfigDict, saved: dict | None) -> ModelConfig:
  """The checkpoint's architecture when there is one (config.model otherwise); dropout from config."""
  fields = dict(saved["model"]) if saved else config.model.to_dict()
  fields.update(hidden_dropout=config.model.hidden_dropout, attention_dropout=config.model.attention_dropout)
  return ModelConfig.from_dict(fields)


def load_tokenizer(config: ml_collections.ConfigDict):
  """data.vocab when set; else the tokenizer that travels with init_from; else the embedded vocabulary
  (what a pretraining run with data.vocab="" used). WordPiece or SentencePiece: `.path` is its file."""
  from data_pipelines.tokenizers import load_tokenizer as load_vocab  # pylint: disable=import-outside-toplevel
  if config.data.vocab:
    return load_vocab(config.data.vocab, config.data.lower_case)
  if config.init_from:
    import bert_jax  # pylint: disable=import-outside-toplevel
    return bert_jax.load_tokenizer(config.init_from)
  from data_pipelines import embedded  # pylint: disable=import-outside-toplevel
  return load_vocab(embedded.ensure_embedded()[1], config.data.lower_case)


def _head_compatible(fresh_head: Any, saved_head: Any) -> bool:
  same_tree = jax.tree.structure(fresh_head) == jax.tree.structure(saved_head)
  return same_tree and all(a.shape == b.shape for a, b in zip(jax.tree.leaves(fresh_head),
                                                               jax.tree.leaves(saved_head)))


def merge(fresh: dict, saved: dict | None, saved_config: dict | None, task_name: str) -> dict:
  """fresh params with the checkpoint's encoder (and head, when it is this task's) put in."""
  if saved is None:
    return fresh
  missing = [k for k in ("embeddings", "encoder") if k not in saved]
  if missing:
    raise UserError(f"the checkpoint has no {missing} parameters; is it a bert_jax checkpoint?")
  params = dict(fresh)
  for key in ENCODER_KEYS:
    if key in fresh and key in saved:
      params[key] = saved[key]
  same_task = (saved_config or {}).get("task", {}).get("name") == task_name
  if same_task and "head" in saved and _head_compatible(fresh["head"], saved["head"]):
    params["head"] = saved["head"]
  checkpoint.check_shapes(params, fresh, "init_from checkpoint")
  return params


def reinit_top_layers(params: dict, fresh: dict, model: ModelConfig, k: int) -> dict:
  """The top k encoder layers (slices of stacked weights, or layer_i subtrees) and the pooler from fresh."""
  if k <= 0:
    return params
  if not 0 < k <= model.num_layers:
    raise UserError(f"train.reinit_layers={k} must be between 0 and model.num_layers={model.num_layers}")
  if model.share_layers != "none":
    raise UserError("train.reinit_layers needs unshared layers (model.share_layers='none')")
  params = dict(params)
  encoder = dict(params["encoder"])
  first = model.num_layers - k
  if model.scan_layers:
    encoder["layers"] = jax.tree.map(lambda p, f: jnp.asarray(p).at[first:].set(f[first:]),
                                     encoder["layers"], fresh["encoder"]["layers"])
  else:
    encoder.update({f"layer_{i}": fresh["encoder"][f"layer_{i}"] for i in range(first, model.num_layers)})
  params["encoder"] = encoder
  if "pooler" in params:
    params["pooler"] = fresh["pooler"]
  return params
