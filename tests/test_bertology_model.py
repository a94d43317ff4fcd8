"""Attention probabilities, head masks and pruned heads in the model, against transformers' PyTorch eager
attention with the same weights, and pruned == head-masked."""
import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import bert_jax  # noqa: E402
from core_helpers import random_like  # noqa: E402
from bert_jax.conversion import hf  # noqa: E402
from bert_jax.conversion.params import relayout  # noqa: E402
from bert_jax.errors import UserError  # noqa: E402
from bert_jax.models import attention, bert  # noqa: E402
from bert_jax.models.config import ModelConfig  # noqa: E402
from bert_jax.training import prune  # noqa: E402

TOL = 1e-5
SIZES = dict(vocab_size=100, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=37,
             hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, max_position_embeddings=64)
MASK = np.array([[1.0, 0.0, 0.5, 1.0], [0.0, 1.0, 1.0, 0.25], [1.0, 1.0, 0.0, 0.0]], np.float32)


def build_hf(family):
  torch.manual_seed(0)
  if family == "albert":
    config = transformers.AlbertConfig(embedding_size=16, **SIZES)
    model = transformers.AlbertModel(config, add_pooling_layer=False)
  else:
    model = transformers.BertModel(transformers.BertConfig(**SIZES), add_pooling_layer=False)
  model.config._attn_implementation = "eager"  # pylint: disable=protected-access
  with torch.no_grad():  # non-trivial biases and LayerNorms, so a swapped tensor shows
    for name, p in model.named_parameters():
      if name.endswith("bias") or "LayerNorm" in name:
        p.add_(torch.randn_like(p) * 0.1)
  return model.eval()


def inputs():
  rng = np.random.RandomState(1)
  lengths = np.array([9, 5, 7])
  mask = (np.arange(9)[None] < lengths[:, None]).astype(np.int64)
  return np.where(mask, rng.randint(3, 100, (3, 9)), 0), mask


