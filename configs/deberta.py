"""DeBERTa-v3 pretraining configs (He et al. 2023, "DeBERTaV3"): `objective="deberta_rtd"`.

  bert-jax pretrain --config configs/deberta.py:tiny --workdir runs/deberta-tiny     # laptop, embedded corpus
  bert-jax pretrain --config configs/deberta.py:base --workdir gs://b/deberta-base \
      --config.data.corpus='gs://b/text/*.txt' --config.data.vocab=gs://b/spm.model

The model (bert_jax/models/deberta.py) is the discriminator: disentangled attention over 256 log buckets of
relative positions (up to 512), shared attention keys, LayerNorm'd relative embeddings, no absolute positions, a
128k SentencePiece vocabulary (spm.model, tokenizer kind deberta_spm; model.vocab_size 128100 as released).
Published sizes: xsmall 22M backbone + 48M embeddings, small 44M + 98M, base 86M + 98M, large 304M + 131M
(`bert-jax presets` counts them; tests/test_deberta.py holds them within 4%).

Pretraining (training/objectives/deberta_rtd.py): ELECTRA-style replaced-token detection with gradient-disentangled
embedding sharing. The generator has the discriminator's width and half its depth (`rtd.generator_layer_fraction` =
0.5, the paper's section 5); loss = generator MLM + `rtd.disc_weight` x RTD with lambda = 50 (as ELECTRA's); the
generator's MLM head runs the enhanced mask decoder (`model.emd_steps` = 2: the last layer applied twice over its
input plus absolute positions, models/deberta.py); the discriminator's token table is stop_gradient(E_generator) +
E_delta, E_delta from zeros. Recipe (the paper's appendix, pre-training hyper-parameters): batch 8k rows of 512
tokens, 500k steps, warmup 10k, linear decay, AdamW (betas 0.9/0.98, eps 1e-6, weight decay 0.01), clipping 1.0,
dropout 0.1, peak rate 3e-4 (large) and 6e-4 (base, small; xsmall's is not in the table: base's here). 15% of the
tokens masked.
`tiny` (4 layers, the embedded corpus and its WordPiece vocabulary) pretrains offline in minutes.
"""
import ml_collections

from bert_jax.configs import common
from bert_jax.models.deberta import DebertaConfig

# name: (layers, hidden, heads, intermediate, position buckets)
SIZES = {
    "tiny": (4, 128, 2, 512, 32),
    "xsmall": (12, 384, 6, 1536, 256),
    "small": (6, 768, 12, 3072, 256),
    "base": (12, 768, 12, 3072, 256),
    "large": (24, 1024, 16, 4096, 256),
}
# name: (peak rate, batch, steps, warmup, sequence length)
RECIPES = {
    "tiny": (1e-3, 32, 1500, 100, 128),
    "xsmall": (6e-4, 8192, 500_000, 10_000, 512),
    "small": (6e-4, 8192, 500_000, 10_000, 512),
    "base": (6e-4, 8192, 500_000, 10_000, 512),
    "large": (3e-4, 8192, 500_000, 10_000, 512),
}
# The paper's RTD settings: lambda (the RTD loss's weight) and the generator's depth as a fraction of the
# discriminator's (same width).
RTD_WEIGHT = 50.0
GENERATOR_LAYER_FRACTION = 0.5
# The enhanced mask decoder's passes (the paper's section 3.2, Microsoft's z_steps 2): the generator's MLM head
# decodes through it; the discriminator (no MLM head) and Hugging Face's classes have none.
EMD_STEPS = 2
PRESETS = {
    "tiny": "a 4-layer DeBERTa-v3 (2-layer generator) on the embedded corpus; minutes on a CPU",
    "xsmall": "DeBERTa-v3-xsmall (22M backbone + 48M embeddings): RTD with GDES, batch 8k, 500k steps, seq 512",
    "small": "DeBERTa-v3-small (44M backbone + 98M embeddings), 6 layers",
    "base": "DeBERTa-v3-base (86M backbone + 98M embeddings)",
    "large": "DeBERTa-v3-large (304M backbone + 131M embeddings), peak rate 3e-4",
}


def model_config(size: str) -> ml_collections.ConfigDict:
  """The model section: DebertaConfig's fields (and meaning) with `size`'s dimensions."""
  layers, hidden, heads, intermediate, buckets = SIZES[size]
  return common.model_config_of(DebertaConfig, num_layers=layers, hidden_size=hidden, num_heads=heads,
                                intermediate_size=intermediate, position_buckets=buckets, mlm_head=False,
                                rtd_head=True, emd_steps=EMD_STEPS)


def get_config(arg: str = "base"):
  common.check_preset(arg, PRESETS)
  c = common.base_config()
  c.objective = "deberta_rtd"
  c.model = model_config(arg)
  c.rtd = ml_collections.ConfigDict({"generator_layer_fraction": GENERATOR_LAYER_FRACTION,
                                     "disc_weight": RTD_WEIGHT})
  lr, batch, steps, warmup, seq = RECIPES[arg]
  c.data.update(example_builder="full_sentences", max_seq_length=seq, mask_rate=0.15,
                max_predictions_per_seq=int((0.15 + 0.005) * seq), tokenizer="deberta_spm", lower_case=False)
  c.optimizer.update(name="adamw", learning_rate=lr, warmup_steps=warmup, weight_decay=0.01, b1=0.9, b2=0.98,
                     eps=1e-6, clip_norm=1.0)
  c.train.update(batch_size=batch, num_steps=steps)
  if arg == "tiny":
    common.on_embedded_corpus(c)
    c.data.update(tokenizer="wordpiece", lower_case=True)
  return c
