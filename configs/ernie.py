"""ERNIE 2.0 pretraining configs (Sun et al. 2019, "ERNIE 2.0: A Continual Pre-training Framework for Language
Understanding"): `objective="ernie2"`.

  bert-jax pretrain --config configs/ernie.py:base --workdir runs/ernie2-base \
      --config.data.corpus='text/*.txt' --config.data.vocab=vocab.txt

BERT's encoder with task embeddings (model.num_tasks, one row per task) and a head per task
(bert_jax/training/objectives/ernie2.py): knowledge masking (ERNIE 1.0's phrase and entity units,
data.masking=knowledge), capitalisation and token-document relation (word-aware), sentence reordering and
sentence distance (structure-aware); their labels come from the text (data.example_builder="ernie",
data_pipelines/ernie.py; data.ernie_reorder_share of the rows are reordering rows, the rest sentence pairs).
The continual schedule, ernie.stages: each "START:task=weight,..." stage starts after step START, trains on
every task so far and draws one task per batch with those weights. The stages and their steps here are
ours (the paper gives no per-task step counts for English). Semantic-aware tasks (discourse relation, IR
relevance) need labelled data: ernie.labelled = ("name:num_classes:path.tsv", ...) adds each as a
classification task (list it in a stage, and raise model.num_tasks by one per task).
Recipe (paper section 5.2, as recalled here and not re-checked against the paper: verify before a long run):
Adam (b2 0.98), lr 5e-5, warmup 4,000 steps, batches of 393,216 tokens (768 rows of 512), BERT-base size.
`tiny` runs the whole schedule on the embedded corpus.
"""
import ml_collections

from bert_jax.configs import bert, common

SIZES = {k: bert.SIZES[k] for k in ("tiny", "base", "large")}  # BERT's encoder
PRESETS = {
    "tiny": "2 layers on the embedded corpus: the whole 3-stage schedule in minutes on a CPU",
    "base": "ERNIE 2.0-base (Sun et al. 2019): word- then structure-aware tasks, batch 768 x 512",
    "large": "ERNIE 2.0-large (Sun et al. 2019), the same schedule",
}
# The stages: MLM alone, then the word-aware tasks join, then the structure-aware ones; MLM (knowledge
# masking) keeps twice a new task's odds.
WORD = "mlm=2,capital=1,token_doc=1"
ALL = WORD + ",reorder=1,distance=1"


def get_config(arg: str = "base"):
  common.check_preset(arg, PRESETS)
  c = common.sized_config(SIZES, arg)
  c.objective = "ernie2"
  c.model.update(sentence_head="none", num_tasks=5)  # the objective adds its heads; a task embedding per task
  c.data.update(example_builder="ernie", masking="knowledge", max_seq_length=512, max_predictions_per_seq=80)
  c.data.ernie_reorder_share = 0.5
  c.ernie = ml_collections.ConfigDict({"stages": ("0:mlm=1", f"100000:{WORD}", f"300000:{ALL}"), "labelled": ()})
  c.optimizer.update(name="adamw", learning_rate=5e-5, warmup_steps=4_000, b2=0.98, weight_decay=0.01)
  c.train.update(batch_size=768, num_steps=1_000_000)
  if arg == "tiny":
    common.on_embedded_corpus(c)
    c.data.update(max_seq_length=128, max_predictions_per_seq=0)  # 0: 20, the rate's
    c.ernie.stages = ("0:mlm=1", f"100:{WORD}", f"300:{ALL}")
    c.optimizer.update(learning_rate=1e-3, warmup_steps=100)
    c.train.update(batch_size=32, num_steps=1500)
  return c
