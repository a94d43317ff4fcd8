"""The bi-encoder: the encoder without pretraining heads, then its pooling, as one Flax module; and
reading one from any checkpoint.

SentenceEncoder's parameters are the encoder's (embeddings, encoder) at the top level, as in every
bert_jax checkpoint, so any checkpoint's encoder loads into it by key. A checkpoint records its pooling
in config.json (conversion/native.py: "sentence_embedding", what `convert --from hf` of a
sentence-transformers folder writes); one that does not (a plain pretrained or HF model) is pooled as
sentence-transformers pools a plain HF model: mean pooling, no normalisation, at most 512 tokens.
"""
from __future__ import annotations

import flax.linen as nn
import jax

from bert_jax import pretrained
from bert_jax.conversion import common
from bert_jax.models import families
from bert_jax.models.pooling import Pooling

Array = jax.Array
ENCODER_KEYS = ("embeddings", "encoder")


def encoder_config(config: families.Config) -> families.Config:
  """The encoder alone: no pooler (pooling reads the token vectors), no pretraining heads."""
  return families.of(config).with_heads(config, ())


class SentenceEncoder(nn.Module):
  """input_ids, attention_mask int32[B, T] -> embeddings float32[B, D] (D = len(pooling.modes) x hidden);
  the encoder is the config's family module (BertModel, ModernBertModel)."""
  config: families.Config
  pooling: Pooling

  def setup(self):
    self.encoder_model = families.build(encoder_config(self.config))
    nn.share_scope(self, self.encoder_model)

  def __call__(self, input_ids: Array, attention_mask: Array, *, deterministic: bool = True) -> Array:
    out = self.encoder_model(input_ids, attention_mask, deterministic=deterministic)
    return self.pooling(out.last_hidden_state, attention_mask)

  def packed(self, input_ids: Array, document_ids: Array, position_ids: Array, slots: int) -> Array:
    """Several sentences per row: input_ids, document_ids (1, 2, ... per sentence, 0 on padding) and
    position_ids (restarting at each sentence) int32[B, T] -> embeddings float32[B, slots, D], slot s the
    row's sentence s + 1, as `__call__` embeds it alone (attention stays within a sentence)."""
    mask = (document_ids > 0).astype(input_ids.dtype)
    out = self.encoder_model(input_ids, mask, position_ids=position_ids, document_ids=document_ids,
                             deterministic=True)
    return self.pooling.packed(out.last_hidden_state, document_ids, slots)


def default_pooling(config: families.Config) -> Pooling:
  return Pooling(("mean",), False, min(config.max_position_embeddings, 512))


def from_checkpoint(path: str) -> tuple[SentenceEncoder, dict, common.Tokenizer | None, list[str]]:
  """(model, its encoder params, the tokenizer record, notes) of any checkpoint `read_checkpoint` takes."""
  converted = pretrained.read_checkpoint(path)
  notes = []
  pooling = converted.pooling
  if pooling is None:
    pooling = default_pooling(converted.config)
    notes.append(f"{path} records no sentence pooling: mean pooling over at most {pooling.max_seq_length} tokens, "
                 "as sentence-transformers pools a plain model")
  params = {k: converted.params[k] for k in ENCODER_KEYS}
  return SentenceEncoder(converted.config, pooling), params, converted.tokenizer, notes
