"""A model config's named choices come from the one table of their kind (models/activations.py: activations and
remat policies; models/attention.py: attention backends): every family's config takes each entry there and
refuses anything else in one line naming that table."""
import dataclasses
import re

import pytest

from bert_jax.errors import UserError
from bert_jax.models import activations, attention, families

FIELDS = {"hidden_act": activations.NAMES, "head_act": activations.NAMES, "remat": activations.REMAT,
          "attention": attention.BACKENDS}


@pytest.mark.parametrize("name", families.names())
def test_every_family_config_takes_each_entry_of_the_shared_tables(name):
  config_class = families.get(name).config
  fields = {f.name for f in dataclasses.fields(config_class) if f.init}
  checked = [field for field in FIELDS if field in fields and (name, field) != ("xlnet", "attention")]  # dot's alone
  assert name == "bilstm" or "remat" in checked, name
  for field in checked:
    for value in FIELDS[field] if field != "attention" else ():  # a backend has its own conditions (dropout)
      assert getattr(config_class(**{field: value}), field) == value
    with pytest.raises(UserError, match=re.escape(f"model.{field}='nope' is not one of {FIELDS[field]}")):
      config_class(**{field: "nope"})
