"""The encoder with one fine-tuning head.

The encoder's parameters sit at the top level of the tree (embeddings, encoder, pooler) exactly as in
a pretraining checkpoint, and the head under `head`, so pretrained and fine-tuned checkpoints load
into each other by key. Heads:
  classification / regression on [CLS]: pooled output (or the layer mix), dropout, dense -> [B, C]
  layer mix ("taking more layers into account"): softmax(w) weighted sum of every layer's [CLS]
    vector (embeddings included) times a learned scale, as ELMo's scalar mix
  token: dropout, dense on every position -> [B, T, C]
  span: dense on every position -> start and end logits [B, T], padding masked out
Token and span heads with pooling=layer_mix read the same mix of every layer's vector at each position
instead of the last layer's (the BERT paper's feature-based NER mixes layers this way).
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.models import bert
from bert_jax.models.config import ModelConfig
from bert_jax.models.dropout import Dropout

Array = jax.Array
POOLINGS = ("pooled", "layer_mix")


class LayerMix(nn.Module):
  """[L+1, B, ..., H] -> [B, ..., H]: gamma * sum_l softmax(w)_l h_l ([CLS] vectors or every token's)."""

  @nn.compact
  def __call__(self, layers: Array) -> Array:
    # Not named "layers": that logical name marks scanned, stacked layer weights.
    weights = self.param("layer_weights", nn.with_logical_partitioning(nn.initializers.zeros_init(),
                                                                       (None,)), (layers.shape[0],))
    gamma = self.param("gamma", nn.with_logical_partitioning(nn.initializers.ones_init(), ()), ())
    mixed = jnp.tensordot(jax.nn.softmax(weights), layers.astype(jnp.float32), axes=1)
    return (gamma * mixed).astype(layers.dtype)


class Head(nn.Module):
  config: ModelConfig
  kind: str
  num_labels: int
  pooling: str = "pooled"
  dropout: float = 0.1

  @nn.compact
  def __call__(self, out: bert.ModelOutput, attention_mask: Array, deterministic: bool) -> dict[str, Array]:
    cfg = self.config
    drop = Dropout(self.dropout)
    if self.kind in ("span", "token"):
      tokens = (LayerMix(name="layer_mix")(out.hidden_states) if self.pooling == "layer_mix"
                else out.last_hidden_state)
    if self.kind == "span":
      logits = bert.dense(cfg, 2, ("embed", "classes"), "span")(tokens).astype(jnp.float32)
      logits = jnp.where(attention_mask[..., None] > 0, logits, -1e9)
      return {"start_logits": logits[..., 0], "end_logits": logits[..., 1]}
    if self.kind == "token":
      h = drop(tokens, deterministic=deterministic)
      return {"logits": bert.dense(cfg, self.num_labels, ("embed", "classes"), "classifier")(h)
                        .astype(jnp.float32)}
    if self.pooling == "layer_mix":
      h = LayerMix(name="layer_mix")(out.hidden_states[:, :, 0])
    else:
      h = out.pooled_output
    logits = bert.dense(cfg, self.num_labels, ("embed", "classes"), "classifier")(
        drop(h, deterministic=deterministic)).astype(jnp.float32)
    return {"logits": logits[:, 0] if self.kind == "regression" else logits}


class FinetuneModel(nn.Module):
  """BertModel (pretraining heads off) + Head; returns the head's outputs as a dict."""
  config: ModelConfig
  kind: str
  num_labels: int
  pooling: str = "pooled"
  head_dropout: float = 0.1

  def setup(self):
    self.encoder_model = bert.BertModel(self.config)
    nn.share_scope(self, self.encoder_model)
    self.head = Head(self.config, self.kind, self.num_labels, self.pooling, self.head_dropout)

  def __call__(self, input_ids: Array, attention_mask: Array, token_type_ids: Array, *,
               deterministic: bool = True, head_mask: Array | None = None) -> dict[str, Array]:
    """input_ids, attention_mask, token_type_ids: int32[B, T]; head_mask: [L, N] or [N] (BertModel)."""
    out = self.encoder_model(input_ids, attention_mask, token_type_ids, deterministic=deterministic,
                             output_hidden_states=self.pooling == "layer_mix", head_mask=head_mask)
    return self.head(out, attention_mask, deterministic)


def encoder_config(config: ModelConfig, kind: str, pooling: str) -> ModelConfig:
  """The encoder without pretraining heads; the pooler only where a [CLS] head reads it."""
  return config.replace(mlm_head=False, sentence_head="none", rtd_head=False,
                        use_pooler=kind in ("classification", "regression") and pooling == "pooled")
