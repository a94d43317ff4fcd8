"""A BiLSTM student (Tang et al. 2019, "Distilling Task-Specific Knowledge from BERT into Simple Neural
Networks"): word-piece embeddings, a bidirectional LSTM, the two directions' final states concatenated
and a ReLU layer over them; the fine-tuning head's classifier reads that layer (`pooled_output`).

It is a family (models/records/bilstm.py) so that it fine-tunes, distils (`configs/distill.py:bilstm`),
predicts and saves as every student does. Differences from the paper: the embeddings are the
teacher's word pieces, not word2vec's words (trained from scratch, or copied from a BERT checkpoint's
word embeddings where the widths agree); a sentence pair is read as one sequence ([CLS] a [SEP] b [SEP],
the teacher's input) rather than by the paper's siamese encoder. The final states are taken at each
row's last real token (forward) and its first (backward): padding never enters them.
"""
from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax.numpy as jnp

from bert_jax import config_schema
from bert_jax.errors import UserError
from bert_jax.models.bert import ModelOutput
from bert_jax.models.config import FamilyConfig


@dataclasses.dataclass(frozen=True)
class BiLSTMConfig(FamilyConfig):
  """The BiLSTM's sizes. Defaults are the paper's: 300-wide embeddings, 150 units per direction, a
  400-wide ReLU layer (`hidden_size`: the width the fine-tuning head reads).

  num_layers: stacked BiLSTM layers (each reads the previous one's two directions, concatenated).
  max_position_embeddings: the longest input (an LSTM has no position table; the tokenizer path reads it).
  use_pooler: the ReLU layer over the final states (`pooled_output`); the sequence heads need it.
  """
  FAMILY_NAME = "BiLSTM"  # not a field: the name its config errors use
  vocab_size: int = 30522
  embedding_size: int = 300
  lstm_size: int = 150
  num_layers: int = 1
  hidden_size: int = 400
  max_position_embeddings: int = 512
  hidden_dropout: float = 0.1
  attention_dropout: float = 0.0  # no attention: kept for the fine-tuning path's dropout settings
  initializer_range: float = 0.02
  use_pooler: bool = True
  dtype: str = "float32"
  param_dtype: str = "float32"
  scan_layers: bool = False
  family: str = "bilstm"

  # What code shared with the transformer families asks of a config.
  rtd_head = False
  share_layers = "none"
  pruned_heads = ()
  mlm_head = False

  def __post_init__(self):
    config_schema.check_block("model", self)  # the plain fields' ranges
    if self.embedding_size <= 0:
      raise UserError(f"model.embedding_size={self.embedding_size} must be >= 1 (this family has no 0 for "
                      "model.hidden_size)")
    if self.family != "bilstm":
      raise UserError(f"model.family={self.family!r}: this is the BiLSTM's config")
    if self.scan_layers:
      raise UserError("model.scan_layers=True: the BiLSTM's layers are not scanned (set it to False)")


class BiLSTMModel(nn.Module):
  """The family module (models/families.py's contract): last_hidden_state [B, T, 2 * lstm_size], the last
  layer's two directions; pooled_output [B, hidden_size]; hidden_states (asked for) the embeddings and
  each layer's output, when embedding_size == 2 * lstm_size (else a one-line error)."""
  config: BiLSTMConfig

  @nn.compact
  def __call__(self, input_ids, attention_mask=None, token_type_ids=None, *, deterministic: bool = True,
               output_hidden_states: bool = False, output_attentions: bool = False, head_mask=None,
               masked_positions=None) -> ModelOutput:
    del token_type_ids, head_mask, masked_positions
    cfg = self.config
    if output_attentions:
      raise UserError("the BiLSTM has no attention maps (distill.attention_weight needs a transformer student)")
    if attention_mask is None:
      attention_mask = jnp.ones_like(input_ids)
    lengths = jnp.maximum(jnp.sum(attention_mask, axis=-1), 1).astype(jnp.int32)
    x = nn.Embed(cfg.vocab_size, cfg.embedding_size, dtype=cfg.compute_dtype, param_dtype=cfg.weight_dtype,
                 embedding_init=nn.initializers.normal(cfg.initializer_range), name="word_embeddings")(input_ids)
    x = nn.Dropout(cfg.hidden_dropout)(x, deterministic=deterministic)
    states = [x]
    finals = None
    for i in range(cfg.num_layers):
      cell = lambda: nn.OptimizedLSTMCell(cfg.lstm_size, dtype=cfg.compute_dtype,  # noqa: E731
                                          param_dtype=cfg.weight_dtype, parent=None)  # adopted by its RNN
      (_, forward_h), forward = nn.RNN(cell(), return_carry=True, name=f"forward_{i}")(x, seq_lengths=lengths)
      (_, backward_h), backward = nn.RNN(cell(), return_carry=True, reverse=True, keep_order=True,
                                         name=f"backward_{i}")(x, seq_lengths=lengths)
      x = jnp.concatenate([forward, backward], axis=-1) * attention_mask[..., None].astype(forward.dtype)
      finals = jnp.concatenate([forward_h, backward_h], axis=-1)
      if i + 1 < cfg.num_layers:
        x = nn.Dropout(cfg.hidden_dropout)(x, deterministic=deterministic)
      states.append(x)
    pooled = None
    if cfg.use_pooler:
      pooled = nn.relu(nn.Dense(cfg.hidden_size, dtype=cfg.compute_dtype, param_dtype=cfg.weight_dtype,
                                name="pooler")(finals))
    hidden_states = None
    if output_hidden_states:
      if cfg.embedding_size != 2 * cfg.lstm_size:
        raise UserError(f"every layer's output of this BiLSTM is asked for, but its embeddings ({cfg.embedding_size}) "
                        f"and layers ({2 * cfg.lstm_size}) differ in width")
      hidden_states = jnp.stack(states)
    return ModelOutput(last_hidden_state=x, pooled_output=pooled, hidden_states=hidden_states)


def parameter_count(section) -> int:
  """The backbone's parameters from a config's model section (`bert-jax presets`)."""
  e, u, layers = section["embedding_size"], section["lstm_size"], section["num_layers"]
  lstm = sum(2 * 4 * u * ((e if i == 0 else 2 * u) + u + 1) for i in range(layers))
  pooler = (2 * u + 1) * section["hidden_size"] if section.get("use_pooler", True) else 0
  return section["vocab_size"] * e + lstm + pooler

