"""SQuAD fine-tuning configs (Devlin et al. 2019, 4.2 and 4.3).

  bert-jax finetune --config configs/squad.py:v1 --config.init_from=CKPT --workdir runs/squad1
  bert-jax finetune --config configs/squad.py:v2 --config.init_from=CKPT --workdir runs/squad2 \
      --config.data.data_dir=squad/   # train-v2.0.json, dev-v2.0.json; "" reads tfds squad/v2.0

The paper: v1.1 lr 5e-5, batch 32, 3 epochs; v2.0 lr 5e-5, batch 48, 2 epochs; both at length 384 with
doc stride 128 and questions of at most 64 tokens; n-best 20, answers of at most 30 tokens.
"""
import ml_collections

from bert_jax.configs import common, glue

# name: (SQuAD version, learning rate, batch, epochs)
VERSIONS = {"v1": ("v1.1", 5e-5, 32, 3.0), "v2": ("v2.0", 5e-5, 48, 2.0)}
PRESETS = {"v1": "SQuAD v1.1: extractive question answering, exact match and F1",
           "v2": "SQuAD v2.0: v1.1 plus unanswerable questions"}


def get_config(arg: str = "v1"):
  common.check_preset(arg, PRESETS)
  version, lr, batch, epochs = VERSIONS[arg]
  c = glue.base_config()
  c.task = ml_collections.ConfigDict({
      "family": "squad", "name": f"squad_{arg}", "version": version,
      "doc_stride": 128, "max_query_length": 64, "n_best_size": 20, "max_answer_length": 30,
      "null_score_diff_threshold": 0.0,  # v2.0: answer "" when null score - best span score exceeds this
  })
  c.data.max_seq_length = 384
  c.optimizer.learning_rate = lr
  c.train.update(batch_size=batch, epochs=epochs, eval_batch_size=64)
  c.sweep.update(learning_rates=(5e-5, 3e-5), batch_sizes=(batch,), epochs=(2.0, 3.0))
  return c
