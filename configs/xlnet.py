"""XLNet pretraining configs (Yang et al. 2019): permutation LM on Transformer-XL, `objective="xlnet"`.

  bert-jax pretrain --config configs/xlnet.py:tiny --workdir runs/xlnet-tiny      # laptop, embedded corpus
  bert-jax pretrain --config configs/xlnet.py:large --workdir gs://b/xlnet-large \
      --config.data.corpus='gs://b/text/*.txt' --config.data.vocab=gs://b/spiece.model

The model (bert_jax/models/xlnet.py): relative attention with two streams; `base` 117M and `large` 360M
parameters as released (xlnet-base-cased, xlnet-large-cased: a 32,000-entry cased SentencePiece
vocabulary). The objective (training/objectives/xlnet.py) predicts the last 1/K (xlnet.prediction_k = 6)
of a random factorisation order per row, the targets chosen as spans (n-grams of up to xlnet.max_span =
5 tokens inside xlnet.span_context = 6 x n of context), on the uncorrupted text of the data pipeline's rows.
Recipe (the paper, appendix A.3, XLNet-Large): seq 512, Adam (eps 1e-6), weight decay 0.01, rate 4e-4
with 40k warmup steps and linear decay, batch 8192, 500k steps. `base` is the paper's BERT-comparable
setting: BERT-base's batch 256 and 1M steps (rate 1e-4).
Memory across steps, as the released code (data_utils.py, train_gpu.py): data.example_builder=
"xlnet_stream" (data_pipelines/xlnet_stream.py) lays the text out as batch-many parallel streams, each step's
row i the next chunk of stream i (xlnet.reuse_len = 256 tokens, then A [SEP] B [SEP] [CLS]); each row attends
to the memory of xlnet.mem_len = 384 states per layer of the previous steps' same row, carried (and
checkpointed) in the train state, and through the held-out batches of each evaluation (from zeros, as training
starts); xlnet.bi_data: half the streams read the text backwards. `tiny`: 64 and
96 of 128. xlnet.mem_len=0 trains without memory; data.example_builder=full_sentences (with
xlnet.reuse_len=0, xlnet.bi_data=False) on shuffled rows.
"""
from bert_jax.configs import common
from bert_jax.models.xlnet import XLNetConfig

import ml_collections

# name: (layers, hidden, heads, intermediate)
SIZES = {
    "tiny": (4, 128, 2, 512),
    "base": (12, 768, 12, 3072),
    "large": (24, 1024, 16, 4096),
}
# name: (peak rate, batch, steps, warmup steps, sequence length, reuse length, memory length)
RECIPES = {
    "tiny": (1e-3, 32, 1500, 100, 128, 64, 96),
    "base": (1e-4, 256, 1_000_000, 10_000, 512, 256, 384),
    "large": (4e-4, 8192, 500_000, 40_000, 512, 256, 384),
}
PRESETS = {
    "tiny": "a 4-layer XLNet on the embedded corpus; permutation LM, minutes on a CPU",
    "base": "XLNet-Base (Yang et al. 2019), BERT-base's batch and steps, seq 512",
    "large": "XLNet-Large (Yang et al. 2019): batch 8192, 500k steps, seq 512",
}


def model_config(size: str) -> ml_collections.ConfigDict:
  """The model section: XLNetConfig's fields (and meaning) with `size`'s dimensions."""
  layers, hidden, heads, intermediate = SIZES[size]
  return common.model_config_of(XLNetConfig, num_layers=layers, hidden_size=hidden, num_heads=heads,
                                intermediate_size=intermediate, scan_unroll=layers if layers <= 8 else 1)


def get_config(arg: str = "base"):
  common.check_preset(arg, PRESETS)
  c = common.base_config()
  c.objective = "xlnet"
  c.model = model_config(arg)
  lr, batch, steps, warmup, seq, reuse, mem = RECIPES[arg]
  c.xlnet = ml_collections.ConfigDict({"prediction_k": 6, "max_span": 5, "span_context": 6, "mem_len": mem,
                                       "reuse_len": reuse, "bi_data": True})
  c.data.update(example_builder="xlnet_stream", max_seq_length=seq, max_predictions_per_seq=seq // 6,
                tokenizer="sentencepiece", lower_case=False)
  c.optimizer.update(name="adamw", learning_rate=lr, warmup_steps=warmup, weight_decay=0.01, eps=1e-6)
  c.train.update(batch_size=batch, num_steps=steps)
  if arg == "tiny":
    common.on_embedded_corpus(c)
    c.data.update(tokenizer="wordpiece", lower_case=True)
  return c
