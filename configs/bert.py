"""BERT pretraining configs (Devlin et al. 2019; miniatures from Turc et al. 2019; LAMB from You et al. 2020).

  bert-jax pretrain --config configs/bert.py:demo --workdir runs/demo       # laptop, embedded corpus
  bert-jax pretrain --config configs/bert.py:base --workdir gs://b/base \
      --config.data.corpus='gs://b/wiki/*.txt' --config.data.vocab=gs://b/vocab.txt

`tiny`..`base` carry the BERT paper's recipe (Adam, lr 1e-4, batch 256, 1M steps, 10k warmup, seq 128,
20 predictions); the miniatures (Turc et al.) were trained with the same recipe. `large` carries the
LAMB paper's 32k-batch recipe (lr 5/(2^0.5 * 10^3), 15,625 steps, warmup 2,000 steps ~ 12.8%).
`demo` is the `tiny` model with a schedule sized for the embedded corpus on two CPU cores.

`large` fits as shipped on a v4-32 slice (16 chips), the smallest v4 slice in BENCHMARKS.md's table:
bf16 compute, no remat, 32 micro-batches of 64 rows per chip, evaluation in batches of 1,024; check with

  bert-jax compile --config configs/bert.py:large --topology v4-32

`large` drops attention dropout and sets `model.attention=auto`: splash's kernel on TPU from 512 tokens
(multiples of 128), dot elsewhere (its 128-token phase too). Its mesh is ZeRO-3 over every chip (`mesh.data=1`,
`mesh.fsdp=-1`): each chip keeps and updates 1/n of the parameters and LAMB's moments. Its 512-token phase (MLPerf's
phase 2) on a v4-128, ~201 samples/s/chip estimated (BENCHMARKS.md):

  bert-jax compile --config configs/bert.py:large --topology v4-128 --config.data.max_seq_length=512 \
      --config.data.max_predictions_per_seq=76 --config.train.batch_size=512 --config.train.grad_accum_steps=1 \
      --config.train.eval_batch_size=512 --config.data.num_shards=16
"""
from bert_jax.configs import common

# name: (layers, hidden, heads, intermediate)
SIZES = {
    "tiny": (2, 128, 2, 512),
    "mini": (4, 256, 4, 1024),
    "small": (4, 512, 8, 2048),
    "medium": (8, 512, 8, 2048),
    "base": (12, 768, 12, 3072),
    "large": (24, 1024, 16, 4096),
}

# What each preset is for (`bert-jax presets` lists them with their sizes).
PRESETS = {
    "tiny": "BERT-Tiny (Turc et al. 2019) with BERT's recipe",
    "mini": "BERT-Mini (Turc et al. 2019) with BERT's recipe; a laptop's pretraining benchmark",
    "small": "BERT-Small (Turc et al. 2019) with BERT's recipe",
    "medium": "BERT-Medium (Turc et al. 2019) with BERT's recipe",
    "base": "BERT-base (Devlin et al. 2019): batch 256, 1M steps; an accelerator's run",
    "large": "BERT-large, LAMB's 32k batch (You et al. 2020); fits a v4-32 as shipped",
    "demo": "tiny on the embedded corpus, 1,200 steps: the README's first run, minutes on a CPU",
}

# name: (optimizer, learning rate, batch, steps, warmup)
RECIPES = {
    "bert": ("adamw", 1e-4, 256, 1_000_000, 10_000),
    "lamb32k": ("lamb", 5 / (2 ** 0.5 * 1e3), 32_768, 15_625, 2_000),
    "demo": ("adamw", 1e-3, 32, 1200, 100),
}


def get_config(arg: str = "base"):
  common.check_preset(arg, PRESETS)
  size = "tiny" if arg == "demo" else arg
  c = common.sized_config(SIZES, size)
  recipe = "demo" if arg == "demo" else ("lamb32k" if size == "large" else "bert")
  opt, lr, batch, steps, warmup = RECIPES[recipe]
  c.optimizer.update(name=opt, learning_rate=lr, warmup_steps=warmup)
  c.train.update(batch_size=batch, num_steps=steps)
  if size == "large":  # the 32k batch on v4-32 (see the docstring; BENCHMARKS.md for other slices)
    # No dropout on the attention probabilities (MosaicBERT's and ModernBERT's choice), so on TPU at 512
    # tokens attention runs in splash's kernel with no T x T array in HBM (docs/guides/speed.md);
    # --config.model.attention_dropout=0.1 is BERT's own recipe, with dot's attention.
    c.model.update(dtype="bfloat16", attention="auto", attention_dropout=0.0)
    c.train.update(grad_accum_steps=32, eval_batch_size=1024)
    # ZeRO-3 over every chip: each chip keeps and updates 1/n of the parameters and LAMB's moments instead of
    # all 335M (the replicated update was ~9 GB of HBM traffic per chip per step at 512 tokens, BENCHMARKS.md);
    # the layers' weights are gathered as each layer needs them. Any slice size, and one CPU device.
    c.mesh.update(data=1, fsdp=-1)
  if arg == "demo":
    c.model.vocab_size = 8192  # the embedded vocabulary has fewer entries
    # The embedded corpus's documents are short: 64 tokens hold most segment pairs.
    c.data.update(max_seq_length=64)  # 10 masked positions: data.max_predictions_per_seq=0
    c.train.update(log_every_steps=50, eval_every_steps=500, eval_steps=4)
    c.checkpoint.every_steps = 500
  return c
