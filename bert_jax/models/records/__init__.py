"""The family records, one module each; importing one registers its family (bert_jax.models.families).

bert_layout.py holds what BertModel's four families share (its rows, heads and config translation).
Registration order is the order errors list the families in.
"""
# pylint: disable=unused-import
from bert_jax.models.records import bert  # noqa: F401
from bert_jax.models.records import roberta  # noqa: F401
from bert_jax.models.records import albert  # noqa: F401
from bert_jax.models.records import electra  # noqa: F401
