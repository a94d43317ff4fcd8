"""Bi-encoder (Sentence-BERT) training: an encoder and its pooling fine-tuned on sentence pairs.

  bert-jax finetune --config configs/sbert.py:nli --config.init_from=bert-base-uncased \
      --config.data.train_file=nli/train.tsv --config.data.dev_file=stsb/dev.tsv --workdir runs/sbert-nli
  bert-jax finetune --config configs/sbert.py:sts --config.init_from=runs/sbert-nli \
      --config.data.train_file=stsb/train.tsv --config.data.dev_file=stsb/dev.tsv --workdir runs/sbert-sts
  bert-jax finetune --config configs/sbert.py:mnr --config.init_from=CKPT --config.data.train_file=pairs.tsv \
      --workdir runs/sbert-mnr
  bert-jax finetune --config configs/sbert.py:tiny --workdir runs/sbert-tiny   # offline: a random encoder, 124 steps
  bert-jax embed --model runs/sbert-sts --input sentences.txt --output embeddings.npy

The job is bert_jax/sbert/train.py (its docstring: the losses, the files it reads, the workdir it writes).
The recipes are the SBERT paper's (Reimers & Gurevych 2019): mean pooling, batch 16, Adam at 2e-5 with
10% warmup, one epoch of NLI with the softmax loss, four of STS-B with the cosine loss; multiple-negatives
ranking with sentence-transformers' scale of 20 and a larger batch (each row's negatives are the other
rows of the global batch). Given no data files, a preset trains and evaluates on the small STS-format set
bert_jax builds from the embedded corpus (bert_jax/sbert/embedded.py). The model section is used only
without init_from (the checkpoint's architecture wins otherwise): then the encoder starts from random
weights, and the run's first line says so.
"""
import ml_collections

from bert_jax.configs import common

PRESETS = {
    "nli": "SBERT on NLI: a softmax classifier on (u, v, |u - v|) of premise and hypothesis",
    "sts": "SBERT on STS: cosine-similarity regression against the pairs' scores (0-5)",
    "mnr": "multiple-negatives ranking on (anchor, positive) pairs, the global batch's other rows as negatives",
    "tiny": "a tiny random encoder (no init_from) on the embedded STS set (cosine loss): offline, 124 steps",
}
LOSSES = {"nli": "softmax", "sts": "cosine", "mnr": "ranking", "tiny": "cosine"}


def get_config(arg: str = "sts") -> ml_collections.ConfigDict:
  common.check_preset(arg, PRESETS)
  c = ml_collections.ConfigDict()
  c.job = "sbert"  # the job kind (bert_jax/jobs.py); `bert-jax finetune` runs it
  c.task = ml_collections.ConfigDict({"family": "sbert", "name": arg})
  c.loss = LOSSES[arg]  # softmax (NLI) | cosine (STS) | ranking (multiple negatives)
  c.init_from = ""  # any checkpoint: a bert_jax workdir or params checkpoint, a HF or TF one
  c.model = common.model_config(num_layers=2, hidden_size=128, num_heads=2, intermediate_size=512)

  c.pooling = ml_collections.ConfigDict()
  c.pooling.modes = ("mean",)  # cls | max | mean | mean_sqrt_len_tokens, concatenated in this order
  c.pooling.normalize = False  # L2-normalise the embedding (sentence-transformers' Normalize module)
  c.softmax = ml_collections.ConfigDict({"labels": ("contradiction", "entailment", "neutral")})  # NLI's names
  c.cosine = ml_collections.ConfigDict({"score_scale": 5.0})  # gold scores are divided by it (STS-B: 0..5)
  c.ranking = ml_collections.ConfigDict({"scale": 20.0})  # scores = scale * cosine
  # sentence-transformers' MultipleNegativesRankingLoss: ("query_to_doc", "doc_to_query") with "per_direction"
  # is its symmetric loss, all four directions "joint" GTE's; train.grad_accum_steps=K: GradCache in K chunks
  c.ranking.directions = ("query_to_doc",)  # and any of query_to_query, doc_to_query, doc_to_doc
  c.ranking.partition_mode = "joint"  # joint | per_direction
  # > 0: GradCache embeds each device's sentences in chunks of at most this many (padded) tokens, in length
  # order at the smallest length bucket that holds them (sbert/gradcache.py: TokenChunks); 0: chunks of rows
  c.ranking.chunk_tokens = 0
  # Matryoshka (sentence-transformers' MatryoshkaLoss): the loss summed over these prefixes of the embedding,
  # e.g. (768, 512, 256, 128, 64), weighted by matryoshka_weights (empty: 1 each); `bert-jax embed --dim`
  c.ranking.matryoshka_dims = ()
  c.ranking.matryoshka_weights = ()

  c.data = ml_collections.ConfigDict()
  # softmax: premise<TAB>hypothesis<TAB>label; cosine: sentence1<TAB>sentence2<TAB>score; ranking:
  # anchor<TAB>positive[<TAB>hard negative]. "": the embedded STS set's training pairs
  c.data.train_file = ""
  c.data.dev_file = ""  # sentence1<TAB>sentence2<TAB>score, scored by Spearman; "": the embedded STS set's dev pairs
  c.data.embedded_train = 2000  # corpus sentences for the embedded set's training pairs ...
  c.data.embedded_dev = 300  # ... and for its dev pairs
  c.data.vocab = ""  # "" : the checkpoint's vocabulary (the embedded one without init_from)
  c.data.lower_case = True
  c.data.max_seq_length = 128  # tokens per sentence, [CLS] and [SEP] included; the model's max_seq_length

  # Shared fields: bert_jax/config_schema.py; the others are the optimizer's (finetune/optim.py).
  c.optimizer = common.optimizer_config(learning_rate=2e-5, warmup_ratio=0.1)
  c.optimizer.head_learning_rate = 0.0  # the softmax classifier's rate; 0: learning_rate
  c.optimizer.layer_decay = 1.0
  c.optimizer.bias_correction = True
  c.train = common.train_config(batch_size=16, epochs=1.0, eval_batch_size=64, eval_every_epochs=1.0)
  c.checkpoint = common.checkpoint_config()
  c.mesh = common.mesh_config()

  if arg == "sts":
    c.train.epochs = 4.0
  elif arg == "mnr":
    c.train.batch_size = 64
  elif arg == "tiny":
    c.model.update(num_layers=2, hidden_size=64, num_heads=2, intermediate_size=256, max_position_embeddings=64)
    c.data.max_seq_length = 48
    c.optimizer.learning_rate = 1e-4  # a tiny model: the BERT-base rate barely moves it
    c.train.update(epochs=2.0, batch_size=32, log_every_steps=20)
  return c
