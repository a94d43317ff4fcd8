"""Domain-adaptive continued pretraining (BioBERT, Lee et al. 2019) of any released checkpoint.

  bert-jax pretrain --config configs/continue.py:base --workdir runs/bio \
      --config.init_from=hf/bert-base-cased --config.data.corpus='pubmed/*.txt' \
      --config.data.general_eval_corpus='wiki_heldout/*.txt'

`init_from` is a Hugging Face folder, an original TF checkpoint or a bert_jax checkpoint (converted into
WORKDIR/init_from first, as every init_from is). The run keeps the checkpoint's architecture, tokenizer and
vocabulary, and its MLM head (a checkpoint without one, such as a sentence-transformers model, gets a fresh
one, said in a log line) and its NSP or SOP head where it has one (NSP/SOP rows; else FULL-SENTENCES rows):
bert_jax/pretrained.py:with_init_from_model. The model section's dtype, param_dtype, remat, attention and
scan_unroll are the run's; its other fields are replaced by the checkpoint's. The optimizer starts fresh,
with warmup. The held-out domain set (data.eval_corpus, or data.eval_fraction of data.corpus) is evaluated
at step 0 (the checkpoint as released) and at the end, and data.general_eval_corpus, when set, at the same
steps (general_mlm_loss: forgetting); all in WORKDIR/metrics.jsonl's eval rows. The same command resumes.
To add the domain's frequent words to the vocabulary first: `bert-jax vocab extend CKPT EXT --corpus ...`,
then init_from=EXT.

`base`: BioBERT v1.0 (+PubMed)'s run: batch 192 of 512 tokens, 200k steps, with BERT's optimizer (Adam, lr
1e-4, 10k warmup steps, linear decay). `tiny`: 200 steps on the embedded corpus (Python's own documentation)
for a small checkpoint, minutes on a CPU; the tests' run.
"""
from bert_jax.configs import common

PRESETS = {
    "tiny": "continue init_from on the embedded corpus for 200 steps: a small checkpoint on a CPU, the tests' run",
    "base": "BioBERT (+PubMed)'s continued pretraining (Lee et al. 2019): batch 192 x 512 tokens, 200k steps",
}

# name: (learning rate, batch, steps, warmup, sequence length, predictions per row, eval every, eval batches)
RECIPES = {
    "tiny": (1e-3, 16, 200, 20, 64, 10, 100, 4),
    "base": (1e-4, 192, 200_000, 10_000, 512, 80, 10_000, 20),
}


def get_config(arg: str = "base"):
  common.check_preset(arg, PRESETS)
  c = common.base_config()
  c.init_from_model = True  # the architecture, heads and tokenizer are init_from's (the model section: placeholders)
  lr, batch, steps, warmup, seq, predictions, eval_every, eval_steps = RECIPES[arg]
  c.optimizer.update(learning_rate=lr, warmup_steps=warmup)
  c.train.update(batch_size=batch, num_steps=steps, eval_every_steps=eval_every, eval_steps=eval_steps,
                 eval_at_start=True)
  c.data.update(max_seq_length=seq, max_predictions_per_seq=predictions)
  if arg == "tiny":
    c.train.log_every_steps = 20
    c.checkpoint.every_steps = 100
  return c
