"""StructBERT pretraining configs (Wang et al. 2019): `objective="structbert"`.

  bert-jax pretrain --config configs/structbert.py:base --workdir runs/structbert-base \
      --config.data.corpus='text/*.txt' --config.data.vocab=vocab.txt

BERT's encoder and masking (15% of tokens, 80/10/10) with two structural objectives beside MLM
(bert_jax/training/objectives/structbert.py): the word objective shuffles 5% of the trigrams of
unmasked tokens (data.trigram_shuffle_rate=0.05, data_pipelines/shuffling.py) and predicts their
original tokens through the MLM output layer; the sentence objective classifies a segment pair as B
next, B previous or B from another document, 1/3 each (data.example_builder="sso"), on the pooled
output. Loss = MLM + word + sentence losses. Recipe (paper section 3, as recalled here and not
re-checked against the paper: verify before a long run): Adam, lr 1e-4, weight decay 0.01, warmup
over the first 10% of steps then linear decay, batch 1024, sequences of 512 tokens, 40 epochs of
English Wikipedia and BookCorpus; 250k steps of 1024 rows are BERT's 40 epochs (1M steps of 256 rows).
`tiny` runs on the embedded corpus.
"""
from bert_jax.configs import bert, common

SIZES = {k: bert.SIZES[k] for k in ("tiny", "base", "large")}  # BERT's encoder
PRESETS = {
    "tiny": "2 layers on the embedded corpus; minutes on a CPU",
    "base": "StructBERT-base (Wang et al. 2019): word and sentence structure objectives, batch 1024",
    "large": "StructBERT-large (Wang et al. 2019), the same recipe",
}


def get_config(arg: str = "base"):
  common.check_preset(arg, PRESETS)
  c = common.sized_config(SIZES, arg)
  c.objective = "structbert"
  c.model.update(sentence_head="none")  # the objective adds the 3-way sentence head
  c.data.update(example_builder="sso", trigram_shuffle_rate=0.05, max_seq_length=512,
                max_predictions_per_seq=80)
  c.optimizer.update(name="adamw", learning_rate=1e-4, warmup_steps=25_000, weight_decay=0.01)
  c.train.update(batch_size=1024, num_steps=250_000)
  if arg == "tiny":
    common.on_embedded_corpus(c)
    c.data.update(max_seq_length=128, max_predictions_per_seq=0)  # 0: 20, the rate's
    c.optimizer.update(learning_rate=1e-3, warmup_steps=100)
    c.train.update(batch_size=32, num_steps=1500)
  return c
