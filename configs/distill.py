"""Distillation configs. Task distillation: a fine-tuning config (configs/glue.py) plus the `distill`
section; general distillation (`general-<size>`): a pretraining config (configs/bert.py) of objective
`distill_mlm` plus its `distill` section.

  bert-jax distill --config configs/distill.py:embedded --config.distill.teacher=runs/demo-ft \
      --config.distill.student_layers=every_other --workdir runs/demo-distilled
  bert-jax distill --config configs/distill.py:sst2 --config.distill.teacher=runs/sst2 \
      --config.model.num_layers=4 --config.model.hidden_size=312 --config.distill.hidden_weight=1 ...
  bert-jax distill --config configs/distill.py:general-tiny --config.distill.teacher=runs/demo \
      --workdir runs/demo-general                # the demo model -> 1 layer, on the embedded corpus
  bert-jax distill --config configs/distill.py:theseus --config.distill.teacher=runs/sst2 \
      --config.data.data_dir=glue/SST-2 --workdir runs/sst2-theseus   # BERT-of-Theseus: 12 -> 6 layers
  bert-jax pretrain --config configs/bert.py:mini --workdir runs/mini      # PD, step 1: the compact student
  bert-jax distill --config configs/distill.py:pd --config.init_from=runs/mini \
      --config.distill.teacher=runs/sst2 --config.data.data_dir=glue/SST-2 --workdir runs/sst2-pd
  bert-jax distill --config configs/distill.py:mobilebert --config.distill.teacher=runs/sst2 \
      --config.data.data_dir=glue/SST-2 --workdir runs/sst2-mobilebert  # MobileBERT's shape, from scratch

Task distillation: the student is `distill.student_layers` of the teacher ("every_other": DistilBERT's
init) or, with it empty, the architecture of config.model (or of init_from). Loss weights of 0 switch a
loss off. General distillation: the teacher is a pretraining workdir or converted checkpoint, the
student takes its tokenizer and, with student_layers, its architecture and those layers; the student's
workdir is a pretraining workdir (bert_jax/compress/general.py).
"""
import ml_collections

from bert_jax.configs import bert, common, glue, mobilebert
from bert_jax.models.bilstm import BiLSTMConfig

PRESETS = {
    "embedded": "task distillation of a teacher fine-tuned on the embedded task: offline, minutes on a CPU",
    **{task: f"task distillation on {glue.PRESETS[task].split(':')[0]}" for task in glue.GLUE_TASKS},
    "general-tiny": "general distillation (DistilBERT's loss) of a pretrained teacher on the embedded corpus",
    **{f"general-{size}": f"general distillation into a student of BERT-{size}'s size, on the pretraining corpus"
       for size in bert.SIZES if size != "tiny"},
    "theseus": "BERT-of-Theseus on SST-2: the teacher's modules replaced by single layers on a linear curriculum",
    "pd": "pre-trained distillation (Turc et al. 2019) on SST-2: a compact student pretrained with MLM "
          "(init_from) distilled on the teacher's soft labels",
    "pd-embedded": "pre-trained distillation on the embedded task: offline, minutes on a CPU",
    "bilstm": "a BiLSTM student (Tang et al. 2019) on SST-2: the hard labels and the squared distance to the "
              "teacher's logits",
    "bilstm-embedded": "a small BiLSTM student on the embedded task: offline, a minute on a CPU",
    "mobilebert": "MobileBERT's architecture alone (configs/mobilebert.py's `tiny` sizes), randomly initialised, "
                  "task-distilled on SST-2 from the teacher's soft labels and the hard labels",
}


def _general(size: str) -> ml_collections.ConfigDict:
  """DistilBERT's recipe on the pretraining corpus: KL to the teacher's masked-LM soft targets + MLM."""
  c = bert.get_config("demo" if size == "tiny" else size)
  c.job = "general_distill"  # bert_jax/jobs.py; `bert-jax distill` runs it
  c.objective = "distill_mlm"
  c.distill = ml_collections.ConfigDict()
  c.distill.teacher = ""  # a pretraining workdir or a converted checkpoint with an MLM head
  c.distill.student_layers = "every_other"  # "" (config.model) | "every_other" | teacher layer indices "0,2"
  c.distill.temperature = 2.0  # soft targets: softmax(logits / T) at the masked positions, KL x T^2
  c.distill.soft_weight = 1.0  # KL to the teacher's soft targets
  c.distill.hard_weight = 1.0  # the student's own MLM (and sentence-head) loss
  c.distill.cosine_weight = 0.0  # 1 - cos of the last hidden states (DistilBERT; same width)
  if size == "tiny":  # a few hundred steps of the embedded corpus: a minute or two on a CPU
    c.optimizer.update(learning_rate=1e-3, warmup_steps=30)
    c.train.update(num_steps=300, log_every_steps=50, eval_every_steps=100)
    c.checkpoint.every_steps = 100
  return c


