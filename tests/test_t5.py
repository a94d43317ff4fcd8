"""T5 and T5 v1.1 (models/t5.py, models/records/t5.py) against transformers' T5ForConditionalGeneration."""
from __future__ import annotations

import functools
import json
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

import bert_jax
from core_helpers import slow
from bert_jax import cli
from bert_jax.models import families
from bert_jax.models.t5 import T5Config, T5Model, relative_position_bucket

VOCAB = 120
HF_TINY = dict(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4, dropout_rate=0.0,
               decoder_start_token_id=0, relative_attention_num_buckets=8, relative_attention_max_distance=16)
# v1.1: gated-GELU, its own LM head, no output scaling; original T5: ReLU, the tied head scaled by d_model**-0.5.
SHAPES = {"v1_1": dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False, num_decoder_layers=3),
          "original": dict(feed_forward_proj="relu", tie_word_embeddings=True)}


def hf_t5(path, shape: str, seed: int = 0, own_head: bool = True, **overrides):
  """A tiny random T5ForConditionalGeneration saved at `path` (norms away from 1, so a skipped one shows). v1.1
  with `own_head` gets an lm_head of its own (transformers 5 ties it to `shared` unless the weights differ)."""
  torch.manual_seed(seed)
  model = transformers.T5ForConditionalGeneration(transformers.T5Config(**HF_TINY, **{**SHAPES[shape], **overrides})).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "layer_norm" in name:
        p.add_(0.2 * torch.randn_like(p))
    # transformers' std-1 table gives logits near 20 unscaled, where float32 rounding is 1e-5 itself.
    model.shared.weight.mul_(0.3)
    if shape == "v1_1" and own_head:
      model.lm_head.weight = torch.nn.Parameter(0.3 * torch.randn(VOCAB, HF_TINY["d_model"]))
  model.save_pretrained(path)
  return model


def batch(seed=0):
  rng = np.random.RandomState(seed)
  ids = rng.randint(3, VOCAB, (3, 21))
  mask = np.ones_like(ids)
  mask[1, 13:] = 0
  mask[2, 4:] = 0
  ids = ids * mask
  dec = rng.randint(2, VOCAB, (3, 19))  # longer than the buckets' max distance: the log buckets count
  dec[:, 0] = 0
  return ids, mask, dec


def reference(model, ids, mask, dec):
  with torch.no_grad():
    out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), decoder_input_ids=torch.tensor(dec))
  return out.logits.numpy(), out.encoder_last_hidden_state.numpy()


@pytest.mark.parametrize("shape,scan_layers", [("v1_1", True), ("original", False)])
def test_logits_and_encoder_states_equal_transformers(tmp_path, shape, scan_layers):
  want_logits, want_encoded = reference(hf_t5(tmp_path, shape), *batch())
  ids, mask, dec = batch()
  model, params = bert_jax.load_pretrained(str(tmp_path), scan_layers=scan_layers)
  assert isinstance(model, T5Model) and model.config.tie_word_embeddings == (shape == "original")
  assert model.config.scale_decoder_outputs == (shape == "original")
  out = jax.jit(functools.partial(model.apply, deterministic=True))(
      {"params": params}, jnp.asarray(ids), attention_mask=jnp.asarray(mask), decoder_input_ids=jnp.asarray(dec))
  real = mask > 0
  np.testing.assert_allclose(np.asarray(out.encoder_last_hidden_state)[real], want_encoded[real], atol=1e-5, rtol=0)
  np.testing.assert_allclose(np.asarray(out.logits), want_logits, atol=1e-5, rtol=0)


def test_transformers_default_v1_1_is_tied_unscaled(tmp_path):
  """transformers 5 ties a v1.1 config's head to `shared` (no lm_head.weight written) and does not scale."""
  want_logits, _ = reference(hf_t5(tmp_path, "v1_1", own_head=False), *batch(1))
  model, params = bert_jax.load_pretrained(str(tmp_path))
  assert model.config.tie_word_embeddings and not model.config.scale_decoder_outputs and "lm_head" not in params
  ids, mask, dec = batch(1)
  out = jax.jit(model.apply)({"params": params}, jnp.asarray(ids), attention_mask=jnp.asarray(mask),
                             decoder_input_ids=jnp.asarray(dec))
  np.testing.assert_allclose(np.asarray(out.logits), want_logits, atol=1e-5, rtol=0)


