"""T5 v1.1 pretraining configs (Raffel et al. 2020; the v1.1 checkpoints): span corruption with Adafactor.

  bert-jax pretrain --config configs/t5.py:tiny --workdir runs/t5-tiny       # laptop CPU, embedded corpus
  bert-jax pretrain --config configs/t5.py:base --workdir gs://b/t5-base \
      --config.data.corpus='gs://b/text/*.txt' --config.data.vocab=gs://b/spiece.model
  bert-jax compile --config configs/t5.py:base --topology v4-8                # fit and step estimate

The model (bert_jax/models/t5.py): v1.1's gated-GELU feed-forward, no dropout in pretraining, its own LM head.
The data (data_pipelines/span_corruption.py, streamed by span_stream.py): T5's span corruption, noise density 0.15
and mean span length 3, inputs of 512 tokens (568 raw tokens, targets of 114), packed, re-drawn every epoch.
The optimizer: Adafactor (optax) at 0.01 for 10,000 steps, then T5's inverse square root; 2^19 steps of 128 rows
of 512 tokens (the paper's 2^35 tokens are the unpacked count). The vocabulary is T5's SentencePiece model
(32,000 pieces and 100 sentinels, padded to 32,128); `tiny` learns a 4,000-piece one from the embedded corpus.
"""
from bert_jax.configs import common
from bert_jax.models.t5 import T5Config

# name: (layers, d_model, heads, d_kv, d_ff); published sizes (T5 v1.1): small 77M, base 248M, large 783M.
SIZES = {
    "tiny": (2, 128, 4, 32, 256),
    "small": (8, 512, 6, 64, 1024),
    "base": (12, 768, 12, 64, 2048),
    "large": (24, 1024, 16, 64, 2816),
}
PRESETS = {
    "tiny": "a 2+2-layer T5 v1.1 on the embedded corpus: span corruption, Adafactor, a few minutes on a CPU",
    "small": "T5 v1.1 small (77M parameters): span corruption on 512-token inputs",
    "base": "T5 v1.1 base (248M)",
    "large": "T5 v1.1 large (783M)",
}


def model_config(size: str):
  """The model section: T5Config's fields (and meaning) with `size`'s dimensions."""
  layers, hidden, heads, head_dim, ff = SIZES[size]
  c = common.model_config_of(T5Config)
  c.update(num_layers=layers, hidden_size=hidden, num_heads=heads, head_dim=head_dim, intermediate_size=ff,
           feed_forward="gated-gelu", tie_word_embeddings=False, dropout=0.0, vocab_size=32128,
           scan_unroll=layers if layers <= 8 else 1)
  return c


def get_config(arg: str = "base"):
  common.check_preset(arg, PRESETS)
  c = common.base_config()
  c.objective = "span_corruption"
  c.model = model_config(arg)
  c.data.update(example_builder="span_corruption", tokenizer="t5_spm", lower_case=False, max_seq_length=512,
                packing=True)  # data.mask_rate is unused: noise_density is the corrupted share
  c.data.noise_density = 0.15
  c.data.mean_noise_span_length = 3.0
  c.optimizer.update(name="adafactor", learning_rate=0.01, warmup_steps=10_000, decay="rsqrt", weight_decay=0.0,
                     clip_norm=0.0)
  c.train.update(batch_size=128, num_steps=2 ** 19)
  if arg == "tiny":
    common.on_embedded_corpus(c)
    c.model.vocab_size = 4224  # the embedded 4,000-piece model's ids and 100 sentinels, padded to 128
    c.data.max_seq_length = 64
    c.train.update(batch_size=32, num_steps=1_000, log_every_steps=50, eval_every_steps=250, eval_steps=2)
  else:
    c.model.dtype = "bfloat16"
    # One thread builds ~600 rows/s of 512 inputs, 63-71% of what a T5-base step on a v4-8 host takes
    # (BENCHMARKS.md): span corruption runs in worker processes, one per core.
    c.data.num_workers = -1
  return c
