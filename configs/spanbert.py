"""SpanBERT pretraining configs (Joshi et al. 2020): `objective="spanbert"`.

  bert-jax pretrain --config configs/spanbert.py:base --workdir runs/spanbert-base \
      --config.data.corpus='text/*.txt' --config.data.vocab=cased_vocab.txt

BERT's encoder (cased 28,996-entry WordPiece vocabulary, no NSP, no pooler) trained with MLM plus the
span boundary objective: masks cover whole-word spans of geometric length (p=0.2, at most 10 words)
and every masked token is also predicted from the two tokens bounding its span
(bert_jax/models/spanbert.py). Rows are single contiguous segments of up to 512 tokens from one
document. Recipe (paper section 4): AdamW, lr 1e-4, weight decay 0.01, warmup 10k then linear decay,
batch 256, 2.4M steps.
`tiny` runs on the embedded corpus.
"""
from bert_jax.configs import common

# name: (layers, hidden, heads, intermediate)
SIZES = {
    "tiny": (2, 128, 2, 512),
    "base": (12, 768, 12, 3072),
    "large": (24, 1024, 16, 4096),
}

PRESETS = {
    "tiny": "2 layers on the embedded corpus; minutes on a CPU",
    "base": "SpanBERT-base (Joshi et al. 2020): cased, span masking + SBO, batch 256, 2.4M steps",
    "large": "SpanBERT-large (Joshi et al. 2020), the same recipe",
}


def get_config(arg: str = "base"):
  common.check_preset(arg, PRESETS)
  c = common.sized_config(SIZES, arg)
  c.objective = "spanbert"
  c.model.update(vocab_size=28996, use_pooler=False, sentence_head="none")
  c.data.update(masking="span", example_builder="doc_sentences", lower_case=False, max_seq_length=512,
                max_predictions_per_seq=80)
  c.optimizer.update(name="adamw", learning_rate=1e-4, warmup_steps=10_000, weight_decay=0.01)
  c.train.update(batch_size=256, num_steps=2_400_000)
  if arg == "tiny":
    common.on_embedded_corpus(c)
    c.data.update(lower_case=True, max_seq_length=128, max_predictions_per_seq=0)  # 0: 20, the rate's
    c.optimizer.update(learning_rate=1e-3, warmup_steps=100)
    c.train.update(batch_size=32, num_steps=1500)
  return c
