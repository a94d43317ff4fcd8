"""Sentence-BERT (Reimers & Gurevych 2019): a bi-encoder that maps each sentence to one vector.

  model.py      the encoder and its pooling (models/pooling.py) as one Flax module, read from any checkpoint
  embed.py      `Embedder`: sentences in, embeddings out, in a few compiled length buckets
  evaluate.py   STS (Spearman of cosine against gold), retrieval (recall@k, MRR@10) and search
  data.py       the scored-pairs (STS) file that evaluation reads
  losses.py     the bi-encoder's training losses on embeddings: NLI softmax on (u, v, |u - v|),
                cosine-similarity regression, multiple-negatives ranking
Conversion to and from sentence-transformers folders is bert_jax/conversion/sentence_transformers.py.
"""
