"""The objective registry: a module that registers a factory is what `objective=NAME` builds."""
import pytest

from bert_jax.config_utils import load_config
from bert_jax.errors import UserError
from bert_jax.training import objectives
from bert_jax.training.objectives import registry


def test_a_registered_objective_is_built_and_unknown_names_list_the_known_ones(monkeypatch):
  monkeypatch.setattr(registry, "_FACTORIES", dict(registry._FACTORIES))  # pylint: disable=protected-access

  @registry.register("toy")
  def toy(config, model_config):
    return config.objective, model_config.hidden_size

  assert objectives.make_objective(load_config("configs/bert.py:tiny", ["--config.objective=toy"])) == ("toy", 128)
  built = objectives.make_objective(load_config("configs/spanbert.py:base"))
  assert type(built).__name__ == "SpanBertPretraining" and built.config.hidden_size == 768
  built = objectives.make_objective(load_config("configs/structbert.py:large"))
  assert type(built).__name__ == "StructBertPretraining" and built.config.hidden_size == 1024
  with pytest.raises(UserError, match=r"objective='nope' is not one of \('bert', 'electra', 'deberta_rtd', 'distill_mlm', 'ernie2', "
                     r"'ernie_thu', 'ltr', 'mobilebert_pkt', 'span_corruption', 'spanbert', 'structbert', 'xlnet', "
                     r"'toy'\)"):
    objectives.make_objective(load_config("configs/bert.py:tiny", ["--config.objective=nope"]))
  with pytest.raises(ValueError, match="'bert' is registered twice"):
    registry.register("bert")(toy)
