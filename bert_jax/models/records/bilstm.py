"""The BiLSTM student (Tang et al. 2019; bert_jax/models/bilstm.py): a family of bert_jax's own.

No Hugging Face or TF layout: transformers has no such model, so `convert --to hf` refuses it in one line;
its workdirs fine-tune, distil, predict and convert between bert_jax workdirs as every family's do. Its
one summary head is the ReLU layer over the final states (`use_pooler`).
"""
from __future__ import annotations

from bert_jax.models import families
from bert_jax.models.bilstm import BiLSTMConfig, BiLSTMModel, parameter_count

FAMILY = families.register(families.Family(
    name="bilstm", config=BiLSTMConfig, module=BiLSTMModel, heads=("pooler",),
    heads_of=lambda config: ("pooler",) if config.use_pooler else (),
    with_heads=lambda config, heads: config.replace(use_pooler="pooler" in set(heads)),
    pretrained_heads=lambda present: (), tokenizer="wordpiece",
    layout=families.Layout(global_rows=(), layer_rows=(), parts=lambda config: frozenset({"backbone"}),
                           layer_slots=lambda config: []),
    backbone_params=parameter_count, layer_losses=False))
