"""ELECTRA pretraining configs (Clark et al. 2020): `objective="electra"`.

  bert-jax pretrain --config configs/electra.py:small --workdir runs/electra-small \
      --config.data.corpus='text/*.txt' --config.data.vocab=vocab.txt

The `model` section describes the discriminator (no pooler, no sentence head: the objective adds the
replaced-token head). The generator is derived from it as in the paper's code: hidden size x
`electra.generator_hidden_fraction` (1/4 small, 1/3 base, 1/4 large), 64-wide heads, FFN 4H, same depth
and embedding width; the two share token and position embeddings. Loss = generator MLM +
`electra.disc_weight` (50) x discriminator loss over every real token.
Recipe (paper Table 6/7): Adam, weight decay 0.01, warmup 10k; small: lr 5e-4, batch 128, 1M steps,
seq 128, E=128; base: lr 2e-4, batch 256, 766k steps, seq 512; large: lr 2e-4, batch 2048, 400k steps,
seq 512, mask rate 0.25. Predictions per row as the paper's code: (mask rate + 0.005) x length.
`tiny` runs on the embedded corpus.
"""
import ml_collections

from bert_jax.configs import common

# name: (layers, hidden, heads, intermediate, embedding size, generator hidden fraction)
SIZES = {
    "tiny": (2, 128, 2, 512, 64, 1 / 4),
    "small": (12, 256, 4, 1024, 128, 1 / 4),
    "base": (12, 768, 12, 3072, 768, 1 / 3),
    "large": (24, 1024, 16, 4096, 1024, 1 / 4),
}

PRESETS = {
    "tiny": "2 layers on the embedded corpus; minutes on a CPU",
    "small": "ELECTRA-Small (Clark et al. 2020): batch 128, 1M steps, seq 128",
    "base": "ELECTRA-Base (Clark et al. 2020): batch 256, 766k steps, seq 512",
    "large": "ELECTRA-Large (Clark et al. 2020): batch 2048, 400k steps, seq 512, 25% masked",
}

# name: (learning rate, batch, steps, warmup, sequence length, mask rate)
RECIPES = {
    "tiny": (1e-3, 32, 1500, 100, 128, 0.15),
    "small": (5e-4, 128, 1_000_000, 10_000, 128, 0.15),
    "base": (2e-4, 256, 766_000, 10_000, 512, 0.15),
    "large": (2e-4, 2048, 400_000, 10_000, 512, 0.25),
}


def get_config(arg: str = "base"):
  common.check_preset(arg, PRESETS)
  c = common.sized_config(SIZES, arg)
  embedding, gen_fraction = SIZES[arg][4:]
  lr, batch, steps, warmup, seq, mask_rate = RECIPES[arg]
  c.objective = "electra"
  c.model.update(embedding_size=embedding, use_pooler=False, mlm_head=False, sentence_head="none",
                 rtd_head=True)
  c.electra = ml_collections.ConfigDict({"generator_hidden_fraction": gen_fraction,
                                         "generator_layer_fraction": 1.0, "disc_weight": 50.0})
  c.data.update(example_builder="full_sentences", max_seq_length=seq, mask_rate=mask_rate,
                max_predictions_per_seq=int((mask_rate + 0.005) * seq))
  c.optimizer.update(name="adamw", learning_rate=lr, warmup_steps=warmup, weight_decay=0.01)
  c.train.update(batch_size=batch, num_steps=steps)
  if arg == "tiny":
    common.on_embedded_corpus(c)
  return c
