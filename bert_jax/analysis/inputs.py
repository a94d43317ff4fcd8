"""A checkpoint's encoder and tokenizer, and text lines as the padded batches the analyses run on.

A text file holds one input per line: a sentence, or two segments separated by a tab (encoded as
[CLS] a [SEP] b [SEP], as Clark et al. fed pairs of Wikipedia segments). Batches are padded to a
whole number of rows by repeating row 0 with `example_weight` 0, so one compiled program serves all.
"""
from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, Iterator

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.errors import UserError
from bert_jax.finetune import features as feats
from bert_jax.models.bert import BertModel, ModelOutput
from bert_jax.models.config import ModelConfig

BACKBONE = ("embeddings", "encoder")


@dataclasses.dataclass
class Subject:
  """The encoder under study: its config (no heads, no pooler), parameters and tokenizer."""
  path: str
  config: ModelConfig
  params: dict
  tokenizer: Any

  @property
  def model(self) -> BertModel:
    return BertModel(self.config)


def backbone_config(config: ModelConfig) -> ModelConfig:
  return config.replace(use_pooler=False, mlm_head=False, sentence_head="none", rtd_head=False,
                        hidden_dropout=0.0, attention_dropout=0.0)


def load_subject(path: str) -> Subject:
  """Any checkpoint `bert_jax.load_pretrained` reads (HF, original TF, bert_jax, fine-tuned workdir)."""
  import bert_jax  # pylint: disable=import-outside-toplevel
  model, params = bert_jax.load_pretrained(path)
  return Subject(path, backbone_config(model.config), {k: params[k] for k in BACKBONE},
                 bert_jax.load_tokenizer(path))


def read_lines(path: str, limit: int = 0) -> list[tuple[str, str | None]]:
  """(segment a, segment b or None) for each non-empty line (tab-separated pairs), at most `limit`."""
  if not os.path.isfile(path):
    raise UserError(f"--text {path} is not a file; give a text file with one sentence (or a tab-separated "
                    "pair) per line")
  rows = []
  with open(path, encoding="utf-8") as f:
    for line in f:
      parts = line.rstrip("\n").split("\t")
      if parts[0].strip():
        rows.append((parts[0], parts[1] if len(parts) > 1 and parts[1].strip() else None))
      if limit and len(rows) == limit:
        break
  if not rows:
    raise UserError(f"--text {path} has no non-empty lines")
  return rows


def encode(tokenizer, rows: list[tuple[str, str | None]], max_length: int) -> dict[str, np.ndarray]:
  """input_ids, attention_mask, token_type_ids int32[N, max_length] ([CLS] a [SEP] (b [SEP]))."""
  return feats.stack([feats.encode_pair(tokenizer, tokenizer.encode(a),
                                        tokenizer.encode(b) if b is not None else None, max_length)
                      for a, b in rows])


def batches(features: dict[str, np.ndarray], batch_size: int) -> Iterator[dict[str, np.ndarray]]:
  """Rows in batches of `batch_size`, each with example_weight (0 on the rows that pad the last)."""
  padded = feats.pad_to_multiple(features, batch_size)
  for start in range(0, len(padded["input_ids"]), batch_size):
    yield {k: v[start:start + batch_size] for k, v in padded.items()}


@functools.partial(jax.jit, static_argnums=0)
def run(config: ModelConfig, params: dict, batch: dict[str, jax.Array]) -> ModelOutput:
  """Every layer's input and attention probabilities: hidden_states [L+1, B, T, H], attentions."""
  return BertModel(config).apply({"params": params}, batch["input_ids"], batch["attention_mask"],
                                 batch["token_type_ids"], output_hidden_states=True, output_attentions=True)


def layer_params(params: dict, config: ModelConfig, layer: int) -> dict:
  """The parameters that layer `layer` applies, whatever the encoder's layout (scanned, unrolled, shared)."""
  encoder = params["encoder"]
  if config.share_layers == "all":
    return encoder["layers" if config.scan_layers else "layer"]
  if config.scan_layers:
    return jax.tree.map(lambda x: x[layer], encoder["layers"])
  shared = {"attention": encoder.get("shared_attention"), "feed_forward": encoder.get("shared_feed_forward")}
  return {**encoder[f"layer_{layer}"], **{k: v for k, v in shared.items() if v is not None}}


def special_positions(input_ids: jax.Array, tokenizer) -> dict[str, jax.Array]:
  """bool[B, T] masks of the [CLS] and [SEP] tokens (RoBERTa's <s> and </s>)."""
  return {name: input_ids == tokenizer.special_ids[token] for name, token in (("cls", "[CLS]"), ("sep", "[SEP]"))}


def check_length(max_length: int, config: ModelConfig) -> None:
  if not 2 < max_length <= config.max_position_embeddings:
    raise UserError(f"--max-length {max_length} must be between 3 and the model's max_position_embeddings "
                    f"{config.max_position_embeddings}")


def as_jnp(batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
  return {k: jnp.asarray(v) for k, v in batch.items()}
