"""Sentence-BERT (Reimers & Gurevych 2019): a bi-encoder that maps each sentence to one vector.

  model.py      the encoder and its pooling (models/pooling.py) as one Flax module; its checkpoint record
  losses.py     the training objectives on embeddings: NLI softmax on (u, v, |u - v|), cosine-similarity
                regression, multiple-negatives ranking over the global batch
  objective.py  those losses as an objective of the shared sharded step (training/step.py)
  data.py       pair and triple files -> tokenized rows
  evaluate.py   STS (Spearman of cosine against gold) and retrieval (recall@k, MRR@10)
  embed.py      `Embedder`: sentences in, embeddings out, in length buckets of one compiled shape each
  trainer.py    the bi-encoder training job
Conversion to and from sentence-transformers folders is bert_jax/conversion/sentence_transformers.py.
"""
