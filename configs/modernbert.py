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

Ettin (Weller et al. 2025, `ettin_17m` ... `ettin_1b`): ModernBERT's architecture and phase 1 at six sizes with
its BPE of 50,368 (a tokenizer.json: data.tokenizer=tokenizer_json), 1.7T tokens at 1024, 30% masking; the
peak rate 3e-3 up to 68m, 8e-4 at 150m, 5e-4 at 400m and 1b (betas 0.9/0.98). mmBERT (Marone et al. 2025,
`mmbert_small`, `mmbert_base`): the same architecture with Gemma 2's tokenizer (256,000 entries), betas
0.9/0.95, eps 1e-8, its masking rate falling as the paper's schedule does (MASK_SCHEDULE: 30% -> 15% -> 5%):
pretraining (2.3T tokens at 1024, RoPE theta 10k, 30%), then `_mid`, init_from it: one run at 8192 tokens (theta
160k local and global) of mid-training (600B tokens, 15%) and the decay (100B tokens, 5%, 1 - sqrt to 2% of the
rate), the rate changing at the decay's first step in the running input (data.mask_rate_schedule). The first
boundary stays between two runs: the rows grow from 1024 to 8192 tokens and RoPE's theta changes there.
Shapes from the released training configs (JHU-CLSP's ettin-encoder-vs-decoder and
mmBERT repositories); `bert-jax presets` shows the counts (tests/test_modernbert.py: within 4% of the published
17M ... 1B, 140M and 307M).

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
    "ettin_17m": (7, 256, 4, 384, 3, 128),
    "ettin_32m": (10, 384, 6, 576, 3, 128),
    "ettin_68m": (19, 512, 8, 768, 3, 128),
    "ettin_150m": (22, 768, 12, 1152, 3, 128),
    "ettin_400m": (28, 1024, 16, 2624, 3, 128),
    "ettin_1b": (28, 1792, 28, 3840, 3, 128),
    "mmbert_small": (22, 384, 6, 1152, 3, 128),
    "mmbert_base": (22, 768, 12, 1152, 3, 128),
}
VOCAB = {"mmbert_small": 256_000, "mmbert_base": 256_000}  # the others: ModernBertConfig's 50,368
# mmBERT's masking rate by phase (the paper's annealed schedule): pretraining's, then mid-training's and the decay's
# in one run (data.mask_rate, then data.mask_rate_schedule from the decay's first step)
MASK_SCHEDULE = {"": 0.3, "mid": 0.15, "decay": 0.05}

# name: (peak rate, batch, batch warmup start (a fraction of the batch), batch warmup steps, warmup steps, steps)
# Phase 1 at 1024 tokens: ~50B tokens of batch warmup, then 4.7M (large 5.0M) tokens per step to 1.7T.
RECIPES = {
    "tiny": (1e-3, 32, 0.25, 100, 100, 1500),
    "base": (8e-4, 4608, 768 / 4608, 18_000, 2_000, 368_000),
    "large": (5e-4, 4928, 448 / 4928, 18_000, 2_000, 345_000),
    # Ettin's: 4,608 rows of 1024 tokens (4.7M) for 1.7T tokens, the batch grown from the per-device batch
    "ettin_17m": (3e-3, 4608, 144 / 4608, 51_376, 848, 360_277),
    "ettin_32m": (3e-3, 4608, 128 / 4608, 41_240, 848, 360_277),
    "ettin_68m": (3e-3, 4608, 96 / 4608, 31_140, 636, 360_277),
    "ettin_150m": (8e-4, 4608, 72 / 4608, 20_867, 636, 360_277),
    "ettin_400m": (5e-4, 4608, 48 / 4608, 4_195, 424, 360_277),
    "ettin_1b": (5e-4, 4608, 24 / 4608, 1_265, 424, 360_277),
    # mmBERT's pretraining: 2.3T tokens
    "mmbert_small": (8e-4, 4608, 48 / 4608, 41_949, 848, 487_434),
    "mmbert_base": (8e-4, 4608, 48 / 4608, 25_169, 636, 487_434),
}
# weight decay per step at the peak rate (ModernBERT's 1e-5 where not listed)
WEIGHT_DECAY = {"ettin_17m": 3e-4, "ettin_32m": 3e-4, "ettin_68m": 3e-4, "ettin_1b": 5e-5, "mmbert_small": 8e-5,
                "mmbert_base": 8e-5}
