"""MobileBERT pretraining configs (Sun et al. 2020): MLM + NSP on the MobileBERT network.

  bert-jax pretrain --config configs/mobilebert.py:tiny --workdir runs/mobilebert-tiny   # laptop, embedded corpus
  bert-jax pretrain --config configs/mobilebert.py:base --workdir gs://b/mobilebert \
      --config.data.corpus='gs://b/text/*.txt' --config.data.vocab=gs://b/vocab.txt

The model (bert_jax/models/mobilebert.py): 24 layers carrying 512 between them, each a 128-wide body
behind linear bottlenecks, 4 stacked feed-forward networks (intermediate 512), NoNorm, ReLU, 4 heads,
128-wide token embeddings read as trigrams; `base` is google/mobilebert-uncased's shape, 24.8M backbone
parameters (the paper's 25.3M). Data: BERT's uncased 30,522-entry WordPiece vocabulary, NSP rows.

This trains MobileBERT directly with MLM + NSP, with LAMB at the paper's batch of 4096; the paper instead
transfers knowledge layer by layer from an inverted-bottleneck BERT-large teacher (IB-BERT), which is not
here. `bert-jax convert --from hf` reads the released checkpoint (google/mobilebert-uncased) and its
fine-tuned heads; `tiny` trains on the embedded corpus and its WordPiece vocabulary.
"""
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
PRESETS = {
    "tiny": "a 4-layer MobileBERT (2 stacked FFNs) on the embedded corpus; minutes on a CPU",
    "base": "MobileBERT (Sun et al. 2020), 24 bottlenecked layers, 24.8M parameters: MLM + NSP with LAMB, "
            "batch 4096 (no teacher)",
}


def model_config(size: str):
  """The model section: MobileBertConfig's fields (and meaning) with `size`'s dimensions."""
  layers, hidden, heads, intermediate, embedding, bottleneck, ffns = SIZES[size]
  c = common.model_config_of(MobileBertConfig)
  c.update(num_layers=layers, hidden_size=hidden, num_heads=heads, intermediate_size=intermediate,
           embedding_size=embedding, intra_bottleneck_size=bottleneck, num_feedforward_networks=ffns,
           scan_unroll=layers if layers <= 8 else 1)
  return c


def get_config(arg: str = "base"):
  common.check_preset(arg, PRESETS)
  c = common.base_config()
  c.model = model_config(arg)
  lr, batch, steps, warmup, length, predictions = RECIPES[arg]
  c.data.update(example_builder="nsp", max_seq_length=length, max_predictions_per_seq=predictions)
  c.optimizer.update(name="lamb", learning_rate=lr, warmup_steps=warmup, weight_decay=0.01)
  c.train.update(batch_size=batch, num_steps=steps)
  if arg == "tiny":
    common.on_embedded_corpus(c)
  return c
