"""MobileBERT pretraining configs (Sun et al. 2020): MLM + NSP on the MobileBERT network, its IB-BERT teacher,
and the paper's progressive knowledge transfer from that teacher into MobileBERT.

  bert-jax pretrain --config configs/mobilebert.py:tiny --workdir runs/mobilebert-tiny   # laptop, embedded corpus
  bert-jax pretrain --config configs/mobilebert.py:base --workdir gs://b/mobilebert \
      --config.data.corpus='gs://b/text/*.txt' --config.data.vocab=gs://b/vocab.txt
  bert-jax pretrain --config configs/mobilebert.py:ib_tiny --workdir runs/ib-tiny        # the teacher
  bert-jax distill --config configs/mobilebert.py:pkt_tiny --config.distill.teacher=runs/ib-tiny \
      --workdir runs/mobilebert-pkt-tiny                                                  # the student from it

The model (bert_jax/models/mobilebert.py): 24 layers carrying 512 between them, each a 128-wide body
behind linear bottlenecks, 4 stacked feed-forward networks (intermediate 512), NoNorm, ReLU, 4 heads,
128-wide token embeddings read as trigrams; `base` is google/mobilebert-uncased's shape, 24.8M backbone
parameters (the paper's 25.3M). Data: BERT's uncased 30,522-entry WordPiece vocabulary, NSP rows.

`tiny` and `base` train MobileBERT directly with MLM + NSP, with LAMB at the paper's batch of 4096. The
paper instead transfers knowledge from an inverted-bottleneck BERT-large teacher:
  - `ib_bert` is that teacher (IB-BERT_LARGE, the paper's table 1): the same network with inverted
    bottlenecks, 512 between blocks (the student's width) and 1024 inside, queries, keys and values read
    from the 512-wide block input, 4 heads (the student's: attention transfer compares head by head), one
    4096-wide feed-forward network, LayerNorm and GELU; 294.5M backbone parameters (the paper: 293M).
    `ib_tiny` is its small sibling with `tiny`'s 128-wide inter-block width and 2 heads. Both pretrain
    with MLM + NSP like any preset (`bert-jax pretrain`).
  - `pkt` and `pkt_tiny` distil `base` and `tiny` from such a teacher (distill.teacher, a pretraining
    workdir of the same layer count, width and heads): objective `mobilebert_pkt`
    (training/objectives/mobilebert_pkt.py), job general_distill (the student's workdir is a pretraining
    workdir). Stage l = 1..L (distill.stage_steps steps each) trains layer l (and the embeddings with
    l = 1), everything else frozen, on the feature-map MSE and the attention KL of layer l; then
    pre-training distillation trains everything on alpha MLM + (1 - alpha) KD + NSP for the remaining
    steps. `tiny` trains on the embedded corpus and its WordPiece vocabulary.
`bert-jax convert --from hf` reads the released checkpoint (google/mobilebert-uncased) and its fine-tuned
heads.
"""
import ml_collections

from bert_jax.configs import common
from bert_jax.models.mobilebert import MobileBertConfig

# name: (layers, hidden, heads, intermediate, embedding, intra-bottleneck, feed-forward networks)
SIZES = {
    "tiny": (4, 128, 2, 64, 32, 32, 2),
    "base": (24, 512, 4, 512, 128, 128, 4),
}
# name: (learning rate, batch, steps, warmup steps, sequence length, predictions per row)
RECIPES = {
    "tiny": (2e-3, 32, 1500, 100, 128, 20),
    "base": (1e-3, 4096, 125_000, 3_125, 512, 20),
}
# The IB-BERT teachers: name: (layers, inter-block, heads, intermediate, embedding, intra-block), one FFN,
# LayerNorm, GELU, queries/keys/values from the block input.
TEACHER_SIZES = {
    "ib_tiny": (4, 128, 2, 1024, 32, 256),
    "ib_bert": (24, 512, 4, 4096, 128, 1024),
}
TEACHER_OF = {"ib_tiny": "tiny", "ib_bert": "base"}  # whose recipe each teacher pretrains with
STUDENT_OF = {"pkt_tiny": "tiny", "pkt": "base"}
PRESETS = {
    "tiny": "a 4-layer MobileBERT (2 stacked FFNs) on the embedded corpus; minutes on a CPU",
    "base": "MobileBERT (Sun et al. 2020), 24 bottlenecked layers, 24.8M parameters: MLM + NSP with LAMB, "
            "batch 4096 (no teacher)",
    "ib_tiny": "a 4-layer IB-BERT teacher for `tiny` (inter-block 128, intra-block 256), on the embedded corpus",
    "ib_bert": "IB-BERT_LARGE, MobileBERT's teacher: 24 inverted-bottleneck layers (512 <-> 1024), 294.5M "
               "parameters: MLM + NSP with LAMB, batch 4096",
    "pkt_tiny": "progressive knowledge transfer from an ib_tiny workdir (distill.teacher) into `tiny`, then "
                "pre-training distillation, on the embedded corpus",
    "pkt": "progressive knowledge transfer from IB-BERT (distill.teacher) into MobileBERT `base` (24 stages), "
           "then pre-training distillation",
}


