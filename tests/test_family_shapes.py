"""Golden parameter shapes per family preset (catches renames; checked with jax.eval_shape, nothing
allocated) and num_params (the backbone: embeddings + encoder (+ pooler)) against the published sizes
and against the same architecture built by HF transformers on torch's meta device."""
import functools
import json
import math
import pathlib

import flax.linen as nn
import jax
import pytest
import torch
import transformers

from bert_jax.config_utils import load_config
from bert_jax.training import objectives

# preset (with overrides): {parameter path: shape}
GOLDEN_FILE = pathlib.Path(__file__).parent / "testdata" / "family_shapes.json"
GOLDEN = {spec: {path: tuple(shape) for path, shape in shapes.items()}
          for spec, shapes in json.loads(GOLDEN_FILE.read_text()).items()}

# preset: (published backbone size, how the paper/model card states it)
PUBLISHED = {
    "configs/roberta.py:base": 125e6, "configs/roberta.py:large": 355e6,
    "configs/albert.py:base": 12e6, "configs/albert.py:large": 18e6, "configs/albert.py:xlarge": 60e6,
    "configs/albert.py:xxlarge": 235e6,
    "configs/electra.py:small": 14e6, "configs/electra.py:base": 110e6, "configs/electra.py:large": 335e6,
    "configs/spanbert.py:base": 110e6, "configs/spanbert.py:large": 340e6,
    "configs/structbert.py:base": 110e6, "configs/structbert.py:large": 340e6,
    "configs/ernie.py:base": 110e6, "configs/ernie.py:large": 340e6,  # BERT's, plus a task embedding per task
}
# The ALBERT paper's 235M for xxlarge is not reproducible from its stated sizes (H=4096, E=128, FFN
# 16384, V=30000, all shared): the released checkpoint (and HF's model card) has 223M, -5.3%.
TOLERANCE = {"configs/albert.py:xxlarge": 0.06}


def abstract_params(spec):
  path, *overrides = spec.split()
  objective = objectives.make_objective(load_config(path, overrides))
  init = functools.partial(objective.init, batch=objectives.example_batch(1, 8, 2))
  return objective, nn.meta.unbox(jax.eval_shape(init, jax.random.key(0)))


@pytest.mark.parametrize("spec", sorted(GOLDEN))
def test_parameter_shapes(spec):
  _, params = abstract_params(spec)
  got = {jax.tree_util.keystr(k): tuple(v.shape) for k, v in jax.tree_util.tree_leaves_with_path(params)}
  assert got == GOLDEN[spec]


def num_params(spec):
  objective, params = abstract_params(spec)
  return sum(math.prod(x.shape) for x in jax.tree.leaves(objective.backbone(params)))


def hf_backbone(spec):
  """The same backbone as HF builds it (torch meta device: shapes only)."""
  config = load_config(spec).model
  family = spec.split("/")[1].split(".")[0]
  common = dict(vocab_size=config.vocab_size, hidden_size=config.hidden_size,
                num_hidden_layers=config.num_layers, num_attention_heads=config.num_heads,
                intermediate_size=config.intermediate_size,
                max_position_embeddings=config.max_position_embeddings,
                type_vocab_size=config.type_vocab_size)
  with torch.device("meta"):
    if family == "roberta":
      return transformers.RobertaModel(transformers.RobertaConfig(pad_token_id=1, **common),
                                       add_pooling_layer=False)
    if family == "albert":
      return transformers.AlbertModel(transformers.AlbertConfig(embedding_size=config.embedding_size, **common))
    if family == "electra":
      return transformers.ElectraModel(transformers.ElectraConfig(embedding_size=config.embedding_size,
                                                                  **common))
    if family == "ernie":  # ERNIE 2.0's task embeddings: HF's ErnieModel with use_task_id
      return transformers.ErnieModel(transformers.ErnieConfig(use_task_id=True, task_type_vocab_size=config.num_tasks,
                                                              **common))
    return transformers.BertModel(transformers.BertConfig(**common), add_pooling_layer=config.use_pooler)


@pytest.mark.parametrize("spec", sorted(PUBLISHED))
def test_num_params_match_published_and_hf(spec):
  n = num_params(spec)
  assert abs(n / PUBLISHED[spec] - 1) < TOLERANCE.get(spec, 0.04), n
  assert n == sum(p.numel() for p in hf_backbone(spec).parameters())
