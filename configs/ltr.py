"""BERT's "LTR & No NSP" ablation (Devlin et al. 2019, Table 5): BERT's encoder and recipe, trained as a
left-to-right LM (model.causal: each token sees only those before it, also when fine-tuned) on rows of
whole sentences, with no next-sentence prediction (objective="ltr", bert_jax/training/objectives/ltr.py).

  bert-jax pretrain --config configs/ltr.py:demo --workdir runs/ltr-demo    # laptop, embedded corpus
"""
from bert_jax.configs import bert, common

PRESETS = {
    "tiny": "BERT-Tiny as a left-to-right LM, no NSP (BERT's Table 5 ablation) with BERT's recipe",
    "base": "BERT-base as a left-to-right LM, no NSP: the paper's LTR & No NSP row",
    "demo": "tiny LTR on the embedded corpus, bert.py:demo's schedule",
}


def get_config(arg: str = "base"):
  common.check_preset(arg, PRESETS)
  c = bert.get_config(arg)
  c.objective = "ltr"
  c.model.update(causal=True, sentence_head="none")
  c.data.example_builder = "full_sentences"
  return c
