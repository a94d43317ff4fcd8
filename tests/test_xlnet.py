"""XLNet (bert_jax/models/xlnet.py, models/records/xlnet.py) against transformers' XLNet (PyTorch) and NumPy:
the LM head and hidden states with left padding and segments, both streams with perm_mask, target_mapping
and memory, the relative shift and one layer's relative attention, what each stream may see under a
factorisation order, and conversion both ways."""
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.special
import torch
import transformers

import bert_jax
from bert_jax import cli, params_checkpoint
from bert_jax.errors import UserError
from bert_jax.finetune import heads
from bert_jax.models import xlnet
from bert_jax.models.xlnet import XLNetConfig, XLNetModel
from core_helpers import slow

VOCAB, T = 50, 7


def _hf_model(tmp_path, mem_len=None, ff_activation="gelu", **overrides):
  """A tiny random XLNetLMHeadModel (3 layers, d_model 32; `overrides`: other XLNetConfig fields) saved to
  tmp_path/hf; its biases, segment embeddings and mask_emb drawn large enough to matter (transformers starts
  the biases at zero)."""
  config = transformers.XLNetConfig(**{**dict(vocab_size=VOCAB, d_model=32, n_layer=3, n_head=4, d_inner=37,
                                              mem_len=mem_len, ff_activation=ff_activation), **overrides})
  torch.manual_seed(0)
  model = widen(transformers.XLNetLMHeadModel(config).eval(), ("mask_emb", "lm_loss.bias"))
  model.save_pretrained(tmp_path / "hf")
  return model


def widen(model, extra=()):
  """`model` with its biases, segment embeddings and the `extra` parameters (name endings) drawn from
  N(0, 0.3): transformers starts biases at zero, where a missing term would go unnoticed."""
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith(("_bias", "seg_embed", "layer_norm.bias", *extra)):
        p.normal_(0.0, 0.3)
  return model


def _batch():
  """Left-padded ids (rows of 7, 4 and 6 real tokens; XLNet's pad id 5), the mask, and two segments."""
  ids = np.random.RandomState(0).randint(6, VOCAB, (3, T))
  mask = np.ones((3, T), np.int64)
  mask[1, :3] = mask[2, :1] = 0
  ids[mask == 0] = 5
  token_types = np.zeros_like(ids)
  token_types[:, 4:] = 1
  token_types[:, -1] = 2  # XLNet's <cls> segment
  return ids, mask, token_types


def test_lm_head_model_matches_transformers_with_left_padding(tmp_path):
  hf_model = _hf_model(tmp_path)
  ids, mask, token_types = _batch()
  model, params = bert_jax.load_pretrained(str(tmp_path / "hf"))
  assert isinstance(model, XLNetModel) and model.config.num_layers == 3 and model.config.mlm_head
  real = mask.astype(bool)
  for types in (None, token_types):
    with torch.no_grad():
      ref = hf_model(torch.tensor(ids), attention_mask=torch.tensor(mask), output_hidden_states=True,
                     token_type_ids=None if types is None else torch.tensor(types))
    out = model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask),
                      None if types is None else jnp.asarray(types), output_hidden_states=True)
    np.testing.assert_allclose(np.asarray(out.mlm_logits)[real], ref.logits.numpy()[real], atol=1e-5)
    np.testing.assert_allclose(np.asarray(out.last_hidden_state)[real], ref.hidden_states[-1].numpy()[real],
                               atol=1e-5)
    reference_states = np.stack([h.numpy() for h in ref.hidden_states])
    np.testing.assert_allclose(np.asarray(out.hidden_states)[:, real], reference_states[:, real], atol=1e-5)
  assert np.abs(ref.logits.numpy()).max() > 0.1
  # Left padding is free: a row's real tokens give the same outputs unpadded.
  alone = model.apply({"params": params}, jnp.asarray(ids[1:2, 3:]), jnp.asarray(mask[1:2, 3:]),
                      jnp.asarray(token_types[1:2, 3:]))
  np.testing.assert_allclose(alone.mlm_logits[0], out.mlm_logits[1, 3:], atol=1e-5)


def _order_masks(order, targets):
  """perm_mask [T, T] and target_mapping [P, T] of a factorisation order (XLNet's: a target sees the tokens
  before it in the order; a non-target sees every non-target), targets in the order's last places."""
  rank = np.argsort(order)
  is_target = np.isin(np.arange(len(order)), targets)
  perm = (rank[None, :] >= rank[:, None]) & is_target[None, :]
  mapping = np.eye(len(order), dtype=np.float32)[targets]
  return perm.astype(np.float32), mapping


