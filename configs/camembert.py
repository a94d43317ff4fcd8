"""CamemBERT pretraining configs (Martin et al. 2020): RoBERTa for a new language, with a SentencePiece
unigram vocabulary in fairseq's layout and whole-word masking.

  bert-jax vocab --type camembert_spm --size 32000 --corpus 'text_fr/*.txt' --output vocab_fr/
  bert-jax pretrain --config configs/camembert.py:base --workdir runs/camembert \
      --config.data.corpus='text_fr/*.txt' --config.data.vocab=vocab_fr/sentencepiece.bpe.model
  bert-jax convert --to hf runs/camembert camembert_hf   # CamembertForMaskedLM + its tokenizer

The vocabulary is a SentencePiece unigram model trained on the raw, cased text (spm_train's defaults, as
CamemBERT's), read in fairseq's layout (data.tokenizer=camembert_spm: `<s>NOTUSED <pad> </s>NOTUSED <unk>
<unk>NOTUSED`, the pieces, `<mask>`; 32,000 pieces make CamemBERT's 32,005 ids, pad = 1). The model is
RoBERTa's (configs/roberta.py: positions past the padding index, one token type, LayerNorm eps 1e-5, no NSP,
no pooler), the data RoBERTa's FULL-SENTENCES rows with dynamic masks, but masking whole words (every piece
of a word whose first piece starts with `▁`), as CamemBERT did. Recipe: RoBERTa-base's optimizer (Adam b2
0.98, eps 1e-6, weight decay 0.01, peak lr 6e-4, linear decay) for CamemBERT's 100k steps of 8,192
sequences of 512 tokens, with 10k warmup steps. The run's workdir exports to Hugging Face as a camembert
model (`model.family=camembert`). `tiny` is 2 layers on the embedded corpus, with a unigram vocabulary of
at most 8,192 pieces learnt from it on first use (cached beside it).
"""
from bert_jax.configs import common
from bert_jax.configs import roberta

PRESETS = {
    "tiny": "2 layers on the embedded corpus (learns its SentencePiece unigram vocabulary on first use)",
    "base": "CamemBERT-base (Martin et al. 2020): 8k batch of 512 tokens, 100k steps, whole-word masking",
}

# name: (learning rate, batch, steps, warmup, vocab entries: the pieces + CamemBERT's 5 symbols)
RECIPES = {
    "tiny": (1e-3, 32, 1500, 100, 8192 + 5),
    "base": (6e-4, 8192, 100_000, 10_000, 32000 + 5),
}


def get_config(arg: str = "base"):
  common.check_preset(arg, PRESETS)
  c = roberta.get_config(arg)
  lr, batch, steps, warmup, vocab_size = RECIPES[arg]
  c.model.update(family="camembert", vocab_size=vocab_size)
  c.data.update(tokenizer="camembert_spm", masking="whole_word")
  c.optimizer.update(learning_rate=lr, warmup_steps=warmup)
  c.train.update(batch_size=batch, num_steps=steps)
  return c
