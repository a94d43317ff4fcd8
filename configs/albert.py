"""ALBERT pretraining configs (Lan et al. 2020).

  bert-jax vocab --corpus 'text/*.txt' --type sentencepiece --size 30000 --output vocab/
  bert-jax pretrain --config configs/albert.py:base --workdir runs/albert-base \
      --config.data.corpus='text/*.txt' --config.data.vocab=vocab/spm.model

ALBERT is BERT's encoder with factorised embeddings (E=128 projected to H), all layers sharing one set
of weights (`--config.model.share_layers=attention|ffn|none` for the paper's ablations; attention/ffn
need `--config.model.scan_layers=False`), gelu_tanh, no dropout, and sentence-order prediction on the
pooled output. Data: a 30k SentencePiece vocabulary, SOP rows, n-gram masking (n <= 3, p ~ 1/n).
Recipe (paper section 4.1): LAMB, lr 0.00176, batch 4096, 125k steps, 3,125 warmup steps, sequences of
512 tokens, 20 predictions.
`tiny` (E=64, H=128, 2 layers) runs on the embedded corpus with its WordPiece vocabulary.
"""
from bert_jax.configs import common

# name: (layers, hidden, heads, intermediate)
SIZES = {
    "tiny": (2, 128, 2, 512),
    "base": (12, 768, 12, 3072),
    "large": (24, 1024, 16, 4096),
    "xlarge": (24, 2048, 16, 8192),
    "xxlarge": (12, 4096, 64, 16384),
}

PRESETS = {
    "tiny": "2 layers (E=64) on the embedded corpus and its WordPiece vocabulary; minutes on a CPU",
    "base": "ALBERT-base (Lan et al. 2020): shared layers, E=128, LAMB, batch 4096, 125k steps",
    "large": "ALBERT-large (Lan et al. 2020), the same recipe",
    "xlarge": "ALBERT-xlarge (Lan et al. 2020), the same recipe",
    "xxlarge": "ALBERT-xxlarge (Lan et al. 2020): 12 wide layers, the same recipe",
}


def get_config(arg: str = "base"):
  common.check_preset(arg, PRESETS)
  c = common.sized_config(SIZES, arg)
  c.model.update(vocab_size=30000, embedding_size=128, share_layers="all", hidden_act="gelu_tanh",
                 hidden_dropout=0.0, attention_dropout=0.0, sentence_head="sop")
  c.data.update(tokenizer="sentencepiece", example_builder="sop", masking="ngram", max_seq_length=512,
                max_predictions_per_seq=20)
  c.optimizer.update(name="lamb", learning_rate=0.00176, warmup_steps=3125, weight_decay=0.01)
  c.train.update(batch_size=4096, num_steps=125_000)
  if arg == "tiny":
    common.on_embedded_corpus(c).model.embedding_size = 64
    c.data.update(tokenizer="wordpiece", max_seq_length=128)
    c.optimizer.update(learning_rate=2e-3, warmup_steps=100)
    c.train.update(batch_size=32, num_steps=1500)
  return c
