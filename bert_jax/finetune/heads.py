"""The encoder with one fine-tuning head.

The encoder's parameters sit at the top level of the tree (embeddings, encoder, pooler) exactly as in
a pretraining checkpoint, and the head under `head`, so pretrained and fine-tuned checkpoints load
into each other by key. The encoder is the config's family module (models/families.py); the head is
its kind's module (models/head_kinds.py, where each kind's loss, outputs and export live).
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.models import families, head_kinds
from bert_jax.models.head_kinds import CLS_NORMS, POOLINGS  # noqa: F401  (head.cls_norm's, head.pooling's choices)

Array = jax.Array


class FinetuneModel(nn.Module):
  """The family's encoder (pretraining heads off) + the kind's head; returns the head's outputs as a dict."""
  config: families.Config
  kind: str
  num_labels: int
  pooling: str = "pooled"
  head_dropout: float = 0.1
  cls_norm: str = "none"  # head.cls_norm: none | isobn (models/isobn.py)

  def setup(self):
    self.encoder_model = families.build(self.config)
    nn.share_scope(self, self.encoder_model)
    self.head = head_kinds.get(self.kind).build(self.config, self.num_labels, self.pooling, self.head_dropout,
                                                self.cls_norm)

  def __call__(self, input_ids: Array, attention_mask: Array, token_type_ids: Array, *,
               deterministic: bool = True, head_mask: Array | None = None,
               labels: dict[str, Array] | None = None, position_ids: Array | None = None,
               document_ids: Array | None = None, unpad_index: Array | None = None) -> dict[str, Array]:
    """input_ids, attention_mask, token_type_ids: int32[B, T], or [G, K, T]: rows in groups (a ranking
    head's training batches, finetune/ranking.py), run as G * K rows and given back as [G, K, ...];
    head_mask: [L, N] or [N] (BertModel); labels: the head kind's label_inputs, given when the loss is
    computed (xlnet_beam's start_positions), passed to the head as keyword arguments. With unpad_index
    (models/unpad.py: a packed batch) input_ids, token_type_ids, position_ids and document_ids are the packed
    rows [R, T], attention_mask the padded batch's [B, T], and the outputs are the padded batch's."""
    groups = input_ids.shape[:-1]
    if len(groups) > 1:
      input_ids, attention_mask, token_type_ids = (x.reshape(-1, x.shape[-1])
                                                   for x in (input_ids, attention_mask, token_type_ids))
    encoder_mask, packed = attention_mask, {}
    if unpad_index is not None:
      encoder_mask = (document_ids > 0).astype(jnp.int32)
      packed = {"position_ids": position_ids, "document_ids": document_ids, "unpad_index": unpad_index}
    out = self.encoder_model(input_ids, encoder_mask, token_type_ids, deterministic=deterministic,
                             output_hidden_states=self.pooling == "layer_mix", head_mask=head_mask, **packed)
    outputs = self.head(out, attention_mask, deterministic, **(labels or {}))
    if len(groups) > 1:  # per-row outputs back in groups; scalars (head.cls_norm's state_loss) as they are
      outputs = {k: v.reshape(groups + v.shape[1:]) if v.ndim else v for k, v in outputs.items()}
    return outputs


def encoder_config(config: families.Config, kind: str, pooling: str) -> families.Config:
  """The encoder without pretraining heads; the pooler (the family's summary heads) only where a
  sequence-level head reads it."""
  return head_kinds.get(kind).encoder_config(config, pooling)
