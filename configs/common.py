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


def model_config(**overrides) -> ml_collections.ConfigDict:
  """The encoder's fields with ModelConfig's defaults (BERT-base); see bert_jax/models/config.py for
  their meaning."""
  c = ml_collections.ConfigDict({f.name: f.default for f in dataclasses.fields(ModelConfig)
                                 if f.name not in SET_BY_JOBS})
  c.update(overrides)
  return c


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
  c.eval_fraction = 0.02
  c.vocab = ""  # vocab.txt (WordPiece) or *.model (SentencePiece); "" : the embedded vocabulary
  c.tokenizer = "wordpiece"  # wordpiece | sentencepiece; must match the vocab file
  c.lower_case = True
  c.max_seq_length = 128
  c.max_predictions_per_seq = 20
  c.mask_rate = 0.15
  c.masking = "token"  # token | whole_word | ngram | span
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


def base_config() -> ml_collections.ConfigDict:
  """A complete pretraining config with BERT-base numbers; family files override what differs."""
  c = ml_collections.ConfigDict()
  c.objective = "bert"  # bert (MLM + nsp/sop/none)
  c.model = model_config()
  c.data = data_config()

  c.train = ml_collections.ConfigDict()
  c.train.batch_size = 256  # global, over all hosts and micro-batches
  c.train.grad_accum_steps = 1
  # float32 | bfloat16: the dtype the gradients cross devices in, once per step (MLPerf TPU BERT: bfloat16)
  c.train.grad_reduce_dtype = "float32"
  c.train.num_steps = 1_000_000
  c.train.seed = 0
  c.train.log_every_steps = 100
  c.train.eval_every_steps = 10_000
  c.train.eval_steps = 20
  c.train.eval_batch_size = 0  # 0: same as batch_size
  c.train.tensorboard = True  # TensorBoard event files in the workdir (metrics.jsonl is always written)
  # N > 0: skip up to N updates whose loss or gradient norm is not finite (each one printed), then stop
  c.train.skip_nonfinite_steps = 0

  c.optimizer = ml_collections.ConfigDict()
  c.optimizer.name = "adamw"  # adamw | lamb
  c.optimizer.learning_rate = 1e-4
  c.optimizer.warmup_steps = 10_000
  c.optimizer.decay = "linear"  # linear | polynomial | constant
  c.optimizer.decay_power = 1.0
  c.optimizer.end_learning_rate = 0.0
  c.optimizer.b1 = 0.9
  c.optimizer.b2 = 0.999
  c.optimizer.eps = 1e-6
  c.optimizer.weight_decay = 0.01
  c.optimizer.clip_norm = 1.0

  c.checkpoint = ml_collections.ConfigDict()
  c.checkpoint.every_steps = 5_000
  c.checkpoint.keep = 3
  c.checkpoint.async_save = True

  c.mesh = ml_collections.ConfigDict()
  c.mesh.data = -1
  c.mesh.fsdp = 1
  c.mesh.tensor = 1
  c.mesh.rules = LOGICAL_AXIS_RULES

  c.init_from = ""
  return c


def sized_config(sizes: dict, size: str, other_presets: tuple = ()) -> ml_collections.ConfigDict:
  """base_config() with the model dimensions of `sizes[size]`: (layers, hidden, heads, intermediate, ...)."""
  if size not in sizes:
    raise KeyError(f"choose one of {sorted(sizes) + list(other_presets)}")
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
