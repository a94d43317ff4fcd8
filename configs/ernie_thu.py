"""ERNIE-THU pretraining configs (Zhang et al. 2019, "ERNIE: Enhanced Language Representation with Informative
Entities"): `objective="ernie_thu"`.

  bert-jax pretrain --config configs/ernie_thu.py:base --workdir runs/ernie-thu \
      --config.data.corpus='text/*.txt' --config.data.vocab=vocab.txt \
      --config.ernie_thu.entity_embeddings=transe.npy --config.ernie_thu.mentions=mentions.tsv

BERT's encoder whose top model.entity_layers layers fuse the tokens with frozen entity vectors
(models/bert.py:KnowledgeLayer), trained with the masked LM, NSP and the denoising entity auto-encoder
(training/objectives/ernie_thu.py). The entities: ernie_thu.entity_embeddings, a .npy [entities, model.entity_dim]
(e.g. TransE vectors; frozen, not in the checkpoints), and ernie_thu.mentions, `surface<TAB>row` lines matched in
the text (data_pipelines/entities.py). "embedded" for both (the `tiny` preset): a toy knowledge graph of the
embedded corpus's most frequent content words with random vectors, to run the pipeline, not to learn facts.
Paper (section 4.4/5, as recalled here, not re-checked: verify before a long run): N = 6 text and M = 6 fusion
layers of BERT-base, TransE vectors of width 100, 4 entity heads, dEA 5% replaced / 15% masked, initialised from
BERT-base, lr 5e-5, batch 512, one epoch over Wikipedia.
"""
import ml_collections

from bert_jax.configs import bert, common

SIZES = {k: bert.SIZES[k] for k in ("tiny", "base")}
PRESETS = {
    "tiny": "2 layers (1 fused) on the embedded corpus and a toy entity graph with random vectors",
    "base": "ERNIE-THU (Zhang et al. 2019): BERT-base, the top 6 layers fused with 100-wide entity vectors",
}


def get_config(arg: str = "base"):
  common.check_preset(arg, PRESETS)
  c = common.sized_config(SIZES, arg)
  c.objective = "ernie_thu"
  c.model.update(entity_layers=6, entity_dim=100, entity_heads=4, entity_fusion="paper")
  c.ernie_thu = ml_collections.ConfigDict({"entity_embeddings": "", "mentions": "", "max_entities": 32,
                                           "dea_replace": 0.05, "dea_mask": 0.15})
  c.optimizer.update(learning_rate=5e-5, warmup_steps=1_000)
  c.train.update(batch_size=512)
  if arg == "tiny":
    common.on_embedded_corpus(c)
    c.model.update(entity_layers=1, entity_dim=32, entity_heads=2)
    c.ernie_thu.update(entity_embeddings="embedded", mentions="embedded", max_entities=16)
    c.data.update(max_seq_length=128)
    c.optimizer.update(learning_rate=1e-3, warmup_steps=100)
    c.train.update(batch_size=32, num_steps=1000)
  return c