def test_relative_buckets_equal_transformers():
  rel = np.arange(-200, 200)[None, :]
  for bidirectional in (True, False):
    for buckets, distance in ((32, 128), (8, 16)):
      want = transformers.models.t5.modeling_t5.T5Attention._relative_position_bucket(  # pylint: disable=protected-access
          torch.tensor(rel), bidirectional=bidirectional, num_buckets=buckets, max_distance=distance).numpy()
      got = relative_position_bucket(jnp.asarray(rel, jnp.int32), bidirectional, buckets, distance)
      np.testing.assert_array_equal(np.asarray(got), want)


@pytest.mark.parametrize("shape", ["v1_1", "original"])
def test_convert_round_trip_through_bert_jax_and_back(tmp_path, shape, capsys):
  """HF -> bert_jax (convert --from hf) -> HF (convert --to hf): every tensor transformers reads is the same."""
  theirs = hf_t5(tmp_path / "in", shape, seed=3)
  assert cli.main(["convert", "--from", "hf", str(tmp_path / "in"), str(tmp_path / "native")]) == 0
  assert json.loads((tmp_path / "native" / "config.json").read_text())["model"]["family"] == "t5"
  assert cli.main(["convert", "--to", "hf", str(tmp_path / "native"), str(tmp_path / "out")]) == 0
  capsys.readouterr()
  again = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path / "out").eval()
  ours, want = again.state_dict(), theirs.state_dict()
  assert ours.keys() == want.keys()
  for name in want:
    np.testing.assert_array_equal(ours[name].numpy(), want[name].numpy(), err_msg=name)
  assert again.config.scale_decoder_outputs == (shape == "original")
  ids, mask, dec = batch(2)
  np.testing.assert_array_equal(reference(again, ids, mask, dec)[0], reference(theirs, ids, mask, dec)[0])


@slow  # ~20 s; span corruption's packing and segment ids are test_t5_span_corruption.py's
def test_packed_rows_equal_each_document_alone():
  """Segment ids: two documents packed in one row give each document's logits as if it ran alone."""
  cfg = T5Config(vocab_size=VOCAB, hidden_size=16, num_layers=2, num_heads=2, head_dim=8, intermediate_size=24,
                 relative_buckets=8, relative_max_distance=16)
  model = T5Model(cfg)
  rng = np.random.RandomState(0)
  a, b = rng.randint(2, VOCAB, 5), rng.randint(2, VOCAB, 4)
  ta, tb = rng.randint(2, VOCAB, 3), rng.randint(2, VOCAB, 4)
  params = model.init(jax.random.key(0), jnp.zeros((1, 9), jnp.int32))["params"]
  packed = model.apply({"params": params}, jnp.asarray([np.r_[a, b, 0]]), decoder_input_ids=jnp.asarray([np.r_[ta, tb, 0]]),
                       encoder_segment_ids=jnp.asarray([[1] * 5 + [2] * 4 + [0]]),
                       decoder_segment_ids=jnp.asarray([[1] * 3 + [2] * 4 + [0]]))
  for enc, dec, where in ((a, ta, slice(0, 3)), (b, tb, slice(3, 7))):
    alone = model.apply({"params": params}, jnp.asarray([enc]), decoder_input_ids=jnp.asarray([dec]))
    # Relative positions restart per document only in the mask; a packed document's positions are shifted
    # by the same amount for query and key, so its relative biases are the same.
    np.testing.assert_allclose(np.asarray(packed.logits)[0, where], np.asarray(alone.logits)[0], atol=1e-5)


def test_family_record_and_parameter_count():
  family = families.get("t5")
  assert families.by_model_type("t5", "test") is family
  cfg = T5Config(vocab_size=VOCAB, hidden_size=16, num_layers=2, num_decoder_layers=3, num_heads=2, head_dim=8,
                 intermediate_size=24)
  # The shapes are what is counted: traced, not run (op by op, the init's compiles took seconds).
  params = nn.meta.unbox(jax.eval_shape(T5Model(cfg).init, jax.random.key(0), jnp.zeros((1, 4), jnp.int32))["params"])
  counted = sum(math.prod(x.shape) for x in jax.tree.leaves(params))
  assert counted == family.backbone_params(cfg.to_dict())
  assert params["encoder"]["layers"]["attention"]["query"].shape == (2, 16, 2, 8)
  assert params["decoder"]["layers"]["cross_attention"]["out"].shape == (3, 2, 8, 16)


