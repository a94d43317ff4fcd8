"""Model definitions: BERT's family (bert.py with config.py, electra.py, spanbert.py), ModernBERT
(modernbert.py; attention.py and rope.py serve both) and the family records (families.py, records/).

Importing the package registers every family, so `families.get` knows them all wherever it is called.
`model_config(values)` and `build(config)` (families') go from a saved or configured "model" dict to the
config object and its Flax module.
"""
from bert_jax import startup
startup.configure()  # before jax loads (bert_jax/startup.py: libtpu stays quiet where there is no TPU)
from bert_jax.models import records  # noqa: F401  (registers the families)
from bert_jax.models.bert import BertModel, ModelOutput
from bert_jax.models.config import ModelConfig
from bert_jax.models.families import build, model_config
from bert_jax.models.modernbert import ModernBertConfig, ModernBertModel

__all__ = ["BertModel", "ModelConfig", "ModelOutput", "ModernBertConfig", "ModernBertModel", "build",
           "model_config"]
