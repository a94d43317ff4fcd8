"""DeBERTa's enhanced mask decoder (model.emd_steps): its MLM logits against a NumPy re-computation of its
definition (the last layer applied twice over the last layer's input plus absolute positions, written out in NumPy
and first checked against the plain encoder's own last layer), the RTD objective's step with it, the preset, and
the Hugging Face export that drops its table. EMD off equals transformers: tests/test_deberta.py."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from core_helpers import slow
import transformers
from scipy.special import erf

from bert_jax import params_checkpoint, pretrained
from bert_jax.conversion import hf
from bert_jax.errors import UserError
from bert_jax.models import deberta

VOCAB, HIDDEN, HEADS, BUCKETS, EPS = 96, 32, 2, 8, 1e-7


def _config(**changes):
  return deberta.DebertaConfig(**{**dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_layers=2, num_heads=HEADS,
                                         intermediate_size=48, max_position_embeddings=64, position_buckets=BUCKETS,
                                         hidden_dropout=0.0, attention_dropout=0.0), **changes})


def _batch(seed=0, batch=2, length=20):
  rng = np.random.RandomState(seed)
  mask = np.ones((batch, length), np.int32)
  mask[1, 13:] = 0
  return rng.randint(5, VOCAB, (batch, length)).astype(np.int32) * mask, mask


def _norm(x, p):
  mu = x.mean(-1, keepdims=True)
  var = ((x - mu) ** 2).mean(-1, keepdims=True)
  return (x - mu) / np.sqrt(var + EPS) * p["scale"] + p["bias"]


def _dense(x, p):
  return x @ p["kernel"] + p["bias"]


def _gelu(x):
  return 0.5 * x * (1 + erf(x / np.sqrt(2)))


def _np_layer(p, keys, queries, mask, relative):
  """One DeBERTa-v3 layer in NumPy (float64): queries [B, T, H] attend keys/values [B, T, H] with content,
  c2p (q_i . key(rel[b(i - j) + S])) and p2c (k_j . query(rel[-b(j - i) + S])) terms over sqrt(3 D), both-sided
  padding mask; residual on the queries; then the feed-forward block."""
  a = p["attention"]
  b, t, h = keys.shape
  d = h // HEADS
  heads = lambda x: x.reshape(x.shape[:-1] + (HEADS, d))  # noqa: E731
  q, k, v = heads(_dense(queries, a["query"])), heads(_dense(keys, a["key"])), heads(_dense(keys, a["value"]))
  pos_key, pos_query = heads(_dense(relative, a["key"])), heads(_dense(relative, a["query"]))
  dist = deberta.relative_positions(t, BUCKETS, 64)  # b(i - j), hand-checked in test_deberta.py
  c2p = np.clip(dist + BUCKETS, 0, 2 * BUCKETS - 1)
  p2c = np.clip(-dist.T + BUCKETS, 0, 2 * BUCKETS - 1)
  scores = np.einsum("bind,bjnd->bnij", q, k)
  scores += np.einsum("bind,ijnd->bnij", q, pos_key[c2p])
  scores += np.einsum("bjnd,ijnd->bnij", k, pos_query[p2c])
  scores /= np.sqrt(3 * d)
  seen = (mask[:, None, :, None] * mask[:, None, None, :]) > 0
  scores = np.where(seen, scores, np.finfo(np.float32).min)
  probs = np.exp(scores - scores.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  y = np.einsum("bnij,bjnd->bind", probs, v).reshape(b, t, h)
  x = _norm(_dense(y, a["output"]) + queries, a["output_norm"])
  return _norm(_dense(_gelu(_dense(x, p["intermediate"])), p["output"]) + x, p["output_norm"])


def _f64(tree):
  return jax.tree.map(lambda w: np.asarray(w, np.float64), tree)


@pytest.mark.parametrize("scan_layers", [pytest.param(True, marks=slow), False])  # scanned: weekly
def test_emd_logits_against_numpy(scan_layers):
  """model.emd_steps=2: Q_0 = H_1 + P[positions], Q_k = layer_2(queries Q_{k-1}, keys and values H_1), the MLM head
  over Q_2 at the masked positions; H_1 from the plain encoder (EMD off: the transformers-checked path), the layer
  in NumPy, itself checked first: it maps H_1 to the plain encoder's output H_2."""
  config = _config(emd_steps=2, scan_layers=scan_layers)
  ids, mask = _batch()
  positions = np.array([[1, 4, 9], [2, 7, 12]], np.int32)
  model = deberta.DebertaModel(config)
  params = nn.meta.unbox(model.init(jax.random.key(0), jnp.asarray(ids))["params"])
  leaves, tree = jax.tree.flatten(params)  # every weight away from its init (norms at 1, biases at 0)
  keys = jax.random.split(jax.random.key(1), len(leaves))
  params = jax.tree.unflatten(tree, [w + 0.1 * jax.random.normal(k, w.shape) for w, k in zip(leaves, keys)])
  got = model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask),
                    masked_positions=jnp.asarray(positions)).mlm_logits

  plain_params = {**params, "mlm_head": {k: v for k, v in params["mlm_head"].items() if k != "emd_positions"}}
  plain = deberta.DebertaModel(config.replace(emd_steps=0)).apply(
      {"params": plain_params}, jnp.asarray(ids), jnp.asarray(mask), output_hidden_states=True,
      masked_positions=jnp.asarray(positions))
  p = _f64(params)
  layers = p["encoder"]
  last = jax.tree.map(lambda w: w[-1], layers["layers"]) if scan_layers else layers["layer_1"]
  relative = _norm(layers["rel_embeddings"], layers["rel_norm"])
  hidden = np.asarray(plain.hidden_states, np.float64)
  real = mask[..., None] > 0
  again = _np_layer(last, hidden[1], hidden[1], mask, relative)
  np.testing.assert_allclose(np.where(real, again, 0), np.where(real, hidden[2], 0), atol=2e-5)

  queries = hidden[1] + p["mlm_head"]["emd_positions"]["embedding"][np.arange(ids.shape[1])]
  for _ in range(2):
    queries = _np_layer(last, hidden[1], queries, mask, relative)
  at = np.take_along_axis(queries, positions[..., None], axis=1)
  head = p["mlm_head"]
  h = _norm(_gelu(_dense(at, head["transform"])), head["layer_norm"])
  want = h @ p["embeddings"]["word_embeddings"]["embedding"].T + head["output_bias"]
  np.testing.assert_allclose(np.asarray(got), want, atol=5e-5)
  assert np.abs(want - np.asarray(plain.mlm_logits)).max() > 1e-2  # the decoder changes the logits


