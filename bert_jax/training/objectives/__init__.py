"""Pretraining objectives: the Objective protocol and loss helpers (base.py), one module per objective
(bert.py, electra.py, spanbert.py, structbert.py), and the registry that builds the one a config names
(registry.py)."""
from bert_jax.training.objectives import bert, electra, spanbert, structbert  # noqa: F401  (each registers itself)
from bert_jax.training.objectives.base import example_batch, model_inputs, token_nll_and_correct  # noqa: F401
from bert_jax.training.objectives.registry import make_objective  # noqa: F401
