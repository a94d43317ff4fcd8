"""SQuAD fine-tuning configs (Devlin et al. 2019, 4.2 and 4.3).

  bert-jax finetune --config configs/squad.py:v1 --config.init_from=CKPT --workdir runs/squad1
  bert-jax finetune --config configs/squad.py:v2 --config.init_from=CKPT --workdir runs/squad2 \
      --config.data.data_dir=squad/   # train-v2.0.json, dev-v2.0.json; "" reads tfds squad/v2.0
  bert-jax finetune --config configs/squad.py:sample-v2 --config.init_from=runs/demo --workdir runs/squad-sample

`sample-v1` and `sample-v2` read the paragraphs and questions shipped in bert_jax/finetune/sample_data/squad
(written for bert_jax, Apache-2.0; 32 training and 12 dev questions, v2.0 one unanswerable more per
paragraph): offline, with the demo model's sizes (length 128, stride 64).

The paper: v1.1 lr 5e-5, batch 32, 3 epochs; v2.0 lr 5e-5, batch 48, 2 epochs; both at length 384 with
doc stride 128 and questions of at most 64 tokens; n-best 20, answers of at most 30 tokens.
"""
import os

import ml_collections

import bert_jax.finetune
from bert_jax.configs import common, glue

# name: (SQuAD version, learning rate, batch, epochs)
VERSIONS = {"v1": ("v1.1", 5e-5, 32, 3.0), "v2": ("v2.0", 5e-5, 48, 2.0)}
PRESETS = {"v1": "SQuAD v1.1: extractive question answering, exact match and F1",
           "v2": "SQuAD v2.0: v1.1 plus unanswerable questions",
           "sample-v1": "v1 on 32 training and 12 dev questions shipped with bert_jax: offline",
           "sample-v2": "v2 on the same paragraphs, one unanswerable question more on each: offline"}
SAMPLE_DIR = os.path.join(os.path.dirname(bert_jax.finetune.__file__), "sample_data", "squad")


def get_config(arg: str = "v1"):
  common.check_preset(arg, PRESETS)
  sample = arg.startswith("sample-")
  arg = arg.removeprefix("sample-")
  version, lr, batch, epochs = VERSIONS[arg]
  c = glue.base_config()
  c.task = ml_collections.ConfigDict({
      "family": "squad", "name": f"squad_{arg}", "version": version,
      "doc_stride": 128, "max_query_length": 64, "n_best_size": 20, "max_answer_length": 30,
      "null_score_diff_threshold": 0.0,  # v2.0: answer "" when null score - best span score exceeds this
      # "" (span): start and end logits; xlnet_beam: XLNet's beam-search head with its answer class (an XLNet
      # model; its null score is the answer class's logit: bert_jax/finetune/squad.py)
      "head": "",
  })
  c.data.max_seq_length = 384
  c.optimizer.learning_rate = lr
  c.train.update(batch_size=batch, epochs=epochs, eval_batch_size=64)
  c.sweep.update(learning_rates=(5e-5, 3e-5), batch_sizes=(batch,), epochs=(2.0, 3.0))
  if sample:  # the shipped paragraphs, at a size the demo model trains in seconds
    c.task.doc_stride = 64
    c.data.update(data_dir=SAMPLE_DIR, max_seq_length=128)
    c.optimizer.learning_rate = 1e-4
    c.train.update(batch_size=8, epochs=10.0, eval_batch_size=16, log_every_steps=10)
  return c