def hf_reference(monkeypatch, model, family, ids, mask, head_mask):
  """transformers' eager attention, its probabilities multiplied by head_mask[layer] (the calls of one
  forward pass go through the layers in order, also ALBERT's shared one)."""
  module = transformers.models.albert.modeling_albert if family == "albert" else \
      transformers.models.bert.modeling_bert
  original, calls, probabilities = module.eager_attention_forward, [], []

  def masked(self, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    layer = len(calls) % model.config.num_hidden_layers
    calls.append(layer)
    weights = torch.softmax(torch.matmul(query, key.transpose(2, 3)) * scaling + attention_mask, dim=-1)
    probabilities.append(weights.detach().numpy())
    if head_mask is not None:
      weights = weights * torch.tensor(head_mask[layer])[None, :, None, None]
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights

  monkeypatch.setattr(module, "eager_attention_forward", masked)
  with torch.no_grad():
    out = model(torch.tensor(ids), attention_mask=torch.tensor(mask))
  monkeypatch.setattr(module, "eager_attention_forward", original)
  assert calls == list(range(model.config.num_hidden_layers))
  return out.last_hidden_state.numpy(), np.stack(probabilities)


@pytest.mark.parametrize("family,scan_layers", [("bert", True), ("bert", False), ("albert", True)])
def test_attentions_and_head_mask_match_transformers(tmp_path, monkeypatch, family, scan_layers):
  hf_model = build_hf(family)
  hf_model.save_pretrained(tmp_path)
  ids, mask = inputs()
  with torch.no_grad():  # transformers' own attentions output, unpatched
    hf_attentions = np.stack([a.numpy() for a in hf_model(torch.tensor(ids), attention_mask=torch.tensor(mask),
                                                          output_attentions=True).attentions])
  model, params = bert_jax.load_pretrained(str(tmp_path), scan_layers=scan_layers)
  plain = model.apply({"params": params}, ids, mask, output_attentions=True)
  assert plain.attentions.shape == (3, 3, 4, 9, 9) and plain.attentions.dtype == jnp.float32
  np.testing.assert_allclose(plain.attentions, hf_attentions, atol=TOL)
  hidden, probabilities = hf_reference(monkeypatch, hf_model, family, ids, mask, MASK)
  masked = model.apply({"params": params}, ids, mask, head_mask=MASK, output_attentions=True)
  np.testing.assert_allclose(masked.last_hidden_state, hidden, atol=TOL)
  np.testing.assert_allclose(masked.attentions, probabilities, atol=TOL)  # before the head mask
  unmasked_hidden, _ = hf_reference(monkeypatch, hf_model, family, ids, mask, None)
  assert np.abs(unmasked_hidden - hidden).max() > 1e-2  # the mask matters
  np.testing.assert_allclose(model.apply({"params": params}, ids, mask).last_hidden_state, unmasked_hidden,
                             atol=TOL)


def tiny(**overrides):
  config = ModelConfig(vocab_size=100, hidden_size=32, num_layers=3, num_heads=4, intermediate_size=37,
                       max_position_embeddings=16, hidden_dropout=0.0, attention_dropout=0.0, **overrides)
  ids = jnp.asarray(inputs()[0])
  # NumPy weights of the init's shapes (N(0, 0.1), LayerNorm scales 1 + N(0, 0.1)): these tests compare the
  # model with itself, and the init, run eagerly, compiled each of its many RNG ops on its own (~5 s)
  abstract = nn.meta.unbox(jax.eval_shape(bert.BertModel(config).init, jax.random.key(0), ids)["params"])
  return config, random_like(abstract)


def test_head_mask_of_one_row_is_every_layer_and_differentiable():
  config, params = tiny()
  ids, mask = inputs()
  model = bert.BertModel(config)
  row = model.apply({"params": params}, ids, mask, head_mask=MASK[0]).last_hidden_state
  full = model.apply({"params": params}, ids, mask, head_mask=np.tile(MASK[0], (3, 1))).last_hidden_state
  np.testing.assert_array_equal(row, full)
  with pytest.raises(ValueError, match="head_mask must be"):
    model.apply({"params": params}, ids, mask, head_mask=np.ones((2, 4)))
  grad = jax.grad(lambda m: jnp.sum(model.apply({"params": params}, ids, mask, head_mask=m).last_hidden_state[
      ..., 0]))(jnp.ones((3, 4)))
  assert grad.shape == (3, 4) and np.all(np.abs(grad) > 0)


def test_fast_path_stays_the_default(monkeypatch):
  config, params = tiny(scan_layers=False)
  ids, mask = inputs()
  calls = []  # inference's fast path: heads-first attention, no probabilities kept
  fast = attention.attend_heads_first
  monkeypatch.setattr(attention, "attend_heads_first", lambda *a, **k: calls.append(1) or fast(*a, **k))
  model = bert.BertModel(config)
  plain = model.apply({"params": params}, ids, mask).last_hidden_state
  assert len(calls) == 3
  explicit = model.apply({"params": params}, ids, mask, output_attentions=True)
  assert len(calls) == 3 and plain.shape == explicit.last_hidden_state.shape
  np.testing.assert_allclose(plain, explicit.last_hidden_state, atol=TOL)


@pytest.mark.parametrize("scan_layers", [True, False])
def test_pruned_model_equals_head_masked(scan_layers):
  config, params = tiny(scan_layers=scan_layers)
  ids, mask = inputs()
  heads = {0: [1, 3], 2: [0]}
  pruned, pruned_config = prune.prune_params(params, config, heads)
  assert pruned_config.pruned_heads == ((1, 3), (), (0,)) and not pruned_config.scan_layers
  assert pruned["encoder"]["layer_0"]["attention"]["query"]["kernel"].shape == (32, 2, 8)
  assert pruned["encoder"]["layer_0"]["attention"]["out"]["kernel"].shape == (2, 8, 32)
  head_mask = np.ones((3, 4), np.float32)
  head_mask[0, [1, 3]] = head_mask[2, 0] = 0
  masked = bert.BertModel(config).apply({"params": params}, ids, mask, head_mask=head_mask, output_attentions=True)
  out = bert.BertModel(pruned_config).apply({"params": pruned}, ids, mask, output_attentions=True)
  np.testing.assert_allclose(out.last_hidden_state, masked.last_hidden_state, atol=TOL)
  np.testing.assert_allclose(out.attentions, masked.attentions * head_mask[:, None, :, None, None], atol=TOL)
  # Pruning more later names the original heads, as HF's prune_heads does.
  again, again_config = prune.prune_params(pruned, pruned_config, {2: [3, 0]})
  head_mask[2, 3] = 0
  masked = bert.BertModel(config).apply({"params": params}, ids, mask, head_mask=head_mask)
  np.testing.assert_allclose(bert.BertModel(again_config).apply({"params": again}, ids, mask).last_hidden_state,
                             masked.last_hidden_state, atol=TOL)


def test_pruned_config_bad_input():
  config, params = tiny()
  with pytest.raises(UserError, match="head 4 of layer 0 is out of range"):
    prune.prune_params(params, config, {0: [4]})
  with pytest.raises(UserError, match="layer 3 is out of range"):
    prune.prune_params(params, config, {3: [0]})
  with pytest.raises(UserError, match="every head of layer 1"):
    prune.prune_params(params, config, {1: [0, 1, 2, 3]})
  with pytest.raises(UserError, match="scan_layers=False"):
    ModelConfig(num_layers=2, pruned_heads={0: [1]})
  with pytest.raises(UserError, match="shared layers"):
    prune.pruned_config(config.replace(share_layers="all"), {0: [1]})


def test_pruned_hf_export_keeps_pruned_heads(tmp_path):
  hf_model = build_hf("bert")
  hf_model.save_pretrained(tmp_path / "src")
  converted = hf.read(str(tmp_path / "src"))
  params, config = prune.prune_params(converted.params, converted.config, {0: [2], 1: [0, 3]})
  converted.params, converted.config = params, config
  hf.write(str(tmp_path / "dst"), converted)
  with open(os.path.join(tmp_path / "dst", "config.json")) as f:
    assert json.load(f)["pruned_heads"] == {"0": [2], "1": [0, 3]}
  back = hf.read(str(tmp_path / "dst"))
  assert back.config.pruned_heads == config.pruned_heads and not back.config.scan_layers
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(params), jax.tree.leaves(back.params)):
    np.testing.assert_array_equal(a, b, err_msg=jax.tree_util.keystr(path))
  with pytest.raises(UserError, match="different widths"):
    relayout(params, config, scan_layers=True)
