"""Pretraining objectives: the Objective protocol and loss helpers (base.py), one module per objective
(bert.py, electra.py, ernie2.py, ernie_thu.py, ltr.py, spanbert.py, structbert.py, xlnet.py; distill_mlm.py: general distillation from a frozen
teacher; mobilebert_pkt.py: MobileBERT's progressive knowledge transfer from IB-BERT), and the registry that
builds the one a config names (registry.py)."""
from bert_jax.training.objectives import (bert, deberta_rtd, distill_mlm, electra, ernie2, ernie_thu,  # noqa: F401
                                          ltr, mobilebert_pkt, span_corruption, spanbert, structbert,  # each registers itself
                                          xlnet)
from bert_jax.training.objectives.base import (CARRY, CarryingObjective, ScheduledObjective,  # noqa: F401
                                               StagedObjective, TeacherObjective, example_batch, model_inputs,
                                               token_nll_and_correct)
from bert_jax.training.objectives.registry import make_objective  # noqa: F401
