"""TPU pod slices from this machine: Cloud TPU names (slices), the steps compiled for a slice (aot), and
what a compiled program communicates (hlo)."""
from bert_jax import startup
startup.configure()  # before jax loads (bert_jax/startup.py: libtpu stays quiet where there is no TPU)
