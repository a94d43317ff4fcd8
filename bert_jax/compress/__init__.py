"""Model compression: task-specific knowledge distillation (distill.py)."""
from bert_jax import startup
startup.configure()  # before jax loads (bert_jax/startup.py: libtpu stays quiet where there is no TPU)
