"""Houlsby adapters in Hugging Face BERT, RoBERTa and ELECTRA models: the modeling code that `bert-jax
convert --to hf` ships with a model fine-tuned with train.mode=adapters.

conversion/hf.py copies this file next to the export's config.json (as modeling_houlsby_adapters.py),
whose `auto_map` points transformers' Auto classes here, so `AutoModelFor...from_pretrained(DIR,
trust_remote_code=True)` and `pipeline(..., trust_remote_code=True)` build the model with its adapters.
Its own model_type keeps a plain load (without trust_remote_code) from silently dropping them. It
imports only torch and transformers: it runs where bert_jax is not installed.

Each layer's two output blocks (attention.output and output) compute
LayerNorm(x + adapter(dropout(dense(h)))), adapter(y) = y + up(act(down(y))), as bert_jax's
TransformerLayer with config.adapter_size (models/bert.py: Adapter). Parameter names are HF's, plus
attention.output.adapter.{down,up} and output.adapter.{down,up} in each layer.
"""
import torch
from torch import nn
from transformers import (BertConfig, BertForQuestionAnswering, BertForSequenceClassification,
                          BertForTokenClassification, ElectraConfig, ElectraForQuestionAnswering,
                          ElectraForTokenClassification, RobertaConfig, RobertaForQuestionAnswering,
                          RobertaForSequenceClassification, RobertaForTokenClassification)
from transformers.activations import ACT2FN


class Adapter(nn.Module):
  def __init__(self, config):
    super().__init__()
    self.down = nn.Linear(config.hidden_size, config.adapter_size)
    self.up = nn.Linear(config.adapter_size, config.hidden_size)
    self.act = ACT2FN[config.hidden_act]

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    return x + self.up(self.act(self.down(x)))


class AdaptedOutput(nn.Module):
  """A layer's SelfOutput or Output block (same parameters) with the adapter before the residual sum."""

  def __init__(self, block: nn.Module, config):
    super().__init__()
    self.dense, self.dropout, self.LayerNorm = block.dense, block.dropout, block.LayerNorm
    self.adapter = Adapter(config)

  def forward(self, hidden_states: torch.Tensor, input_tensor: torch.Tensor) -> torch.Tensor:
    return self.LayerNorm(self.adapter(self.dropout(self.dense(hidden_states))) + input_tensor)


class WithAdapters:
  """Mixin before a transformers task class: its model, then an adapter in each layer's output blocks."""

  def __init__(self, config):
    super().__init__(config)
    for layer in self.base_model.encoder.layer:
      layer.attention.output = AdaptedOutput(layer.attention.output, config)
      layer.output = AdaptedOutput(layer.output, config)


class BertAdaptersConfig(BertConfig):
  model_type = "bert_houlsby_adapters"


class RobertaAdaptersConfig(RobertaConfig):
  model_type = "roberta_houlsby_adapters"


class ElectraAdaptersConfig(ElectraConfig):
  model_type = "electra_houlsby_adapters"


class BertAdaptersForSequenceClassification(WithAdapters, BertForSequenceClassification):
  config_class = BertAdaptersConfig


class BertAdaptersForTokenClassification(WithAdapters, BertForTokenClassification):
  config_class = BertAdaptersConfig


class BertAdaptersForQuestionAnswering(WithAdapters, BertForQuestionAnswering):
  config_class = BertAdaptersConfig


class RobertaAdaptersForSequenceClassification(WithAdapters, RobertaForSequenceClassification):
  config_class = RobertaAdaptersConfig


class RobertaAdaptersForTokenClassification(WithAdapters, RobertaForTokenClassification):
  config_class = RobertaAdaptersConfig


class RobertaAdaptersForQuestionAnswering(WithAdapters, RobertaForQuestionAnswering):
  config_class = RobertaAdaptersConfig


class ElectraAdaptersForTokenClassification(WithAdapters, ElectraForTokenClassification):
  config_class = ElectraAdaptersConfig


class ElectraAdaptersForQuestionAnswering(WithAdapters, ElectraForQuestionAnswering):
  config_class = ElectraAdaptersConfig
