"""Fine-tuning configs for GLUE and the embedded demo task; squad.py and ner.py build on `base_config`.

  bert-jax finetune --config configs/glue.py:rte --config.init_from=runs/base --workdir runs/rte
  bert-jax finetune --config configs/glue.py:mnli --config.init_from=CKPT --config.data.data_dir=glue/MNLI ...
  bert-jax finetune --config configs/glue.py:embedded --config.init_from=runs/demo --workdir runs/demo-ft
  bert-jax sweep --config configs/glue.py:rte --config.init_from=CKPT --workdir runs/rte-sweep

Defaults follow the BERT paper's fine-tuning recipe: Adam (bias-corrected; optimizer.bias_correction
=False gives the original BERTAdam), lr 2e-5 (grid {5e-5, 4e-5, 3e-5, 2e-5}), batch 32 ({16, 32}),
3 epochs ({2, 3, 4}), 10% warmup then linear decay, weight decay 0.01, dropout 0.1, length 128.
The model section is used only without init_from (the checkpoint's architecture wins otherwise).
XLNet (an XLNet init_from) reads texts longer than max_seq_length with its segment memory:
--config.task.memory_segments=4 runs each row as 4 windows of max_seq_length, each attending to the memory
(task.memory_len, else the model's mem_len) of those before it (bert_jax/finetune/memory.py).
"""
import ml_collections

from bert_jax.configs import common

GLUE_TASKS = ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli")
PRESETS = {
    "cola": "GLUE CoLA: grammatical acceptability (8.5k sentences), Matthews correlation",
    "sst2": "GLUE SST-2: sentiment of movie-review sentences (67k), accuracy",
    "mrpc": "GLUE MRPC: paraphrase pairs (3.7k), F1 and accuracy",
    "stsb": "GLUE STS-B: similarity scores 0-5 (5.7k pairs), Pearson and Spearman",
    "qqp": "GLUE QQP: duplicate Quora questions (364k pairs), F1 and accuracy",
    "mnli": "GLUE MNLI: 3-way entailment (393k pairs), matched and mismatched accuracy",
    "qnli": "GLUE QNLI: does the sentence answer the question (105k pairs), accuracy",
    "rte": "GLUE RTE: entailment (2.5k pairs), accuracy",
    "wnli": "GLUE WNLI: Winograd entailment (635 pairs), accuracy",
    "embedded": "word order of embedded-corpus sentences (4k), offline: the README's fine-tuning run",
}

# The BERT paper's grid, searched by `bert-jax sweep`.
SWEEP = {"learning_rates": (5e-5, 4e-5, 3e-5, 2e-5), "batch_sizes": (16, 32), "epochs": (2.0, 3.0, 4.0),
         "seeds": (0, 1, 2)}

# XLNet's segment memory over long inputs (bert_jax/finetune/memory.py), a task block's keys (GLUE, the
# embedded task, NER): each row is memory_segments windows of data.max_seq_length, run in order, each
# attending to the last memory_len (0: the model's mem_len) states of the windows before it; 0: off.
MEMORY = {"memory_segments": 0, "memory_len": 0}


