"""Progressive stacking (Gong et al. 2019): double a trained encoder's depth by copying its layers.

Layer i + L of the grown model starts as a copy of layer i (the paper's stacking: the trained stack is
put on top of itself). Embeddings and heads are kept. Scanned encoders (params stacked on a leading
`layers` axis) are concatenated with themselves; unrolled ones get `layer_{i+L}` = `layer_i`. With full
sharing there is one layer whatever the depth, so only `model.num_layers` changes. Every `encoder` in
the tree grows (ELECTRA has two). The result is a params checkpoint that `--config.init_from` accepts;
the optimizer starts afresh.
"""
from __future__ import annotations

import copy
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from bert_jax import params_checkpoint, workdir
from bert_jax.errors import UserError
from bert_jax.training import objectives


def grow_encoder(encoder: dict[str, Any], share_layers: str) -> dict[str, Any]:
  """One encoder's params with L -> 2L layers."""
  if share_layers == "all":
    return encoder
  if "layers" in encoder:
    return {**encoder, "layers": jax.tree.map(lambda x: jnp.concatenate([x, x], axis=0), encoder["layers"])}
  num = sum(1 for k in encoder if k.startswith("layer_"))
  if num == 0:
    raise UserError(f"an encoder with neither `layers` nor `layer_<i>` params: {sorted(encoder)}")
  return {**encoder, **{f"layer_{i + num}": encoder[f"layer_{i}"] for i in range(num)}}


def grow_params(params: Any, share_layers: str) -> Any:
  """The tree with every `encoder` subtree doubled in depth."""
  if not isinstance(params, dict):
    return params
  return {k: grow_encoder(v, share_layers) if k == "encoder" else grow_params(v, share_layers)
          for k, v in params.items()}


def _abstract_params(config: ml_collections.ConfigDict) -> Any:
  objective = objectives.make_objective(config)
  batch = objectives.example_batch(1, 8, 2)
  return nn.meta.unbox(jax.eval_shape(functools.partial(objective.init, batch=batch), jax.random.key(0)))


def _tokenizer_files(source: str, config: dict) -> dict[str, str]:
  """The vocabulary a workdir carries next to its config.json (data.vocab names it relative)."""
  vocab = config.get("data", {}).get("vocab", "")
  located = workdir.vocab_file(source, config) if vocab and workdir.path(vocab).name == vocab else None
  return {vocab: str(located)} if located else {}


def grow(source: str, destination: str) -> dict[str, Any]:
  """Writes to `destination` a params checkpoint of `source`'s model with twice the layers."""
  params, config = params_checkpoint.load_params(source)
  grown_config = copy.deepcopy(config)
  layers = config["model"]["num_layers"]
  grown_config["model"]["num_layers"] = 2 * layers
  grown = grow_params(params, config["model"]["share_layers"])
  params_checkpoint.check_shapes(grown, _abstract_params(ml_collections.ConfigDict(grown_config)),
                          f"{source} grown to {2 * layers} layers")
  grown_config["init_from"] = ""
  params_checkpoint.save_params(destination, grown, grown_config, _tokenizer_files(source, config))
  return {"from": source, "to": destination, "num_layers": [layers, 2 * layers]}