@slow  # weekly suite (BERT_JAX_SLOW_TESTS=1): the suite's 15 minutes; the family's HF-equality test stays
def test_two_streams_and_memory_match_transformers(tmp_path):
  hf_model = _hf_model(tmp_path, mem_len=5)
  ids, mask, token_types = _batch()
  order = np.array([3, 0, 6, 1, 5, 2, 4])
  perm, mapping = _order_masks(order, targets=[5, 2, 4])
  perm, mapping = np.broadcast_to(perm, (3, T, T)), np.broadcast_to(mapping, (3, 3, T))
  mems = np.random.RandomState(1).normal(size=(3, 3, 4, 32)).astype(np.float32)  # [L, B, M, H]
  model, params = bert_jax.load_pretrained(str(tmp_path / "hf"))
  assert model.config.mem_len == 5
  with torch.no_grad():
    ref = hf_model(torch.tensor(ids), attention_mask=torch.tensor(mask), token_type_ids=torch.tensor(token_types),
                   perm_mask=torch.tensor(perm.copy()), target_mapping=torch.tensor(mapping.copy()),
                   mems=[torch.tensor(m).transpose(0, 1) for m in mems], use_mems=True)
  out = model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(token_types),
                    perm_mask=jnp.asarray(perm), target_mapping=jnp.asarray(mapping), mems=jnp.asarray(mems))
  assert out.mlm_logits.shape == (3, 3, VOCAB)  # the query stream's predictions
  np.testing.assert_allclose(out.mlm_logits, ref.logits.numpy(), atol=1e-5)
  np.testing.assert_allclose(np.asarray(out.mems), np.stack([m.transpose(0, 1).numpy() for m in ref.mems]),
                             atol=1e-5)


# --- NumPy references ----------------------------------------------------------------------------------------

def test_rel_shift_moves_each_distance_to_its_key():
  q_len, m_len = 4, 3
  k_len = q_len + m_len
  x = np.random.RandomState(0).normal(size=(2, 3, q_len, k_len + q_len)).astype(np.float32)
  shifted = np.asarray(xlnet.rel_shift(jnp.asarray(x), k_len))
  distances = np.arange(k_len, -q_len, -1)  # the columns of x
  for i in range(q_len):
    for j in range(k_len):
      column = int(np.flatnonzero(distances == m_len + i - j)[0])
      np.testing.assert_array_equal(shifted[..., i, j], x[..., i, column])


def _layer_norm(x, scale, bias, eps=1e-12):
  x = x - x.mean(-1, keepdims=True)
  return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * scale + bias


def _numpy_layer(p, h, mem, token_types, mask, eps=1e-12):
  """One XLNet layer on the content stream, with each pair's encoding of its distance built explicitly
  (no shift): h [B, T, H], mem [B, M, H], mask [B, T] (1: real)."""
  a = p["attention"]
  b, t, hidden = h.shape
  m = mem.shape[1]
  keys = np.concatenate([mem, h], axis=1)
  q, k, v = (np.einsum("bih,hnd->bind", x, a[n]) for x, n in ((h, "query"), (keys, "key"), (keys, "value")))
  inv_freq = 1.0 / 10000 ** (np.arange(0, hidden, 2.0) / hidden)
  distance = (m + np.arange(t))[:, None] - np.arange(m + t)[None, :]  # query i sits at m + i
  angles = distance[..., None] * inv_freq
  r = np.concatenate([np.sin(angles), np.cos(angles)], -1)  # [T, K, H]
  kr = np.einsum("ijh,hnd->ijnd", r, a["position_key"])
  seg_keys = np.concatenate([np.zeros((b, m), int), token_types], axis=1)
  other = token_types[:, :, None] != seg_keys[:, None, :]
  seg = a["segment_embedding"][other.astype(int)]  # [B, T, K, N, D]
  score = (np.einsum("bind,bjnd->bnij", q + a["content_bias"], k)
           + np.einsum("bind,ijnd->bnij", q + a["position_bias"], kr)
           + np.einsum("bind,bijnd->bnij", q + a["segment_bias"], seg)) / np.sqrt(q.shape[-1])
  blocked = np.concatenate([np.zeros((b, m)), 1 - mask], axis=1)[:, None, None, :].repeat(t, 2)
  blocked[:, :, np.arange(t), m + np.arange(t)] = 0  # the content stream sees itself
  score = np.where(blocked > 0, -1e30, score)
  probs = np.exp(score - score.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  out = np.einsum("bnij,bjnd->bind", probs, v)
  x = _layer_norm(np.einsum("bind,hnd->bih", out, a["output"]) + h, **_norm(a["layer_norm"]), eps=eps)
  f = p["feed_forward"]
  y = x @ f["intermediate"]["kernel"] + f["intermediate"]["bias"]
  y = y * 0.5 * (1 + scipy.special.erf(y / np.sqrt(2)))  # exact GELU
  y = y @ f["output"]["kernel"] + f["output"]["bias"]
  return _layer_norm(y + x, **_norm(f["layer_norm"]), eps=eps)


def _norm(p):
  return {"scale": p["scale"], "bias": p["bias"]}


@slow  # weekly suite (BERT_JAX_SLOW_TESTS=1): the suite's 15 minutes; the family's HF-equality test stays
def test_one_layer_matches_numpy_with_memory_segments_and_padding():
  config = XLNetConfig(vocab_size=VOCAB, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=24,
                       mlm_head=False, scan_layers=False, initializer_range=0.3)
  ids, mask, token_types = _batch()
  model = XLNetModel(config)
  params = jax.tree.map(np.asarray, nn.meta.unbox(
      model.init(jax.random.key(0), jnp.asarray(ids))["params"]))
  mem = np.random.RandomState(2).normal(size=(1, 3, 4, 16)).astype(np.float32)
  out = model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(token_types),
                    mems=jnp.asarray(mem))
  h = params["embeddings"]["word_embeddings"]["embedding"][ids]
  reference = _numpy_layer(params["encoder"]["layer_0"], h, mem[0], token_types, mask)
  real = mask.astype(bool)
  np.testing.assert_allclose(np.asarray(out.last_hidden_state)[real], reference[real], atol=2e-5)


