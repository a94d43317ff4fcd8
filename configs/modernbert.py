"""ModernBERT pretraining configs (Warner et al. 2024), in two chained phases.

  bert-jax pretrain --config configs/modernbert.py:tiny --workdir runs/mb-tiny     # laptop, embedded corpus
  bert-jax pretrain --config configs/modernbert.py:base --workdir gs://b/mb-base \
      --config.data.corpus='gs://b/text/*.txt' --config.data.vocab=gs://b/spm.model
  bert-jax pretrain --config configs/modernbert.py:base_long --workdir gs://b/mb-base-long \
      --config.init_from=gs://b/mb-base --config.data.corpus=... --config.data.vocab=...

The model (bert_jax/models/modernbert.py): RoPE, GeGLU, pre-LN, no biases, global attention every third
layer and a 128-token window elsewhere; `base` 149M and `large` 395M parameters as released. Data:
whole documents packed into rows (attention never crosses a document; positions restart in each),
30% masking, no NSP. Bring a ~50k vocabulary (the released models use a BPE of 50,368 entries; here a
SentencePiece model); `tiny` trains on the embedded corpus and its WordPiece vocabulary.

Recipe (the paper, section 2.2):
  phase 1 (`base`, `large`): length 1024, global and local RoPE theta 10k; StableAdamW (betas 0.9/0.98,
    eps 1e-6), peak rate 8e-4 (large 5e-4) after a linear warmup, then held (the warmup-stable-decay
    schedule's stable phase); the batch grows from 768 to 4,608 rows (large: 448 to 4,928) over the
    first ~50B tokens (train.batch_warmup_steps); 1.7T tokens.
  phase 2 (`base_long`, `large_long`): context extension, init_from the phase-1 run: length 8192, global
    RoPE theta 160k, rate 3e-4, 300B tokens of which the last 50B decay as 1 - sqrt. A decay can start
    from any checkpoint of the stable part: resume it with --config.optimizer.decay_start=<its step>.
ModernBERT decays weights by 1e-5 per step independently of the rate; here decay is scaled by the
schedule (as optax does), so weight_decay = 1e-5 / peak rate gives that at the peak.

Attention runs on TPU's splash kernel (model.attention): at 8192 tokens dense attention does not fit,
splash's memory grows linearly with the length (BENCHMARKS.md, "ModernBERT on TPU"). Check a slice with

  bert-jax compile --config configs/modernbert.py:base_long --topology v4-8
"""
from bert_jax.configs import common
from bert_jax.models.modernbert import ModernBertConfig

# name: (layers, hidden, heads, intermediate, global_every, local_window)
SIZES = {
    "tiny": (4, 128, 2, 256, 2, 32),
    "base": (22, 768, 12, 1152, 3, 128),
    "large": (28, 1024, 16, 2624, 3, 128),
}

# name: (peak rate, batch, batch warmup start (a fraction of the batch), batch warmup steps, warmup steps, steps)
# Phase 1 at 1024 tokens: ~50B tokens of batch warmup, then 4.7M (large 5.0M) tokens per step to 1.7T.
RECIPES = {
    "tiny": (1e-3, 32, 0.25, 100, 100, 1500),
    "base": (8e-4, 4608, 768 / 4608, 18_000, 2_000, 368_000),
    "large": (5e-4, 4928, 448 / 4928, 18_000, 2_000, 345_000),
}
# Phase 2 at 8192 tokens: (rate, batch, steps, decay steps, warmup steps); 72 rows of 8192 tokens = 590k tokens
# per step, the last 50B tokens decaying.
LONG = {"tiny": (3e-4, 16, 300, 100, 10), "base": (3e-4, 72, 508_000, 85_000, 500),
        "large": (3e-4, 72, 508_000, 85_000, 500)}
# What each preset is for (`bert-jax presets` lists them with their sizes).
PRESETS = {
    "tiny": "a 4-layer ModernBERT on the embedded corpus, 1,500 steps with StableAdamW and batch-size warmup",
    "base": "ModernBERT-base (Warner et al. 2024), phase 1 at 1024 tokens: an accelerator's run (splash attention)",
    "large": "ModernBERT-large, phase 1 at 1024 tokens",
    "tiny_long": "tiny's context extension to 256 tokens, init_from a tiny run, 1 - sqrt decay",
    "base_long": "ModernBERT-base's phase 2: context extension to 8192 tokens, init_from phase 1, 1 - sqrt decay",
    "large_long": "ModernBERT-large's phase 2 at 8192 tokens",
}


def model_config(size: str):
  """The model section: ModernBertConfig's fields (and meaning) with `size`'s dimensions."""
  layers, hidden, heads, intermediate, every, window = SIZES[size]
  c = common.model_config_of(ModernBertConfig)
  c.update(num_layers=layers, hidden_size=hidden, num_heads=heads, intermediate_size=intermediate,
           global_every=every, local_window=window, global_rope_theta=10_000.0, pad_token_id=0,
           scan_unroll=layers if layers <= 8 else 1)
  return c


def get_config(arg: str = "base"):
  common.check_preset(arg, PRESETS)
  size, long = arg.removesuffix("_long"), arg.endswith("_long")
  c = common.base_config()
  c.model = model_config(size)
  c.data.update(example_builder="full_sentences", packing=True, mask_rate=0.3, max_seq_length=1024,
                tokenizer="sentencepiece", lower_case=False)  # 308 masked positions: 0, the rate's
  lr, batch, warm_start, warm_batch_steps, warmup, steps = RECIPES[size]
  c.optimizer.update(name="stable_adamw", learning_rate=lr, warmup_steps=warmup, decay="constant", b1=0.9,
                     b2=0.98, eps=1e-6, weight_decay=1e-5 / lr, clip_norm=0.0)
  c.train.update(batch_size=batch, num_steps=steps, batch_warmup_start=warm_start,
                 batch_warmup_steps=warm_batch_steps)
  if size == "tiny":
    common.on_embedded_corpus(c)
    c.data.update(tokenizer="wordpiece", lower_case=True, max_seq_length=128)
  else:
    c.model.update(dtype="bfloat16", attention="splash")
  if long:
    _context_extension(c, size)
  return c


def _context_extension(c, size: str) -> None:
  """Phase 2: 8192 tokens (tiny: 256), global theta 160k, a short warmup (the optimizer's moments start
  afresh), the stable rate, then 1 - sqrt decay."""
  lr, batch, steps, decay_steps, warmup = LONG[size]
  length = 256 if size == "tiny" else 8192
  c.model.global_rope_theta = 160_000.0
  c.data.update(max_seq_length=length)  # data.max_predictions_per_seq: 0, the rate's (2458)
  c.optimizer.update(learning_rate=lr, warmup_steps=warmup, decay="1-sqrt", decay_steps=decay_steps, decay_start=-1,
                     weight_decay=1e-5 / lr)
  c.train.update(batch_size=batch, num_steps=steps, batch_warmup_steps=0, batch_warmup_start=1.0)
  c.init_from = f"runs/modernbert-{size}"  # the phase-1 run; override with --config.init_from
