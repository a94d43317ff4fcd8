"""bert_jax: BERT and its family in JAX/Flax, from pretraining at pod scale to fine-tuning."""

from bert_jax import startup  # light: the entry points below call it before they load jax

__version__ = "0.2.0"


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


def __getattr__(name: str):
  """`bert_jax.Predictor` (bert_jax.finetune.predict), imported on first use like load_pretrained."""
  if name == "Predictor":
    startup.configure()
    from bert_jax.finetune.predict import Predictor  # pylint: disable=import-outside-toplevel
    return Predictor
  raise AttributeError(f"module 'bert_jax' has no attribute {name!r}")
