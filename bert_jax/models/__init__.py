"""Model definitions (bert.py, electra.py, spanbert.py) and the family records (families.py, records/).

Importing the package registers every family, so `families.get` knows them all wherever it is called.
"""
from bert_jax.models import records  # noqa: F401  (registers the families)
from bert_jax.models.bert import BertModel, ModelOutput
from bert_jax.models.config import ModelConfig

__all__ = ["BertModel", "ModelConfig", "ModelOutput"]
