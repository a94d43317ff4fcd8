"""Distillation configs: a fine-tuning config (configs/glue.py) plus the `distill` section.

  bert-jax distill --config configs/distill.py:embedded --config.distill.teacher=runs/demo-ft \
      --config.distill.student_layers=every_other --workdir runs/demo-distilled
  bert-jax distill --config configs/distill.py:sst2 --config.distill.teacher=runs/sst2 \
      --config.model.num_layers=4 --config.model.hidden_size=312 --config.distill.hidden_weight=1 ...

The student is `distill.student_layers` of the teacher ("every_other": DistilBERT's init) or, with it
empty, the architecture of config.model (or of init_from). Loss weights of 0 switch a loss off.
"""
import ml_collections

from bert_jax.configs import glue


def get_config(arg: str = "embedded"):
  c = glue.get_config(arg)
  c.distill = ml_collections.ConfigDict()
  c.distill.teacher = ""  # a fine-tuning workdir of the same task
  c.distill.student_layers = ""  # "" (config.model) | "every_other" | teacher layer indices "0,2,4"
  c.distill.temperature = 2.0  # soft targets: softmax(logits / T), the KL scaled by T^2
  c.distill.hard_weight = 1.0  # cross-entropy with the labels (squared error for regression)
  c.distill.soft_weight = 1.0  # KL to the teacher's soft targets (DistilBERT, Hinton et al.)
  c.distill.hidden_weight = 0.0  # hidden-state MSE over the layer map (TinyBERT)
  c.distill.attention_weight = 0.0  # attention-map MSE over the layer map (TinyBERT; same head count)
  c.distill.pkd_weight = 0.0  # normalised [CLS] MSE of the intermediate layers (BERT-PKD)
  c.distill.projection = True  # a learned student -> teacher width map where the widths differ
  return c
