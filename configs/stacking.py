"""Progressive stacking (Gong et al. 2019): BERT-base trained as 3 -> 6 -> 12 layers.

Each stage trains, then `bert-jax grow` doubles its depth (layer i + L starts as a copy of layer i) into
the params checkpoint the next stage starts from:

  bert-jax pretrain --config configs/stacking.py:stage1 --workdir runs/stacking/stage1 $DATA
  bert-jax grow --from runs/stacking/stage1 --to runs/stacking/stage1-grown
  bert-jax pretrain --config configs/stacking.py:stage2 --workdir runs/stacking/stage2 $DATA
  bert-jax grow --from runs/stacking/stage2 --to runs/stacking/stage2-grown
  bert-jax pretrain --config configs/stacking.py:stage3 --workdir runs/stacking/stage3 $DATA

with DATA='--config.data.corpus=gs://b/wiki/*.txt --config.data.vocab=gs://b/vocab.txt'.

stage1: 3 layers, fresh init (init_from "").
stage2: 6 layers, init_from "runs/stacking/stage1-grown" (stage 1 stacked on itself).
stage3: 12 layers, init_from "runs/stacking/stage2-grown" (stage 2 stacked on itself).
Override `--config.init_from` when the runs live elsewhere. Steps per stage follow the paper's BERT-base
run (50k, 70k and 280k: 400k in all); every stage uses BERT's recipe otherwise (configs/bert.py:base),
with a fresh optimizer and warm-up.

`tiny` (= `tiny-stage1`), `tiny-stage2`, `tiny-stage3`: the same three stages at `demo` size (hidden 128,
1 -> 2 -> 4 layers) on the embedded corpus, 400 + 400 + 800 steps, in runs/stacking-tiny/ (no $DATA).
"""
from bert_jax.configs import bert, common

# name: (bert.py preset, layers, steps, init_from)
STAGES = {
    "stage1": ("base", 3, 50_000, ""),
    "stage2": ("base", 6, 70_000, "runs/stacking/stage1-grown"),
    "stage3": ("base", 12, 280_000, "runs/stacking/stage2-grown"),
    "tiny-stage1": ("demo", 1, 400, ""),
    "tiny-stage2": ("demo", 2, 400, "runs/stacking-tiny/stage1-grown"),
    "tiny-stage3": ("demo", 4, 800, "runs/stacking-tiny/stage2-grown"),
}
PRESETS = {
    "stage1": "progressive stacking of BERT-base (Gong et al. 2019): 3 layers from scratch, 50k steps",
    "stage2": "6 layers from stage 1 grown (bert-jax grow), 70k steps",
    "stage3": "12 layers from stage 2 grown, 280k steps",
    "tiny-stage1": "the same three stages at demo size on the embedded corpus: 1 layer, 400 steps",
    "tiny-stage2": "2 layers from tiny-stage1 grown, 400 steps",
    "tiny-stage3": "4 layers from tiny-stage2 grown, 800 steps",
    "tiny": "the same as tiny-stage1",
}


def get_config(arg: str = "stage1"):
  common.check_preset(arg, PRESETS)
  arg = "tiny-stage1" if arg == "tiny" else arg
  preset, layers, steps, init_from = STAGES[arg]
  c = bert.get_config(preset)
  c.model.num_layers = layers
  c.model.scan_unroll = layers if layers <= 8 else 1  # as configs/common.py:sized_config
  c.train.num_steps = steps
  c.init_from = init_from
  return c