# mmBERT's later phases at 8192 tokens, 4,608 rows, one run (`_mid`): 600B tokens held, then 100B decaying
MMBERT_PHASES = {"mid": 15_895, "decay": 2_649}
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
    **{f"ettin_{n}": f"Ettin's {n} encoder (Weller et al. 2025): ModernBERT's phase 1, 1.7T tokens at 1024"
       for n in ("17m", "32m", "68m", "150m", "400m", "1b")},
    **{f"mmbert_{n}": f"mmBERT-{n} (Marone et al. 2025) pretraining: 256k vocabulary, 30% masking at 1024 tokens"
       for n in ("small", "base")},
    **{f"mmbert_{n}_mid": f"mmBERT-{n}'s mid-training and decay in one run: 8192 tokens, 15% then 5% masking, "
       f"1 - sqrt decay, init_from mmbert_{n}" for n in ("small", "base")},
}


def model_config(size: str):
  """The model section: ModernBertConfig's fields (and meaning) with `size`'s dimensions."""
  layers, hidden, heads, intermediate, every, window = SIZES[size]
  c = common.model_config_of(ModernBertConfig)
  c.update(num_layers=layers, hidden_size=hidden, num_heads=heads, intermediate_size=intermediate,
           global_every=every, local_window=window, global_rope_theta=10_000.0, pad_token_id=0,
           scan_unroll=layers if layers <= 8 else 1, vocab_size=VOCAB.get(size, ModernBertConfig.vocab_size))
  return c


def get_config(arg: str = "base"):
  common.check_preset(arg, PRESETS)
  phase = "mid" if arg.endswith("_mid") else ""
  size, long = arg.removesuffix("_long").removesuffix(f"_{phase}"), arg.endswith("_long")
  c = common.base_config()
  c.model = model_config(size)
  c.data.update(example_builder="full_sentences", packing=True, mask_rate=0.3, max_seq_length=1024,
                tokenizer="sentencepiece", lower_case=False)  # 308 masked positions: 0, the rate's
  lr, batch, warm_start, warm_batch_steps, warmup, steps = RECIPES[size]
  c.optimizer.update(name="stable_adamw", learning_rate=lr, warmup_steps=warmup, decay="constant", b1=0.9,
                     b2=0.98, eps=1e-6, weight_decay=WEIGHT_DECAY.get(size, 1e-5) / lr, clip_norm=0.0)
  c.train.update(batch_size=batch, num_steps=steps, batch_warmup_start=warm_start,
                 batch_warmup_steps=warm_batch_steps)
  if size.startswith(("ettin", "mmbert")):  # a released tokenizer.json: --config.data.vocab=.../tokenizer.json
    c.data.tokenizer = "tokenizer_json"
  if size.startswith("mmbert"):
    c.optimizer.update(b2=0.95, eps=1e-8)
    _mmbert_phase(c, size, phase)
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


def _mmbert_phase(c, size: str, phase: str) -> None:
  """mmBERT's phases (MASK_SCHEDULE): pretraining's 30%; `mid`: mid-training and the decay as one run at 8192 tokens
  with RoPE theta 160k (local and global), no warmup, init_from pretraining, 15% masking then 5% from the decay's
  first step (data.mask_rate_schedule), the rate falling as 1 - sqrt to 2% over the decay's steps."""
  c.data.mask_rate = MASK_SCHEDULE[phase]
  if not phase:
    return
  mid, decay = MMBERT_PHASES["mid"], MMBERT_PHASES["decay"]
  c.data.mask_rate_schedule = ((mid, MASK_SCHEDULE["decay"]),)
  c.model.update(global_rope_theta=160_000.0, local_rope_theta=160_000.0)
  c.data.max_seq_length = 8192
  c.optimizer.update(warmup_steps=0, decay="1-sqrt", decay_steps=decay, decay_start=-1,
                     end_learning_rate=0.02 * c.optimizer.learning_rate)
  c.train.update(num_steps=mid + decay, batch_warmup_steps=0, batch_warmup_start=1.0)
  c.init_from = f"runs/{size}"  # override with --config.init_from
