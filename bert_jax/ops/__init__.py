"""Numerical pieces that several layers share and that belong to no job: finite checks of parameter
trees (finite.py), int8 weights and int8 matmuls (int8.py), knowledge-distillation losses
(distill_losses.py). They import nothing of bert_jax but bert_jax.errors, so params checkpoints,
objectives, fine-tuning and the compression jobs all build on them without a loop."""
from bert_jax import startup
startup.configure()  # before jax loads (bert_jax/startup.py: libtpu stays quiet where there is no TPU)
