"""bert_jax: BERT and its family in JAX/Flax, from pretraining at pod scale to fine-tuning.

The public Python API is `__all__` (the documentation site's "Python API" page renders each from its
docstring). `import bert_jax` stays light: jax and TensorFlow load on the first call.
"""

from bert_jax import startup  # light: the entry points below call it before they load jax
from bert_jax.errors import UserError

__version__ = "0.2.0"

__all__ = ["load_pretrained", "load_tokenizer", "load_config", "Predictor", "Embedder", "UserError"]


def load_pretrained(path: str, **kwargs):
  """(model, params) from a Hugging Face, original TF or bert_jax checkpoint; see bert_jax.pretrained."""
  startup.configure()
  from bert_jax import pretrained  # pylint: disable=import-outside-toplevel  (keeps `import bert_jax` light)
  return pretrained.load_pretrained(path, **kwargs)


def load_tokenizer(path: str):
  """The tokenizer that travels with a checkpoint; see bert_jax.pretrained."""
  startup.configure()
  from bert_jax import pretrained  # pylint: disable=import-outside-toplevel
  return pretrained.load_tokenizer(path)


def load_config(spec: str, overrides=()):
  """The locked `ml_collections.ConfigDict` of `spec` (FILE:PRESET, as `--config` takes it) with
  `--config.KEY=VALUE` overrides applied; see bert_jax.config_utils."""
  from bert_jax import config_utils  # pylint: disable=import-outside-toplevel
  return config_utils.load_config(spec, overrides)


def __getattr__(name: str):
  """`bert_jax.Predictor` (bert_jax.finetune.predict) and `bert_jax.Embedder` (bert_jax.sbert.embed),
  imported on first use like load_pretrained."""
  if name == "Predictor":
    startup.configure()
    from bert_jax.finetune.predict import Predictor  # pylint: disable=import-outside-toplevel
    return Predictor
  if name == "Embedder":
    startup.configure()
    from bert_jax.sbert.embed import Embedder  # pylint: disable=import-outside-toplevel
    return Embedder
  raise AttributeError(f"module 'bert_jax' has no attribute {name!r}")