# --- What each stream sees ---------------------------------------------------------------------------------

def test_two_streams_see_what_the_factorisation_order_allows():
  """Changing the token at j changes the query-stream output of target i iff j comes before i in the order,
  and the content-stream output at i iff j comes before i, is i, or is no target: the query stream never
  sees its own token, the content stream always does."""
  config = XLNetConfig(vocab_size=VOCAB, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=24,
                       initializer_range=0.3, hidden_dropout=0.0, attention_dropout=0.0)
  order = np.array([2, 4, 0, 3, 1])
  rank = np.argsort(order)
  targets = order[2:]  # the last 3 of the order are predicted
  is_target = np.isin(np.arange(len(order)), targets)
  perm, mapping = _order_masks(order, targets)
  model = XLNetModel(config)
  ids = np.random.RandomState(0).randint(6, VOCAB, (1, len(order)))
  params = model.init(jax.random.key(1), jnp.asarray(ids))["params"]
  apply = jax.jit(lambda ids: model.apply({"params": params}, ids, perm_mask=jnp.asarray(perm[None]),
                                          target_mapping=jnp.asarray(mapping[None])))
  base = apply(jnp.asarray(ids))
  for j in range(len(order)):
    changed = ids.copy()
    changed[0, j] = (ids[0, j] + 7) % VOCAB
    out = apply(jnp.asarray(changed))
    g_moved = np.abs(np.asarray(out.query_hidden_state - base.query_hidden_state)).max(-1)[0] > 1e-6
    h_moved = np.abs(np.asarray(out.last_hidden_state - base.last_hidden_state)).max(-1)[0] > 1e-6
    np.testing.assert_array_equal(g_moved, rank[j] < rank[targets], err_msg=f"query stream, token {j} changed")
    np.testing.assert_array_equal(h_moved, ~is_target[j] | (rank[j] <= rank), err_msg=f"content stream, {j}")
    assert h_moved[j] and not (is_target[j] and g_moved[list(targets).index(j)])


# --- Conversion --------------------------------------------------------------------------------------------

