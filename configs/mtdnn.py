"""Multi-task fine-tuning (MT-DNN, Liu et al. 2019): one encoder shared by several tasks, a head each.

  bert-jax finetune --config configs/mtdnn.py:glue --config.init_from=bert-base-uncased \
      --config.data.data_dir=glue_data --workdir runs/mtdnn
  bert-jax finetune --config configs/glue.py:rte --config.init_from=runs/mtdnn --config.data.data_dir=glue_data/RTE \
      --workdir runs/mtdnn-rte        # MT-DNN's second stage: the shared encoder and RTE's head
  bert-jax finetune --config configs/mtdnn.py:tiny --workdir runs/mtdnn-tiny   # offline, two embedded tasks

The job is bert_jax/finetune/multitask.py (its docstring: sampling, the step, evaluation, the workdir).
`mtdnn.tasks` names the tasks: each is a fine-tuning task block (family, name, and a family's own fields) plus
`data_dir` (""; a GLUE task then reads data.data_dir/<its GLUE folder>, e.g. glue_data/RTE, or tfds when
data.data_dir is "" too). Every other block (model, data, optimizer, train, head) is fine-tuning's
(configs/glue.py), shared by the tasks. The recipe is MT-DNN's: lr 5e-5, batch 32, 5 epochs over all the
tasks' batches, 10% warmup, tasks drawn in proportion to their size. QNLI trains as MT-DNN's pairwise ranking
(`head: ranking`: each question's rows grouped, a positive and a negative per group, scale 1; its dev accuracy
from the top-scored row of each question: bert_jax/finetune/ranking.py).
"""
import ml_collections

from bert_jax.configs import common, glue

PRESETS = {
    "glue": "MT-DNN on GLUE: MNLI, RTE, QQP, QNLI, MRPC, SST-2, CoLA and STS-B sharing one encoder",
    "tiny": "two embedded tasks (word order, first word) sharing a tiny encoder: offline, for tests and a look",
}
GLUE_TASKS = ("cola", "mnli", "mrpc", "qnli", "qqp", "rte", "sst2", "stsb")  # MT-DNN's GLUE tasks (no WNLI)


def _task(family: str, name: str, **fields) -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict({"family": family, "name": name, "data_dir": "", **fields})


def get_config(arg: str = "glue") -> ml_collections.ConfigDict:
  common.check_preset(arg, PRESETS)
  c = glue.base_config()
  c.job = "mtdnn"  # the job kind (bert_jax/jobs.py); `bert-jax finetune` runs it
  c.task = ml_collections.ConfigDict({"family": "mtdnn", "name": arg})
  c.predict_split = "dev"  # "" | dev: each task's dev predictions in predictions/<task>/
  c.mtdnn = ml_collections.ConfigDict()
  if arg == "glue":
    c.mtdnn.tasks = ml_collections.ConfigDict({name: _task("glue", name) for name in GLUE_TASKS})
    # MT-DNN's QNLI: pairwise ranking of each question's candidates (finetune/ranking.py), pairs as theirs
    c.mtdnn.tasks.qnli.update(head="ranking", ranking={"group_size": 2, "scale": 1.0, "positive": "entailment"})
  else:
    c.mtdnn.tasks = ml_collections.ConfigDict({
        name: _task("embedded", name, num_train=1024, num_dev=128) for name in ("embedded", "first_word")})
  c.mtdnn.select = ""  # comma-separated names of mtdnn.tasks to train, e.g. "rte,mrpc,stsb"; "": all of them
  # proportional: task t drawn with probability n_t / sum n; temperature: n_t ** (1 / T) / sum n ** (1 / T)
  # (T = 1 is proportional, larger T flattens towards uniform); n: the task's training rows
  c.mtdnn.sampling = "proportional"
  c.mtdnn.temperature = 1.0
  c.mtdnn.loss_weights = ml_collections.ConfigDict({name: 1.0 for name in c.mtdnn.tasks})  # each task's loss x
  c.optimizer.learning_rate = 5e-5
  c.train.update(epochs=5.0, batch_size=32)
  if arg == "tiny":
    c.model.update(num_layers=2, hidden_size=64, num_heads=2, intermediate_size=256, max_position_embeddings=64)
    c.data.max_seq_length = 48
    c.optimizer.learning_rate = 1e-3  # a tiny model from scratch
    c.train.update(epochs=2.0, batch_size=32, log_every_steps=20, eval_batch_size=64)
  return c