def model_config(size: str):
  """The model section: MobileBertConfig's fields (and meaning) with `size`'s dimensions."""
  layers, hidden, heads, intermediate, embedding, bottleneck, ffns = SIZES[size]
  c = common.model_config_of(MobileBertConfig)
  c.update(num_layers=layers, hidden_size=hidden, num_heads=heads, intermediate_size=intermediate,
           embedding_size=embedding, intra_bottleneck_size=bottleneck, num_feedforward_networks=ffns,
           scan_unroll=layers if layers <= 8 else 1)
  return c


def teacher_model_config(size: str):
  """The model section of an IB-BERT teacher (TEACHER_SIZES)."""
  layers, hidden, heads, intermediate, embedding, intra = TEACHER_SIZES[size]
  c = common.model_config_of(MobileBertConfig)
  c.update(num_layers=layers, hidden_size=hidden, num_heads=heads, intermediate_size=intermediate,
           embedding_size=embedding, intra_bottleneck_size=intra, num_feedforward_networks=1,
           key_query_shared_bottleneck=False, normalization_type="layer_norm", hidden_act="gelu",
           hidden_dropout=0.1, scan_unroll=layers if layers <= 8 else 1)
  return c


def _pkt(student: str) -> ml_collections.ConfigDict:
  """Progressive knowledge transfer into `student` (objective mobilebert_pkt), then pre-training distillation."""
  c = get_config(student)
  c.job = "general_distill"  # bert_jax/jobs.py; `bert-jax distill` runs it (the teacher's tokenizer is taken)
  c.objective = "mobilebert_pkt"
  c.distill = ml_collections.ConfigDict()
  c.distill.teacher = ""  # an IB-BERT pretraining workdir (ib_tiny, ib_bert) of the student's layers, width, heads
  c.distill.student_layers = ""  # the student is config.model (general distillation's key; must stay "")
  # Steps of each layer's stage (L stages), the rest of train.num_steps pre-training distillation: here half
  # the run layer by layer, half distillation.
  c.distill.stage_steps = c.train.num_steps // (2 * c.model.num_layers)
  c.distill.feature_weight = 1.0  # feature-map transfer: MSE of layer l's outputs
  c.distill.attention_weight = 1.0  # attention transfer: KL(teacher || student) of layer l's heads
  c.distill.alpha = 0.5  # pre-training distillation: alpha MLM + (1 - alpha) KD + NSP (the paper's 0.5)
  c.distill.temperature = 1.0  # the KD term's softmax temperature (KL scaled by T^2)
  return c


def get_config(arg: str = "base"):
  common.check_preset(arg, PRESETS)
  if arg in STUDENT_OF:
    return _pkt(STUDENT_OF[arg])
  c = common.base_config()
  recipe = TEACHER_OF.get(arg, arg)
  c.model = teacher_model_config(arg) if arg in TEACHER_SIZES else model_config(arg)
  lr, batch, steps, warmup, length, predictions = RECIPES[recipe]
  c.data.update(example_builder="nsp", max_seq_length=length, max_predictions_per_seq=predictions)
  c.optimizer.update(name="lamb", learning_rate=lr, warmup_steps=warmup, weight_decay=0.01)
  c.train.update(batch_size=batch, num_steps=steps)
  if recipe == "tiny":
    common.on_embedded_corpus(c)
  return c
