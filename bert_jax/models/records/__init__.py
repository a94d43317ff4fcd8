"""The family records, one module each; importing one registers its family (bert_jax.models.families).

Every module in this folder is imported here, so a new family is its record file and nothing else to
edit; bert_layout.py holds what BertModel's four families share (its rows, heads and config
translation) and registers none. BERT comes first and the rest by name: the order errors list them in.
"""
from __future__ import annotations

import importlib
import pkgutil

from bert_jax.models.records import bert  # noqa: F401  (the default family, listed first)

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
  importlib.import_module(f"{__name__}.{_module}")