def test_emd_off_has_no_table_and_bad_settings_are_one_line():
  """emd_steps=0 (the default, Hugging Face's layout): no decoder table; the decoder without the MLM head is off;
  negative steps or absolute positions at the input are refused."""
  ids, _ = _batch()
  off = deberta.DebertaModel(_config()).init(jax.random.key(0), jnp.asarray(ids))["params"]
  assert set(off["mlm_head"]) == {"transform", "layer_norm", "output_bias"}
  assert not _config(emd_steps=2, mlm_head=False, rtd_head=True).emd
  with pytest.raises(UserError, match="model.emd_steps=-1"):
    _config(emd_steps=-1)
  with pytest.raises(UserError, match="position_biased_input=False"):
    _config(emd_steps=2, position_biased_input=True)


@slow  # ~30 s: EMD's numerics are the NumPy test's, the RTD step test_deberta.py's
def test_rtd_step_with_emd_and_the_preset():
  """The tiny preset turns the decoder on (its generator's MLM, as the paper's); one optimizer step of the
  deberta_rtd objective with it, dropout on: finite loss, the decoder's table and the last generator layer get
  gradients, and a small step lowers the loss."""
  from bert_jax.config_utils import load_config  # pylint: disable=import-outside-toplevel
  from bert_jax.training.objectives import deberta_rtd  # pylint: disable=import-outside-toplevel
  assert load_config("configs/deberta.py:tiny").model.emd_steps == 2
  config = _config(mlm_head=False, rtd_head=True, emd_steps=2, hidden_dropout=0.1, attention_dropout=0.1)
  objective = deberta_rtd.DebertaRTDPretraining(config, 0.5, 50.0)
  assert objective.model.generator.config.emd and not objective.model.discriminator.config.emd
  ids, mask = _batch(length=16)
  rng = np.random.RandomState(3)
  positions = np.stack([rng.choice(np.arange(1, 12), 3, replace=False) for _ in range(2)]).astype(np.int32)
  batch = {"input_ids": ids, "input_mask": mask, "segment_ids": np.zeros_like(ids), "masked_lm_positions": positions,
           "masked_lm_ids": np.take_along_axis(ids, positions, 1), "masked_lm_weights": np.ones((2, 3), np.float32)}
  batch = {k: jnp.asarray(v) for k, v in batch.items()}
  params = jax.jit(lambda key: nn.meta.unbox(objective.init(key, batch)))(jax.random.key(0))
  assert "emd_positions" in params["generator"]["mlm_head"] and "mlm_head" not in params["discriminator"]

  def loss(p, rng):
    return objective.loss(objective.sums(p, batch, rng, False), objective.counts(batch))
  step = jax.jit(jax.value_and_grad(loss))
  key = jax.random.key(5)  # the same dropout masks and samples before and after the step
  before, grads = step(params, key)
  assert np.isfinite(float(before))
  assert np.abs(grads["generator"]["mlm_head"]["emd_positions"]["embedding"]).max() > 0
  assert np.abs(grads["generator"]["encoder"]["layers"]["attention"]["query"]["kernel"]).max() > 0
  after, _ = step(jax.tree.map(lambda w, g: w - 1e-3 * g, params, grads), key)
  assert float(after) < float(before)

def test_hf_export_drops_the_decoder_table_with_a_note(tmp_path):
  """An MLM model with the decoder, out to Hugging Face: DebertaV2ForMaskedLM (which has no decoder) loads it, the
  table `mlm_head/emd_positions` is left out with one note, the encoder's hidden states are ours."""
  config = _config(emd_steps=2)
  ids, mask = _batch()
  model = deberta.DebertaModel(config)
  params = jax.device_get(nn.meta.unbox(model.init(jax.random.key(0), jnp.asarray(ids))["params"]))
  params_checkpoint.save_params(str(tmp_path / "run"), params, {"model": config.to_dict()})
  converted = pretrained.read_checkpoint(str(tmp_path / "run"))
  notes = hf.write(str(tmp_path / "hf"), converted)
  assert any("mlm_head/emd_positions/embedding" in note for note in notes), notes
  theirs = transformers.DebertaV2ForMaskedLM.from_pretrained(tmp_path / "hf").eval()
  import torch  # pylint: disable=import-outside-toplevel
  with torch.no_grad():
    want = theirs.deberta(input_ids=torch.tensor(ids, dtype=torch.long),
                          attention_mask=torch.tensor(mask, dtype=torch.long)).last_hidden_state.numpy()
  ours = model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask)).last_hidden_state
  real = mask[..., None] > 0
  np.testing.assert_allclose(np.where(real, ours, 0), np.where(real, want, 0), atol=1e-4)
