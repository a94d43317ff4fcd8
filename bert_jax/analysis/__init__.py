"""BERTology: what the heads of a trained encoder do, on any checkpoint bert_jax loads.

  inputs.py      load a checkpoint's encoder and tokenizer; text lines -> padded batches
  statistics.py  per-head attention statistics (Clark et al. 2019): [CLS], [SEP], punctuation, ...
  patterns.py    attention pattern classes per head (Kovaleva et al. 2019), by a written rule
  effective.py   effective attention (Brunner et al. 2020) and its correlation with raw attention
  maps.py        the `analyze attention` job: the three above over a text file, JSON and plots
  finetuned.py   a fine-tuned workdir's model, dev set, loss and dev score under a head mask
  importance.py  head importance, ablations and the pruning curve (Michel et al. 2019): `analyze heads`
  change.py      per-layer change from a pretrained to a fine-tuned checkpoint: `analyze change`
  plots.py       the PNG figures (matplotlib, Agg)
The model side (attention probabilities, head masks, pruned heads) is in bert_jax/models/bert.py, and
the removal of heads from a checkpoint in bert_jax/training/prune.py.
"""
from bert_jax import startup
startup.configure()  # before jax loads (bert_jax/startup.py: libtpu stays quiet where there is no TPU)
