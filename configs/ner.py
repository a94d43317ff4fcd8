"""NER fine-tuning config: CoNLL-2003 (Devlin et al. 2019, 5.3), first-sub-token labelling, entity F1.

  bert-jax finetune --config configs/ner.py:conll2003 --config.init_from=CKPT --workdir runs/ner
  ... --config.data.data_dir=conll2003/   # train.txt / valid.txt / test.txt (or eng.train/testa/testb)
  bert-jax finetune --config configs/ner.py:sample --config.init_from=runs/demo --workdir runs/ner-sample

`sample` reads the 40 training and 12 dev sentences shipped in bert_jax/finetune/sample_data/ner (written
for bert_jax, Apache-2.0): offline, with the demo model's sizes.

Cased models should read cased text: --config.data.lower_case=False with a cased vocabulary.
"""
import os

import ml_collections

import bert_jax.finetune
from bert_jax.configs import common, glue

# Tag names in tfds conll2003's order; the original IOB1 files use the same names.
CONLL2003_LABELS = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC")
DATASETS = {"conll2003": CONLL2003_LABELS}
PRESETS = {"conll2003": "CoNLL-2003 English named entities (PER, ORG, LOC, MISC), entity F1",
           "sample": "CoNLL-2003's tags on 40 training and 12 dev sentences shipped with bert_jax: offline"}
SAMPLE_DIR = os.path.join(os.path.dirname(bert_jax.finetune.__file__), "sample_data", "ner")


def get_config(arg: str = "conll2003"):
  common.check_preset(arg, PRESETS)
  name = "conll2003" if arg == "sample" else arg
  c = glue.base_config()
  c.task = ml_collections.ConfigDict({"family": "ner", "name": name, "labels": DATASETS[name],
                                      **glue.MEMORY})
  c.optimizer.learning_rate = 5e-5
  c.train.update(batch_size=32, epochs=3.0)
  c.sweep.update(learning_rates=(5e-5, 3e-5, 2e-5), batch_sizes=(32,), epochs=(3.0, 4.0))
  if arg == "sample":  # CoNLL-2003's tags on the shipped sentences, at a size the demo model trains in seconds
    c.data.update(data_dir=SAMPLE_DIR, max_seq_length=64)
    c.optimizer.learning_rate = 1e-4
    c.train.update(batch_size=8, epochs=10.0, eval_batch_size=16, log_every_steps=10)
  return c
