"""Model definitions."""
from bert_jax.models.bert import BertModel, ModelOutput
from bert_jax.models.config import ModelConfig

__all__ = ["BertModel", "ModelConfig", "ModelOutput"]
