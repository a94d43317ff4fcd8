"""Where fine-tuning starts: the model and tokenizer a checkpoint implies, and the initial parameters.

`init_from` may be a pretraining workdir, a params checkpoint (converted or grown) or a fine-tuning
workdir (two-stage fine-tuning, e.g. MNLI then RTE). The encoder (embeddings, encoder, pooler) comes
from it; the pretraining heads are dropped; its fine-tuning head is kept only when it was trained on
the same task with the same shapes, otherwise the head starts fresh. `train.reinit_layers` = k puts
the top k encoder layers and the pooler back to their initial distribution (Zhang et al. 2021). Adapters
(train.mode=adapters) that the checkpoint lacks start fresh inside the loaded encoder. A multi-task
(MT-DNN) workdir keeps one head per task under `task_heads` (finetune/multitask.py): the task's own is
taken when its shapes fit, so that single-task fine-tuning is MT-DNN's second stage.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from bert_jax import params_checkpoint
from bert_jax.errors import UserError
from bert_jax.models import families
from bert_jax.models.config import ModelConfig

_OWN_SENTENCEPIECE = ("xlnet_spm", "camembert_spm", "xlmr_spm", "deberta_spm")  # SentencePiece in a family's own id layout

ENCODER_KEYS = ("embeddings", "encoder", "pooler")
MULTITASK_HEADS = params_checkpoint.MULTITASK_HEADS  # a multi-task workdir's heads by task name


def model_config(config: ml_collections.ConfigDict, saved: dict | None) -> families.Config:
  """The checkpoint's architecture when there is one (config.model otherwise); dropout from config (set
  as the family's record says: ModernBERT has no hidden_dropout of its own)."""
  model = families.model_config(dict(saved["model"]) if saved else config.model.to_dict())
  model = families.of(model).with_dropout(model, config.model.hidden_dropout, config.model.attention_dropout)
  if not 1 <= config.data.max_seq_length <= model.max_position_embeddings:
    raise UserError(f"data.max_seq_length={config.data.max_seq_length} must be between 1 and the model's "
                    f"max_position_embeddings={model.max_position_embeddings}"
                    + (f" (from {config.init_from})" if saved else ""))
  return model


def load_tokenizer(config: ml_collections.ConfigDict):
  """data.vocab when set; else the tokenizer that travels with init_from; else the embedded vocabulary
  (what a pretraining run with data.vocab="" used). WordPiece or SentencePiece: `.path` is its file. A
  SentencePiece model (or tokenizer.json) as data.vocab for a family with its own SentencePiece layout
  (CamemBERT's and XLM-R's fairseq ids, XLNet's) is read in that layout."""
  from bert_jax.data_pipelines.tokenizers import load_tokenizer as load_vocab  # pylint: disable=import-outside-toplevel
  if config.data.vocab:
    return load_vocab(config.data.vocab, config.data.lower_case, kind=_vocab_kind(config))
  if config.init_from:
    import bert_jax  # pylint: disable=import-outside-toplevel
    return bert_jax.load_tokenizer(config.init_from)
  from bert_jax.data_pipelines import embedded  # pylint: disable=import-outside-toplevel
  return load_vocab(embedded.ensure_embedded()[1], config.data.lower_case)


def _vocab_kind(config: ml_collections.ConfigDict) -> str | None:
  """init_from's family's tokenizer kind where it is a SentencePiece layout of its own and data.vocab is a
  SentencePiece model or a tokenizer.json; None (the kind the file's name says) otherwise."""
  import bert_jax.pretrained  # pylint: disable=import-outside-toplevel
  vocab = config.data.vocab
  family = bert_jax.pretrained.family_name(config.init_from) if config.init_from else None
  kind = families.get(family).tokenizer if family else None
  spm_file = vocab.endswith(".model") or vocab.endswith(".json")
  return kind if spm_file and kind in _OWN_SENTENCEPIECE else None


def _head_compatible(fresh_head: Any, saved_head: Any) -> bool:
  same_tree = jax.tree.structure(fresh_head) == jax.tree.structure(saved_head)
  return same_tree and all(a.shape == b.shape for a, b in zip(jax.tree.leaves(fresh_head),
                                                               jax.tree.leaves(saved_head)))


def _adapters_added(saved: dict, fresh: dict) -> dict:
  """saved with the adapters that fresh has and saved lacks (saved itself when there are none)."""
  out = dict(saved)
  for key, value in fresh.items():
    if key.endswith("_adapter") and key not in saved:
      out[key] = value
    elif isinstance(value, dict) and isinstance(saved.get(key), dict):
      out[key] = _adapters_added(saved[key], value)
  return saved if all(out[k] is saved.get(k) for k in out) else out


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
      params[key] = _adapters_added(saved[key], fresh[key])
  same_task = (saved_config or {}).get("task", {}).get("name") == task_name
  if same_task and "head" in saved and _head_compatible(fresh["head"], saved["head"]):
    params["head"] = saved["head"]
  params_checkpoint.check_shapes(params, fresh, "init_from checkpoint")
  return params


def initial_params(config: ml_collections.ConfigDict, fresh: dict, saved_config: dict | None,
                   task_name: str) -> dict:
  """`fresh` (sharded) with what `merge` takes from config.init_from, restored into the same shardings."""
  # Shapes only: nothing is read before the merge has picked what to take.
  saved = params_checkpoint.params_metadata(config.init_from) if config.init_from else {}
  same_task = (saved_config or {}).get("task", {}).get("name") == task_name
  if config.eval_only and not ((same_task and "head" in saved) or task_name in saved.get(MULTITASK_HEADS, {})):
    raise UserError(f"eval_only needs init_from to be a fine-tuning workdir of task {task_name}")
  if not config.init_from:
    return fresh
  merged = merge(fresh, saved, saved_config, task_name)
  taken = [k for k in merged if k in saved and merged[k] is not fresh[k]]
  in_checkpoint = {jax.tree_util.keystr(k) for k, _ in jax.tree_util.tree_leaves_with_path(saved)}
  params = params_checkpoint.load_params_into(config.init_from, fresh, keep=taken,
                                              wanted=lambda name: name in in_checkpoint)
  return _multitask_head(config.init_from, params, saved.get(MULTITASK_HEADS, {}), task_name)


def _multitask_head(location: str, params: dict, saved_heads: dict, task_name: str) -> dict:
  """params with the task's head from a multi-task checkpoint's `task_heads`, when it has one that fits."""
  if "head" not in params or task_name not in saved_heads or not _head_compatible(params["head"],
                                                                                  saved_heads[task_name]):
    return params
  loaded = params_checkpoint.load_params_into(location, {MULTITASK_HEADS: {task_name: params["head"]}})
  print(f"initialised the {task_name} head from {location} (its multi-task head)", flush=True)
  return {**params, "head": loaded[MULTITASK_HEADS][task_name]}


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