@slow  # weekly suite (BERT_JAX_SLOW_TESTS=1): the suite's 15 minutes; the family's HF-equality test stays
def test_converts_from_and_to_hugging_face(tmp_path):
  hf_model = _hf_model(tmp_path)
  ids, mask, token_types = _batch()
  assert cli.main(["convert", "--from", "hf", str(tmp_path / "hf"), str(tmp_path / "ours")]) == 0
  saved = json.loads((tmp_path / "ours" / "config.json").read_text())
  assert saved["model"]["family"] == "xlnet" and saved["heads"] == ["mlm"]
  model, params = bert_jax.load_pretrained(str(tmp_path / "ours"), scan_layers=False)  # unrolled layers
  assert isinstance(model, XLNetModel) and "layer_2" in params["encoder"]
  assert cli.main(["convert", "--to", "hf", str(tmp_path / "ours"), str(tmp_path / "back")]) == 0
  written = json.loads((tmp_path / "back" / "config.json").read_text())
  assert written["architectures"] == ["XLNetLMHeadModel"] and written["model_type"] == "xlnet"
  back = transformers.XLNetLMHeadModel.from_pretrained(tmp_path / "back").eval()
  args = dict(attention_mask=torch.tensor(mask), token_type_ids=torch.tensor(token_types))
  with torch.no_grad():
    want, got = hf_model(torch.tensor(ids), **args).logits, back(torch.tensor(ids), **args).logits
  np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-6)
  ours = model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(token_types))
  real = mask.astype(bool)
  np.testing.assert_allclose(np.asarray(ours.mlm_logits)[real], want.numpy()[real], atol=1e-5)

  base = transformers.XLNetModel.from_pretrained(tmp_path / "hf")  # the bare model: no LM head
  base.save_pretrained(tmp_path / "bare")
  model, params = bert_jax.load_pretrained(str(tmp_path / "bare"))
  assert not model.config.mlm_head and "mlm_head" not in params


@slow  # weekly suite (BERT_JAX_SLOW_TESTS=1): the suite's 15 minutes; the family's HF-equality test stays
def test_fine_tuned_heads_export_to_transformers(tmp_path, capsys):
  """Sequence classification reads the last (real) token's summary, as XLNetForSequenceClassification;
  token classification every position's vector; both export and give transformers' logits."""
  ids, mask, token_types = _batch()
  classes = {"classification": transformers.XLNetForSequenceClassification,
             "token": transformers.XLNetForTokenClassification}
  for kind, hf_class in classes.items():
    config = heads.encoder_config(XLNetConfig(vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=4,
                                              intermediate_size=37, scan_layers=False), kind, "pooled")
    model = heads.FinetuneModel(config, kind, 3)
    abstract = nn.meta.unbox(jax.eval_shape(model.init, jax.random.key(0), *map(jnp.asarray, (ids, mask, token_types))))
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda x: (0.3 * rng.standard_normal(x.shape)).astype(np.float32), abstract["params"])
    assert ("summary" in params["head"]) == (kind == "classification") and "mlm_head" not in params
    saved = {"model": config.to_dict(), "head": {"pooling": "pooled", "dropout": 0.1},
             "task": {"family": "test", "name": f"x_{kind}", "head": kind, "num_labels": 3, "labels": ["a", "b", "c"]},
             "data": {"max_seq_length": T}, "train": {"eval_batch_size": 4}}
    params_checkpoint.save_params(str(tmp_path / kind), params, saved)
    assert cli.main(["convert", "--to", "hf", str(tmp_path / kind), str(tmp_path / f"{kind}_hf")]) == 0
    assert "not written" not in capsys.readouterr().out
    reference = hf_class.from_pretrained(tmp_path / f"{kind}_hf").eval()
    with torch.no_grad():
      want = reference(torch.tensor(ids), attention_mask=torch.tensor(mask),
                       token_type_ids=torch.tensor(token_types)).logits.numpy()
    got = np.asarray(model.apply({"params": params}, *map(jnp.asarray, (ids, mask, token_types)))["logits"])
    at = mask.astype(bool) if kind == "token" else slice(None)
    np.testing.assert_allclose(got[at], want[at], atol=1e-5)
    assert np.abs(want).max() > 0.1


def test_model_attention_takes_dot_and_refuses_the_others_in_one_line(tmp_path, capsys):
  """README's backends are "for every family": XLNet's config has model.attention; only dot runs its relative
  attention. Before: `--config.model.attention=...` was an unknown key."""
  from bert_jax.cli import main  # pylint: disable=import-outside-toplevel
  from bert_jax.config_utils import load_config  # pylint: disable=import-outside-toplevel
  assert load_config("configs/xlnet.py:tiny").model.attention == "dot"
  assert XLNetConfig(attention="dot").attention == "dot"
  with pytest.raises(UserError, match="model.attention='cudnn': XLNet's relative attention"):
    XLNetConfig(attention="cudnn", attention_dropout=0.0)
  backend = "splash"
  capsys.readouterr()
  assert main(["pretrain", "--config", "configs/xlnet.py:tiny", "--workdir", str(tmp_path / "run"),
               f"--config.model.attention={backend}", "--config.model.attention_dropout=0"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert err == [f"bert-jax pretrain: error: model.attention='{backend}': XLNet's relative attention adds position "
                 "and segment scores that only the 'dot' backend takes; set model.attention='dot'"]
  assert not (tmp_path / "run").exists()
