"""Sentence-BERT (Reimers & Gurevych 2019): a bi-encoder that maps each sentence to one vector.

  model.py      the encoder and its pooling (models/pooling.py) as one Flax module, read from any checkpoint
  embed.py      `Embedder`: sentences in, embeddings out, packed several to a row (or length buckets)
  evaluate.py   STS (Spearman of cosine against gold), retrieval (recall@k, MRR@10) and search
  data.py       the sentence-pair files: scored (STS), labelled (NLI), text pairs (ranking)
  losses.py     the bi-encoder's training losses on embeddings: NLI softmax on (u, v, |u - v|),
                cosine-similarity regression, multiple-negatives ranking (and its variants)
  gradcache.py  the ranking losses' step in chunks (GradCache): the global batch's gradient in a chunk's memory
  beir.py       retrieval scores of a BEIR-format folder (nDCG@k, MRR@k, recall@k as the beir package)
  train.py      the bi-encoder training job (`sbert`, configs/sbert.py) with those losses
  embedded.py   a small STS-format set built from the embedded corpus (the data given no files)
Conversion to and from sentence-transformers folders is bert_jax/conversion/sentence_transformers.py.
"""
from bert_jax import startup
startup.configure()  # before jax loads (bert_jax/startup.py: libtpu stays quiet where there is no TPU)
