"""RoBERTa pretraining configs (Liu et al. 2019).

  bert-jax vocab --corpus 'text/*.txt' --type sentencepiece --model-type bpe --size 50265 \
      --no-lower-case --output vocab/
  bert-jax pretrain --config configs/roberta.py:base --workdir runs/roberta-base \
      --config.data.corpus='text/*.txt' --config.data.vocab=vocab/spm.model

The model is BERT's encoder with learned positions offset past the padding index as in the released
checkpoints (position_style="roberta", pad_token_id=1, 514 positions), one token type, LayerNorm eps
1e-5, no NSP and no pooler. Data: a cased ~50k BPE vocabulary (SentencePiece BPE when training from
scratch here), FULL-SENTENCES rows (`--config.data.example_builder=doc_sentences` for DOC-SENTENCES),
dynamic masking (the pipeline draws a fresh mask every time it builds a row).
Recipe (paper Table 9): Adam b2 0.98, eps 1e-6, weight decay 0.01, peak lr 6e-4 (base) / 4e-4 (large),
warmup 24k / 30k steps then linear decay, 500k steps of 8k sequences of 512 tokens.
`tiny` is a 2-layer model for the embedded corpus; it needs a SentencePiece vocabulary too:
  bert-jax vocab --corpus "$(python -c 'from bert_jax.data_pipelines import embedded; print(embedded.ensure_embedded()[0])')" \
      --type sentencepiece --model-type bpe --size 4000 --no-lower-case --output vocab/
"""
from bert_jax.configs import common

# name: (layers, hidden, heads, intermediate)
SIZES = {
    "tiny": (2, 128, 2, 512),
    "base": (12, 768, 12, 3072),
    "large": (24, 1024, 16, 4096),
}

PRESETS = {
    "tiny": "2 layers on the embedded corpus (needs a SentencePiece vocabulary first: see above)",
    "base": "RoBERTa-base (Liu et al. 2019): 8k batch of 512 tokens, 500k steps",
    "large": "RoBERTa-large (Liu et al. 2019): 8k batch of 512 tokens, 500k steps",
}

# name: (learning rate, batch, steps, warmup)
RECIPES = {
    "tiny": (1e-3, 32, 1500, 100),
    "base": (6e-4, 8192, 500_000, 24_000),
    "large": (4e-4, 8192, 500_000, 30_000),
}


def get_config(arg: str = "base"):
  common.check_preset(arg, PRESETS)
  c = common.sized_config(SIZES, arg)
  c.model.update(vocab_size=50265, position_style="roberta", pad_token_id=1, max_position_embeddings=514,
                 type_vocab_size=1, layer_norm_eps=1e-5, use_pooler=False, sentence_head="none")
  c.data.update(tokenizer="sentencepiece", lower_case=False, example_builder="full_sentences",
                max_seq_length=512, max_predictions_per_seq=80)
  lr, batch, steps, warmup = RECIPES[arg]
  c.optimizer.update(name="adamw", learning_rate=lr, warmup_steps=warmup, b2=0.98, eps=1e-6,
                     weight_decay=0.01)
  c.train.update(batch_size=batch, num_steps=steps)
  if arg == "tiny":
    common.on_embedded_corpus(c)
    c.data.update(max_seq_length=128, max_predictions_per_seq=0)  # 0: 20, the rate's
  return c
