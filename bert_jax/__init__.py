"""bert_jax: BERT and its family in JAX/Flax, from pretraining at pod scale to fine-tuning."""


def load_pretrained(path: str, **kwargs):
  """(model, params) from a Hugging Face, original TF or bert_jax checkpoint; see bert_jax.pretrained."""
  from bert_jax import pretrained  # pylint: disable=import-outside-toplevel  (keeps `import bert_jax` light)
  return pretrained.load_pretrained(path, **kwargs)


def load_tokenizer(path: str):
  """The tokenizer that travels with a checkpoint; see bert_jax.pretrained."""
  from bert_jax import pretrained  # pylint: disable=import-outside-toplevel
  return pretrained.load_tokenizer(path)
