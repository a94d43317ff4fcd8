"""Sections every pretraining config shares. Family files (`bert.py`, `albert.py`, ...) fill in the numbers.

Logical axis rules map the names the model puts on parameters and activations to mesh axes; they are
the only place where the sharding layout is decided.
"""
import dataclasses

import ml_collections

from bert_jax.models.config import ModelConfig

# Logical axis -> mesh axes. `batch` is split over data and fsdp; weights over fsdp (ZeRO-3 style)
# along `embed` and over tensor along the per-layer wide axes (Megatron style).
LOGICAL_AXIS_RULES = (
    ("batch", ("data", "fsdp")),
    ("length", None),
    ("embed", "fsdp"),
    ("vocab", "tensor"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv", None),
    ("layers", None),
    ("positions", None),
    ("type_vocab", None),
    ("classes", None),
    ("norm", None),
)


# ModelConfig fields a job sets, not the user: one setting each (fine-tuning's train.adapter_size).
SET_BY_JOBS = ("adapter_size",)


def model_config_of(config_class, **overrides) -> ml_collections.ConfigDict:
  """A model section: the fields of a family's config dataclass with their defaults (their meaning is in
  its docstring), those that jobs set left out."""
  c = ml_collections.ConfigDict({f.name: f.default for f in dataclasses.fields(config_class)
                                 if f.name not in SET_BY_JOBS})
  c.update(overrides)
  return c


def model_config(**overrides) -> ml_collections.ConfigDict:
  """The encoder's fields with ModelConfig's defaults (BERT-base); see bert_jax/models/config.py."""
  return model_config_of(ModelConfig, **overrides)


def data_config(**overrides) -> ml_collections.ConfigDict:
  """Input pipeline fields; see data_pipelines/README.md for their meaning."""
  c = ml_collections.ConfigDict()
  c.format = "text"  # text (corpus/prepared/tfds_name) | bert_tfrecord (create_pretraining_data.py records in corpus)
  c.corpus = ""  # glob(s) of text files, comma separated; "" with no tfds_name: the embedded corpus
  c.corpus_format = "sentence_per_line"  # or "document_per_line"
  c.tfds_name = ""
  c.tfds_split = "train"
  c.tfds_feature = "text"
  c.tfds_data_dir = ""
  c.prepared = ""  # glob of records written by `bert-jax data prepare`
  c.eval_corpus = ""  # "" : hold out eval_fraction of the documents
  c.general_eval_corpus = ""  # a second held-out set, its metrics general_* (configs/continue.py); "": none
  c.eval_fraction = 0.02
  c.vocab = ""  # vocab.txt (WordPiece) or *.model (SentencePiece); "" : the embedded vocabulary
  c.tokenizer = "wordpiece"  # wordpiece | sentencepiece | tokenizer_json (a HF tokenizer.json); must match the vocab file
  c.lower_case = True
  c.max_seq_length = 128
  # Masked positions a row has room for; 0: ceil(mask_rate * max_seq_length), the rate's count at any length (20 at
  # 128 tokens and 15%). A number below it caps the rate (ALBERT's 20 at 512): bert_jax/data_pipelines/masking.py.
  c.max_predictions_per_seq = 0
  c.mask_rate = 0.15
  # ((step, rate), ...): from each step on, that masking rate (mmBERT's 15% -> 5%, configs/modernbert.py), changed in
  # the running input pipeline and resumed exactly across a boundary; (): data.mask_rate throughout
  c.mask_rate_schedule = ()
  c.masking = "token"  # token | whole_word | ngram | span | knowledge
  # data.masking=knowledge (ERNIE 1.0): where the phrase/entity spans come from, and the odds of each level's
  # units (0 for phrase or entity: its spans are masked as words). Neither spacy_model nor phrases: runs of
  # capitalised words as entities (bert_jax/data_pipelines/knowledge.py).
  c.knowledge = ml_collections.ConfigDict({"spacy_model": "", "phrases": "", "basic_weight": 1.0,
                                           "phrase_weight": 1.0, "entity_weight": 1.0})
  c.masking_mode = "dynamic"  # dynamic (fresh masks every epoch) | static (dupe_factor fixed copies)
  c.dupe_factor = 10  # static masking: epochs repeat rows and masks with this period (BERT: 10)
  c.mask_token = "[MASK]"  # what the 80% branch writes: [MASK] or [UNK] (Clinchant et al. 2019)
  c.trigram_shuffle_rate = 0.0  # StructBERT: shuffle this fraction of the unmasked tokens' trigrams (0: off)
  c.example_builder = "nsp"  # nsp | sop | sso | full_sentences | doc_sentences
  c.short_seq_prob = 0.1
  c.packing = False  # pack whole documents per row (full_sentences/doc_sentences only)
  c.num_shards = 8  # virtual shards; a multiple of the process count, dividing the global batch
  c.shuffle_buffer = 1000  # documents per shuffle block (rows are built and shuffled per block)
  # Processes building and masking examples (~1 core each); 0 builds them in the training process (about
  # one core), -1 starts one per core this process may use. Same batches for any value; at most this
  # host's shard count are used.
  c.num_workers = 0
  # A tf.data service dispatcher ("grpc://host:port") whose workers build the input (data.format=bert_tfrecord);
  # "": build it in this process.
  c.service_address = ""
  c.seed = 0
  c.update(overrides)
  return c


def train_config(**fields) -> ml_collections.ConfigDict:
  """The `train` block every job shares, with `fields` (a job's own fields among them) set; the meaning
  and allowed values of each shared field: bert_jax/config_schema.py (its table: docs/reference/configuration.md)."""
  c = ml_collections.ConfigDict({"batch_size": 32, "grad_accum_steps": 1, "grad_reduce_dtype": "float32",
                                 "num_steps": 0, "seed": 0,
                                 "log_every_steps": 50, "eval_every_steps": 0, "eval_batch_size": 0,
                                 "tensorboard": True, "wandb": "", "skip_nonfinite_steps": 0, "restart": False})
  c.update(fields)
  return c


def optimizer_config(**fields) -> ml_collections.ConfigDict:
  """The `optimizer` block every job shares (bert_jax/config_schema.py), with `fields` set."""
  c = ml_collections.ConfigDict({"learning_rate": 1e-4, "warmup_steps": 0, "warmup_ratio": 0.0, "decay": "linear",
                                 "decay_power": 1.0, "end_learning_rate": 0.0, "b1": 0.9, "b2": 0.999, "eps": 1e-6,
                                 "weight_decay": 0.01, "clip_norm": 1.0, "decay_steps": 0, "decay_start": -1})
  c.update(fields)
  return c


def checkpoint_config(**fields) -> ml_collections.ConfigDict:
  """The `checkpoint` block every job shares (bert_jax/config_schema.py), with `fields` set."""
  c = ml_collections.ConfigDict({"every_steps": 0, "keep": 1, "async_save": False})
  c.update(fields)
  return c


def base_config() -> ml_collections.ConfigDict:
  """A complete pretraining config with BERT-base numbers; family files override what differs."""
  c = ml_collections.ConfigDict()
  c.job = "pretrain"  # the job kind (bert_jax/jobs.py); `bert-jax pretrain` runs it
  c.objective = "bert"  # bert (MLM + nsp/sop/none)
  c.model = model_config()
  c.data = data_config()

  # Batch-size warmup (train.batch_warmup_*; bert_jax/training/batch_warmup.py) and the warmup-stable-decay
  # schedule (optimizer.decay='1-sqrt'): off here, on in configs/modernbert.py
  c.train = train_config(num_steps=1_000_000, batch_size=256, log_every_steps=100, eval_every_steps=10_000,
                         eval_steps=20, eval_at_start=False, batch_warmup_steps=0, batch_warmup_start=1.0)
  c.optimizer = optimizer_config(name="adamw", learning_rate=1e-4, warmup_steps=10_000)  # adamw | lamb | stable_adamw
  c.checkpoint = checkpoint_config(every_steps=5_000, keep=3, async_save=True)

  c.mesh = mesh_config()

  c.init_from = ""
  return c


def mesh_config() -> ml_collections.ConfigDict:
  """The `mesh` block every job shares: all devices on the data axis, the logical axis rules, and sequence
  sharding (`tensor` splits each row's tokens instead of the weights: training/partitioning.py) off."""
  return ml_collections.ConfigDict({"data": -1, "fsdp": 1, "tensor": 1, "rules": LOGICAL_AXIS_RULES,
                                    "shard_sequence": False})


def check_preset(name: str, presets: dict) -> None:
  """KeyError naming the file's presets (config_utils turns it into one line) for a name not among them."""
  if name not in presets:
    raise KeyError(f"choose one of {list(presets)} (`bert-jax presets` says what each is for)")


def sized_config(sizes: dict, size: str) -> ml_collections.ConfigDict:
  """base_config() with the model dimensions of `sizes[size]`: (layers, hidden, heads, intermediate, ...)."""
  layers, hidden, heads, intermediate = sizes[size][:4]
  c = base_config()
  c.model.update(num_layers=layers, hidden_size=hidden, num_heads=heads, intermediate_size=intermediate)
  # Up to 8 layers, unroll the scanned loop: faster steps (BENCHMARKS.md) for a compile that stays short.
  c.model.scan_unroll = layers if layers <= 8 else 1
  return c


def on_embedded_corpus(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """What every family's `tiny` preset shares: the embedded vocabulary (at most 8,192 entries), a progress
  line every 50 steps, a 4-batch evaluation and a checkpoint every 500."""
  c.model.vocab_size = 8192
  c.train.update(log_every_steps=50, eval_every_steps=500, eval_steps=4)
  c.checkpoint.every_steps = 500
  return c
