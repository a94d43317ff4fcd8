"""NER fine-tuning config: CoNLL-2003 (Devlin et al. 2019, 5.3), first-sub-token labelling, entity F1.

  bert-jax finetune --config configs/ner.py:conll2003 --config.init_from=CKPT --workdir runs/ner
  ... --config.data.data_dir=conll2003/   # train.txt / valid.txt / test.txt (or eng.train/testa/testb)

Cased models should read cased text: --config.data.lower_case=False with a cased vocabulary.
"""
import ml_collections

from bert_jax.configs import common, glue

# Tag names in tfds conll2003's order; the original IOB1 files use the same names.
CONLL2003_LABELS = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC")
DATASETS = {"conll2003": CONLL2003_LABELS}
PRESETS = {"conll2003": "CoNLL-2003 English named entities (PER, ORG, LOC, MISC), entity F1"}


def get_config(arg: str = "conll2003"):
  common.check_preset(arg, PRESETS)
  c = glue.base_config()
  c.task = ml_collections.ConfigDict({"family": "ner", "name": arg, "labels": DATASETS[arg]})
  c.optimizer.learning_rate = 5e-5
  c.train.update(batch_size=32, epochs=3.0)
  c.sweep.update(learning_rates=(5e-5, 3e-5, 2e-5), batch_sizes=(32,), epochs=(3.0, 4.0))
  return c