@pytest.mark.parametrize("shape", ["v1_1", pytest.param("original", marks=slow)])
def test_greedy_equals_transformers_generate_and_beam_search_is_exhaustive_with_every_beam(tmp_path, shape):
  from bert_jax.models import t5_decode  # pylint: disable=import-outside-toplevel
  # transformers' generate sizes its cache by num_layers: a deeper decoder than encoder fails there.
  theirs = hf_t5(tmp_path, shape, seed=4, num_decoder_layers=2)
  ids, mask, _ = batch(4)
  model, params = bert_jax.load_pretrained(str(tmp_path))
  length = 12
  with torch.no_grad():
    want = theirs.generate(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), max_new_tokens=length,
                           do_sample=False, num_beams=1, min_length=0).numpy()[:, 1:]
  got = np.asarray(t5_decode.greedy(model, params, jnp.asarray(ids), jnp.asarray(mask), length))
  np.testing.assert_array_equal(got[:, :want.shape[1]], want)
  assert np.all(got[:, want.shape[1]:] == 0)  # transformers stops when every row has ended: the rest is padding
  # One beam is greedy; as many beams as the vocabulary is exhaustive: over two steps, the best pair of tokens.
  one = t5_decode.beam_search(model, params, jnp.asarray(ids), jnp.asarray(mask), length, num_beams=1)
  np.testing.assert_array_equal(np.asarray(one), got)
  beams = np.asarray(t5_decode.beam_search(model, params, jnp.asarray(ids), jnp.asarray(mask), 2, num_beams=VOCAB))
  for row in range(len(ids)):
    enc = jnp.asarray(np.repeat(ids[row:row + 1], VOCAB, 0))
    dec = np.zeros((VOCAB, 2), np.int64)
    dec[:, 1] = np.arange(VOCAB)
    logp = np.asarray(jax.nn.log_softmax(model.apply(
        {"params": params}, enc, attention_mask=jnp.asarray(np.repeat(mask[row:row + 1], VOCAB, 0)),
        decoder_input_ids=jnp.asarray(dec)).logits))
    pair = logp[0, 0][:, None] + logp[:, 1]  # first token a, then b (row a of the decoder batch)
    pair[1] = -np.inf
    pair[1, 0] = logp[0, 0, 1]  # </s> first: padding after it, at no cost
    a, b = np.unravel_index(np.argmax(pair), pair.shape)
    assert beams[row].tolist() == [a, b], (row, beams[row], a, b)


def test_a_bert_checkpoint_as_t5_init_is_one_line(tmp_path, capsys):
  from bert_jax import pretrained  # pylint: disable=import-outside-toplevel
  from bert_jax.conversion import native  # pylint: disable=import-outside-toplevel
  config = transformers.BertConfig(vocab_size=100, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                   intermediate_size=32)
  transformers.BertForMaskedLM(config).save_pretrained(tmp_path / "hf")
  native.write(str(tmp_path / "bert"), pretrained.read_checkpoint(str(tmp_path / "hf")))
  capsys.readouterr()
  assert cli.main(["pretrain", "--config", "configs/t5.py:tiny", f"--config.init_from={tmp_path / 'bert'}",
                   "--workdir", str(tmp_path / "run"), "--config.train.num_steps=1"]) == 2
  err = capsys.readouterr().err.strip()
  assert "family 'bert'" in err and "family 't5'" in err and len(err.splitlines()) == 1, err
  assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("scan_layers", [True, pytest.param(False, marks=slow)])  # unrolled: weekly
def test_remat_gives_the_same_gradients(scan_layers):
  cfg = T5Config(vocab_size=50, hidden_size=16, num_layers=2, num_heads=2, head_dim=8, intermediate_size=24,
                 scan_layers=scan_layers)
  ids = jnp.asarray(np.arange(10).reshape(2, 5) + 2)
  params = nn.meta.unbox(jax.jit(T5Model(cfg).init)(jax.random.key(0), ids)["params"])

  def grads(remat):  # compiled: op by op, the backward pass's compiles took seconds
    model = T5Model(cfg.replace(remat=remat))
    return jax.jit(jax.grad(lambda p: model.apply({"params": p}, ids, decoder_input_ids=ids).logits.sum()))(params)
  for a, b in zip(jax.tree.leaves(grads("none")), jax.tree.leaves(grads("full"))):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)  # gradients up to ~40