def _theseus() -> ml_collections.ConfigDict:
  """BERT-of-Theseus (Xu et al. 2020; bert_jax/compress/theseus.py) on SST-2: the predecessor (distill.teacher,
  a fine-tuned workdir) in `modules` modules, each replaced by one successor layer with probability
  min(1, replace_rate + (1 - replace_rate) t / T), T = curriculum_fraction of the steps; then the successor alone
  for the rest of the run. GLUE's fine-tuning rate and batch (configs/glue.py), twice its epochs."""
  c = glue.get_config("sst2")
  c.job = "theseus"  # bert_jax/jobs.py; `bert-jax distill` runs it
  c.distill = ml_collections.ConfigDict()
  c.distill.teacher = ""  # the predecessor: a fine-tuning workdir of the same task
  c.distill.modules = 0  # successor layers (each replacing teacher_layers / modules layers); 0: half the teacher's
  c.distill.replace_rate = 0.3  # the curriculum's base replacement rate b
  c.distill.curriculum_fraction = 0.5  # p reaches 1 after this fraction of the steps; the successor alone after
  c.train.epochs = 6.0  # the curriculum's half, then the successor's fine-tuning
  return c


def _pd(task: str) -> ml_collections.ConfigDict:
  """Pre-trained distillation (Turc et al. 2019, "Well-Read Students Learn Better"): a compact model
  pretrained with MLM on unlabelled text (init_from: its pretraining workdir, required) is distilled on the
  task's data with the teacher's soft labels alone (cross-entropy to the teacher's distribution at
  temperature 1, no hard labels). Fine-tuning the result on the labels is the paper's optional third step
  (`bert-jax finetune --config.init_from=` the PD workdir)."""
  c = get_config(task)
  c.distill.require_init_from = True
  c.distill.update(temperature=1.0, hard_weight=0.0, soft_weight=1.0)
  return c


def _bilstm(task: str) -> ml_collections.ConfigDict:
  """Distilling into a BiLSTM (Tang et al. 2019; bert_jax/models/bilstm.py): the student (the paper's
  300-wide embeddings over the teacher's word pieces, 150 LSTM units each way, a 400-wide ReLU layer)
  learns from hard_weight * cross-entropy + soft_weight * ||z_student - z_teacher||^2 (the paper's
  alpha and 1 - alpha), trained from scratch at a recurrent network's learning rate (AdamW here; the
  paper used Adadelta). The teacher's vocabulary is the student's: set model.vocab_size to its size."""
  c = get_config(task)
  c.model = common.model_config_of(BiLSTMConfig)
  if task == "embedded":  # the embedded WordPiece vocabulary; a small student for a CPU
    c.model.update(vocab_size=8192, embedding_size=64, lstm_size=32, hidden_size=64)
  c.distill.update(soft_loss="logit_mse", hard_weight=0.5, soft_weight=0.5, projection=False)
  c.optimizer.learning_rate = 1e-3
  c.data.unpad = False  # its encoder reads the padded rows (models/unpad.py)
  return c


def _mobilebert() -> ml_collections.ConfigDict:
  """MobileBERT's architecture (Sun et al. 2020; bert_jax/models/mobilebert.py with configs/mobilebert.py's
  `tiny` sizes: 4 bottlenecked layers carrying 128, 2 stacked FFNs, NoNorm, ReLU, 32-wide trigram
  embeddings) as a task-distillation student on SST-2, randomly initialised: DistilBERT's loss (KL at T=2 +
  the hard labels) from a fine-tuned teacher of another family. Not the paper's recipe: without IB-BERT
  pretraining and progressive transfer (configs/mobilebert.py:pkt) the student knows only the words the
  task's training set shows it. The vocabulary is the teacher's (model.vocab_size: BERT uncased's 30,522
  here; set it to the teacher's); a from-scratch rate, 1e-3 (the BiLSTM student's)."""
  c = get_config("sst2")
  c.model = mobilebert.model_config("tiny")
  c.model.vocab_size = 30522
  c.optimizer.learning_rate = 1e-3
  c.data.unpad = False  # its encoder reads the padded rows (models/unpad.py)
  return c


def get_config(arg: str = "embedded"):
  common.check_preset(arg, PRESETS)
  if arg.startswith("general-"):
    return _general(arg[len("general-"):])
  if arg == "theseus":
    return _theseus()
  if arg in ("pd", "pd-embedded"):
    return _pd("sst2" if arg == "pd" else "embedded")
  if arg in ("bilstm", "bilstm-embedded"):
    return _bilstm("sst2" if arg == "bilstm" else "embedded")
  if arg == "mobilebert":
    return _mobilebert()
  c = glue.get_config(arg)
  c.job = "distill"  # bert_jax/jobs.py; `bert-jax distill` runs it
  c.distill = ml_collections.ConfigDict()
  c.distill.teacher = ""  # a fine-tuning workdir of the same task
  c.distill.student_layers = ""  # "" (config.model) | "every_other" | teacher layer indices "0,2,4"
  c.distill.require_init_from = False  # True (PD): the student must start from a pretrained one (init_from)
  c.distill.temperature = 2.0  # soft targets: softmax(logits / T), the KL scaled by T^2
  c.distill.hard_weight = 1.0  # cross-entropy with the labels (squared error for regression)
  c.distill.soft_weight = 1.0  # KL to the teacher's soft targets (DistilBERT, Hinton et al.)
  c.distill.soft_loss = "kl"  # kl | logit_mse: the squared distance between the logits (Tang et al.'s BiLSTM)
  c.distill.hidden_weight = 0.0  # hidden-state MSE over the layer map (TinyBERT)
  c.distill.attention_weight = 0.0  # attention-map MSE over the layer map (TinyBERT; same head count)
  c.distill.pkd_weight = 0.0  # normalised [CLS] MSE of the intermediate layers (BERT-PKD)
  c.distill.projection = True  # a learned student -> teacher width map where the widths differ
  return c