def base_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.job = "finetune"  # the job kind (bert_jax/jobs.py); `bert-jax finetune` runs it
  c.task = ml_collections.ConfigDict({"family": "glue", "name": "rte", **MEMORY})
  c.task.head = ""  # "": the task's own (classification, regression); ranking: MT-DNN's pairwise ranking
  # (a two-label pair task, e.g. qnli; bert_jax/finetune/ranking.py): each question's rows grouped, group_size
  # candidates per training group (one positive), the loss's scale (gamma); positive: the label of a
  # positive row ("": the task's first, QNLI's entailment)
  c.task.ranking = ml_collections.ConfigDict({"group_size": 2, "scale": 1.0, "positive": ""})
  c.init_from = ""  # pretraining workdir, params checkpoint, or fine-tuning workdir (two-stage)
  c.eval_only = False  # evaluate init_from (a fine-tuning workdir of this task) and write predictions
  c.predict_split = "dev"  # "" | dev | test: which split gets a prediction file
  c.model = common.model_config(num_layers=2, hidden_size=128, num_heads=2, intermediate_size=512)

  c.data = ml_collections.ConfigDict()
  c.data.data_dir = ""  # local files (GLUE TSVs, SQuAD JSON, CoNLL); "" : tfds
  c.data.tfds_data_dir = ""
  c.data.vocab = ""  # "" : the checkpoint's vocabulary (the embedded one without init_from)
  c.data.lower_case = True
  c.data.max_seq_length = 128
  # e.g. (32, 64, 128): rows go to the smallest length that holds them, batches never mix lengths, one
  # compiled shape each (finetune/batching.py); () pads every row to max_seq_length
  c.data.length_buckets = ()
  # training steps, evaluation and predict run each batch's real tokens packed into fewer rows, the padding dropped
  # (exact, dropout included; bert_jax/models/unpad.py) where the family can (BERT's families, ModernBERT): a
  # model.family that cannot is refused, an init_from of one runs padded; False: the padded rows
  c.data.unpad = True
  c.data.train_limit = 0  # use only the first N training examples (0: all)
  c.data.eval_limit = 0
  c.data.strict = False  # malformed rows, misplaced answers: False warns with a count and goes on; True stops

  c.head = ml_collections.ConfigDict()
  c.head.pooling = "pooled"  # pooled ([CLS] through the pooler) | layer_mix (weighted all layers)
  c.head.dropout = 0.1
  c.head.cls_norm = "none"  # none | isobn: the summary vector normalised (IsoBN, bert_jax/models/isobn.py)

  # Shared fields: bert_jax/config_schema.py; the others are fine-tuning's own.
  c.optimizer = common.optimizer_config(learning_rate=2e-5, warmup_ratio=0.1)  # the rate of the pretrained weights
  c.optimizer.frozen_learning_rate = 1e-3  # the base rate in train.mode=adapters / feature
  c.optimizer.head_learning_rate = 0.0  # for the new head; 0: same as learning_rate
  c.optimizer.layer_decay = 1.0  # layer-wise decay: layer i trains at lr * decay ** (L + 1 - i)
  c.optimizer.bias_correction = True  # False: the original BERTAdam

  c.train = common.train_config(batch_size=32, epochs=3.0, eval_batch_size=64, eval_every_epochs=1.0)
  # Separate streams (Dodge et al. 2020); -1: train.seed. head: the fresh parameters (the head, adapters;
  # the whole model without init_from); data: the order of the training rows; dropout: dropout masks
  # (and SMART's noise).
  c.train.head_seed = -1
  c.train.data_seed = -1
  c.train.dropout_seed = -1
  c.train.mode = "finetune"  # finetune (all) | adapters (Houlsby) | feature (frozen encoder, head only)
  c.train.adapter_size = 64  # the adapters' bottleneck width with train.mode=adapters
  c.train.keep_best = True  # keep the parameters of the best dev evaluation, report those
  c.train.early_stopping_patience = 0  # stop after this many evaluations without improvement (0: never)
  c.train.reinit_layers = 0  # re-initialise the top k encoder layers and the pooler
  # Q8BERT: int8 matmuls in the forward pass (per-channel weights, dynamic activations), straight-through
  # gradients; then `bert-jax quantize` stores the weights in int8. Needs bert_jax[quantize].
  c.train.qat = False
  # A paused or interrupted run's train state (WORKDIR/state); 0: saved only when it stops or pauses.
  c.checkpoint = common.checkpoint_config()

  # SMART (Jiang et al. 2019), the paper's values; finetune/smart.py.
  c.smart = ml_collections.ConfigDict()
  c.smart.enabled = False
  c.smart.adversarial_weight = 1.0  # lambda_s (the paper's grid {1, 3, 5}); 0: no adversarial term
  c.smart.bregman_weight = 1.0  # mu; 0: no Bregman proximal point term (and no teacher)
  c.smart.noise_std = 1e-5  # sigma of the initial perturbation
  c.smart.step_size = 1e-3  # eta of the ascent step
  c.smart.epsilon = 1e-5  # the perturbation's infinity-norm bound
  c.smart.iterations = 1  # ascent steps (T_x)
  c.smart.momentum = 0.99  # beta of the teacher for the first momentum_switch of the steps ...
  c.smart.late_momentum = 0.999  # ... and after
  c.smart.momentum_switch = 0.1

  c.sweep = ml_collections.ConfigDict(SWEEP)
  c.sweep.vary_seed = "all"  # which seed sweep.seeds set: all (train.seed) | head | data | dropout
  c.sweep.eta = 2  # successive halving: keep the best 1/eta configurations at each rung
  c.sweep.min_fraction = 0.25  # the first rung trains this fraction of each run's steps

  c.mesh = common.mesh_config()
  return c


def get_config(arg: str = "rte"):
  common.check_preset(arg, PRESETS)
  c = base_config()
  if arg == "embedded":
    c.task = ml_collections.ConfigDict({"family": "embedded", "name": "embedded", "num_train": 4000,
                                        "num_dev": 500, **MEMORY})
    c.data.max_seq_length = 64
    c.optimizer.learning_rate = 1e-4  # a tiny model: the BERT-base rates barely move it
    c.train.update(epochs=3.0, batch_size=32, log_every_steps=25)
    return c
  c.task.name = arg
  return c
