"""Text-to-text fine-tuning of T5 (the `seq2seq` job, bert_jax/finetune/seq2seq.py): T5's recipe (Raffel et al.
2020): Adafactor at a constant 1e-3, dropout 0.1, greedy decoding, exact match of the generated strings.

  bert-jax finetune --config configs/t5_finetune.py:sst2 --config.init_from=runs/t5-tiny \
      --config.data.data_dir=glue/SST-2 --workdir runs/t5-sst2     # "sst2 sentence: ..." -> "positive"
  bert-jax finetune --config configs/t5_finetune.py:files --config.init_from=path/to/hf-t5 \
      --config.data.train_source=train.src --config.data.train_target=train.tgt \
      --config.data.dev_source=dev.src --config.data.dev_target=dev.tgt --workdir runs/t5-files
  bert-jax finetune --config configs/t5_finetune.py:embedded --config.init_from=runs/t5-tiny --workdir runs/t5-wo
  bert-jax predict --model runs/t5-sst2 --input sources.txt            # one generated string per line
  bert-jax convert --to hf runs/t5-sst2 runs/t5-sst2-hf                # T5ForConditionalGeneration

The model section is used only without init_from (the checkpoint's architecture wins otherwise, but its
dropout is model.dropout): then the T5 starts from random weights. The vocabulary is init_from's, data.vocab,
or (neither) the embedded corpus's T5 SentencePiece model, the one `configs/t5.py:tiny` pretrains with.
"""
import ml_collections

from bert_jax.configs import common, t5

PRESETS = {
    "sst2": "GLUE SST-2 recast as T5 does ('sst2 sentence: ...' -> 'positive'), from data.data_dir or tfds",
    "files": "source and target text files, one example per line (data.train_source, ...)",
    "embedded": "the embedded word-order task recast ('embedded sentence: ...' -> 'original'), offline",
}


def get_config(arg: str = "sst2") -> ml_collections.ConfigDict:
  common.check_preset(arg, PRESETS)
  c = ml_collections.ConfigDict()
  c.job = "seq2seq"  # the job kind (bert_jax/jobs.py); `bert-jax finetune` runs it
  # family: glue (name: a GLUE task) | files | embedded (name: embedded or first_word; num_train, num_dev)
  c.task = ml_collections.ConfigDict({"family": "glue", "name": "sst2", "num_train": 4000, "num_dev": 500})
  c.init_from = ""  # a T5 pretraining workdir, a Hugging Face T5 folder or a seq2seq workdir
  c.model = t5.model_config("tiny")
  c.model.update(vocab_size=4224, dropout=0.1)

  c.data = ml_collections.ConfigDict()
  c.data.data_dir = ""  # task.family=glue: the GLUE task's TSVs; "": tfds
  c.data.tfds_data_dir = ""
  c.data.train_source = ""  # task.family=files: one source per line ...
  c.data.train_target = ""  # ... and its target on the same line here
  c.data.dev_source = ""
  c.data.dev_target = ""
  c.data.vocab = ""  # a T5 spiece.model; "": init_from's (the embedded T5 vocabulary without init_from)
  c.data.lower_case = False
  c.data.max_seq_length = 128  # the encoder's tokens, </s> included (longer sources are cut)
  c.data.max_target_length = 8  # the decoder's tokens, </s> included (a longer target is an error)
  c.data.train_limit = 0  # the first N training pairs (0: all)
  c.data.eval_limit = 0
  c.data.strict = False

  c.decode = ml_collections.ConfigDict({"num_beams": 1})  # 1: greedy; > 1: beam search (no length penalty)

  c.optimizer = common.optimizer_config(name="adafactor", learning_rate=1e-3, decay="constant", weight_decay=0.0,
                                        clip_norm=0.0)
  c.train = common.train_config(batch_size=32, epochs=3.0, eval_batch_size=64, eval_every_epochs=1.0,
                                keep_best=True, early_stopping_patience=0)
  c.checkpoint = common.checkpoint_config()
  c.mesh = common.mesh_config()

  if arg == "files":
    c.task.family, c.task.name = "files", "files"
    c.data.max_target_length = 64
  elif arg == "embedded":
    c.task.family, c.task.name = "embedded", "embedded"
    c.data.max_seq_length = 64
    c.train.update(log_every_steps=25)
  return c
