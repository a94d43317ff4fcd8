"""The attention backends (bert_jax/models/attention.py) against each other and against hand-built masks,
and rotary embeddings against NumPy. splash runs in Pallas interpret mode here (tiny shapes: it tiles
the sequence by 128)."""
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from bert_jax.errors import UserError
from bert_jax.models import attention, rope

B, T, N, D = 4, 128, 2, 8


def _inputs(length=T):
  """Four rows: two packed documents and padding, one document and padding, a full row, mostly padding."""
  rng = np.random.RandomState(0)
  q, k, v = (jnp.asarray(rng.randn(B, length, N, D), jnp.float32) for _ in range(3))
  ids = np.zeros((B, length), np.int32)
  ids[0, :50], ids[0, 50:100] = 1, 2
  ids[1, :90] = 1
  ids[2, :] = 1
  ids[3, :9] = 1
  return q, k, v, attention.Segments(jnp.asarray(ids), packed=True)


def _hand_mask(ids, window):
  """bool[B, T, T], query by query: a real query sees the real keys of its document within the window."""
  mask = np.zeros((B, T, T), bool)
  keys = np.arange(T)
  for b in range(B):
    for i in range(T):
      near = np.ones(T, bool) if window is None else np.abs(keys - i) <= window
      # padding queries: every real key in reach (Hugging Face's key-only padding mask)
      mine = ids[b] == ids[b, i] if ids[b, i] > 0 else ids[b] > 0
      mask[b, i] = mine & (ids[b] > 0) & near
  return mask


@pytest.mark.parametrize("window", [None, 4])
def test_dense_mask_is_the_hand_built_mask(window):
  _, _, _, segments = _inputs()
  got = np.asarray(segments.dense_mask(window))[:, 0]
  np.testing.assert_array_equal(got, _hand_mask(np.asarray(segments.ids), window))


def test_unpacked_mask_is_the_key_padding_mask():
  mask = jnp.asarray([[1, 1, 0, 0]])
  got = attention.Segments.of(mask, None).dense_mask()
  assert got.shape == (1, 1, 1, 4)
  np.testing.assert_array_equal(np.asarray(got)[0, 0, 0], [True, True, False, False])


def _masked_loss(backend, window):
  _, _, _, segments = _inputs()
  real = (segments.ids > 0)[..., None, None]

  def loss(q, k, v):
    out = attention.attend(q, k, v, segments, backend=backend, window=window)
    return jnp.sum(jnp.where(real, out, 0.0) ** 2), out
  return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))


@pytest.mark.parametrize("window", [None, 4])
def test_splash_equals_dot_at_real_tokens_values_and_gradients(window):
  q, k, v, segments = _inputs()
  (_, want), want_grads = _masked_loss("dot", window)(q, k, v)
  (_, got), got_grads = _masked_loss("splash", window)(q, k, v)
  real = np.asarray(segments.ids) > 0
  np.testing.assert_allclose(np.asarray(got)[real], np.asarray(want)[real], atol=1e-5, rtol=0)
  for name, g, w in zip("qkv", got_grads, want_grads):
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=1e-5, rtol=0, err_msg=name)


def test_dot_is_the_explicit_softmax_over_the_hand_mask():
  q, k, v, segments = _inputs()
  want = jnp.einsum("bnts,bsnd->btnd", attention.probabilities(q, k, jnp.asarray(_hand_mask(
      np.asarray(segments.ids), 4))[:, None]), v)
  got = attention.attend(q, k, v, segments, backend="dot", window=4)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5)


@pytest.mark.parametrize("window", [None, 4])
def test_heads_first_is_dot_in_the_other_layout(window):
  q, k, v, segments = _inputs()
  want = attention.attend(q, k, v, segments, backend="dot", window=window)
  heads_first = [jnp.swapaxes(x, 1, 2) for x in (q, k, v)]
  got = jnp.swapaxes(attention.attend_heads_first(*heads_first, segments, window), 1, 2)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-6, rtol=0)
  assert float(jnp.abs(want).max()) > 0.5  # not a comparison of zeros


def test_bert_inference_path_equals_the_explicit_path():
  """BertModel's deterministic forward (heads-first) against the same model asked for its attentions
  (the explicit probabilities path), on packed rows with padding."""
  from bert_jax.models import bert  # pylint: disable=import-outside-toplevel
  from bert_jax.models.config import ModelConfig  # pylint: disable=import-outside-toplevel
  config = ModelConfig(vocab_size=50, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32,
                       max_position_embeddings=T, hidden_dropout=0.0, attention_dropout=0.0)
  _, _, _, segments = _inputs(length=T)
  ids = np.asarray(segments.ids)
  input_ids = jnp.asarray(np.random.RandomState(1).randint(1, 50, ids.shape) * (ids > 0), jnp.int32)
  positions = jnp.asarray(np.arange(T)[None].repeat(B, 0), jnp.int32)
  model = bert.BertModel(config)
  mask = jnp.asarray(ids > 0, jnp.int32)
  params = jax.jit(model.init)(jax.random.key(0), input_ids, mask)["params"]
  run = lambda attentions: jax.jit(functools.partial(model.apply, output_attentions=attentions))(  # noqa: E731
      {"params": params}, input_ids, mask, position_ids=positions, document_ids=segments.ids).last_hidden_state
  want, got = np.asarray(run(True)), np.asarray(run(False))
  real = ids > 0
  np.testing.assert_allclose(got[real], want[real], atol=1e-5, rtol=0)
  assert np.abs(want[real]).max() > 0.5


HEADS = (("batch", ("data", "fsdp")), ("heads", "tensor"), ("length", None))
SEQUENCE = (("batch", ("data", "fsdp")), ("heads", None), ("length", "tensor"))


@pytest.mark.parametrize("rules,length,nested", [(HEADS, T, False), (SEQUENCE, 2 * T, False), (HEADS, T, True)],
                         ids=["heads", "sequence", "in-data-shard-map"])
def test_splash_in_shard_map_over_the_mesh(rules, length, nested):
  """Inside the train step's context (a 2x2x2 mesh and logical rules), with the layer kind traced (scanned
  layers): global for one call, windowed for the other, each equal to dot's. Heads split over tensor, or
  the queries (sequence sharding); nested: inside a shard_map already manual over the data axes, as the
  gradient accumulation runs the model."""
  q, k, v, segments = _inputs(length)
  mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"), axis_types=(jax.sharding.AxisType.Auto,) * 3)
  rows = P(("data", "fsdp"))

  def splash(q, k, v, ids, is_global):
    return attention.attend(q, k, v, attention.Segments(ids, True), backend="splash", window=4,
                            is_global=is_global)
  if nested:
    splash = jax.shard_map(splash, mesh=mesh.abstract_mesh, in_specs=(rows,) * 4 + (P(),), out_specs=rows,
                           axis_names={"data", "fsdp"}, check_vma=False)

  def run(*args):
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), nn.logical_axis_rules(rules):
      return splash(*args)
  step = jax.jit(run, in_shardings=(NamedSharding(mesh, rows),) * 4 + (NamedSharding(mesh, P()),))
  real = np.asarray(segments.ids) > 0
  for is_global, window in ((True, None), (False, 4)):
    got = step(q, k, v, segments.ids, jnp.asarray(is_global))
    want = attention.attend(q, k, v, segments, backend="dot", window=window)
    np.testing.assert_allclose(np.asarray(got)[real], np.asarray(want)[real], atol=1e-5, rtol=0)


def test_cudnn_gets_dots_mask(monkeypatch):
  """No GPU here: cudnn is checked for what it is handed (the dot path's mask, implementation='cudnn')."""
  calls = []
  monkeypatch.setattr(jax.nn, "dot_product_attention", lambda *a, **kw: calls.append(kw) or a[0])
  q, k, v, segments = _inputs()
  attention.attend(q, k, v, segments, backend="cudnn", window=4)
  attention.attend(q, k, v, segments, backend="dot", window=4)
  assert [c["implementation"] for c in calls] == ["cudnn", "xla"]
  np.testing.assert_array_equal(np.asarray(calls[0]["mask"]), np.asarray(calls[1]["mask"]))


def test_splash_refuses_lengths_it_cannot_tile():
  q = jnp.zeros((1, 100, N, D))
  with pytest.raises(UserError, match="multiple of 128"):
    attention.attend(q, q, q, attention.Segments(jnp.ones((1, 100), jnp.int32)), backend="splash")


def test_rope_rotates_each_pair_as_numpy_does():
  rng = np.random.RandomState(1)
  x = rng.randn(2, 5, 3, 8).astype(np.float32)
  positions = np.array([[0, 1, 2, 3, 4], [0, 1, 0, 1, 2]])  # the second row: two packed documents
  theta = 10_000.0
  got = np.asarray(rope.rotate(jnp.asarray(x), jnp.asarray(positions), rope.inverse_frequencies(8, theta)))
  half = 4
  freq = theta ** (-np.arange(half) * 2.0 / 8)
  angle = positions[:, :, None, None] * freq  # [B, T, 1, D/2]
  x1, x2 = x[..., :half], x[..., half:]
  want = np.concatenate([x1 * np.cos(angle) - x2 * np.sin(angle), x2 * np.cos(angle) + x1 * np.sin(angle)], -1)
  np.testing.assert_allclose(got, want, atol=1e-5)
  # A document's positions restart: its rotation is the same wherever it sits in the row.
  np.testing.assert_allclose(got[1, 2:], np.asarray(rope.rotate(jnp.asarray(x[1:, 2:]), jnp.asarray(
      positions[1:, 2:]), rope.inverse_frequencies(8, theta)))[0], atol=1e-6)


def test_attention_probabilities_fall_back_to_dot_and_say_so(capsys):
  """BERTology's outputs need the probabilities: under splash they come from the dot path, with one line."""
  from bert_jax.models import BertModel, ModelConfig
  config = ModelConfig(vocab_size=64, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                       attention_dropout=0.0)
  ids = jnp.asarray(np.random.RandomState(0).randint(1, 64, (2, 8)))
  params = jax.jit(BertModel(config).init)(jax.random.key(0), ids)["params"]
  probabilities = lambda model: jax.jit(functools.partial(model.apply, output_attentions=True))  # noqa: E731
  want = probabilities(BertModel(config))({"params": params}, ids).attentions
  capsys.readouterr()
  got = probabilities(BertModel(config.replace(attention="splash")))({"params": params}, ids)
  np.testing.assert_array_equal(np.asarray(got.attentions), np.asarray(want))
  assert capsys.readouterr().out.strip() == ("model.attention='splash': attention probabilities and head masks "
                                             "are computed with 'dot'")


def _packed_bert_batch(vocab):
  """Two rows of 128: two packed documents (50 and 40 tokens) and padding, a full row; BERT's pretraining
  inputs with each document's positions starting at 0 and 6 masked positions a row."""
  rng = np.random.RandomState(3)
  doc_ids, positions = np.zeros((2, T), np.int32), np.zeros((2, T), np.int32)
  doc_ids[0, :50], doc_ids[0, 50:90], doc_ids[1] = 1, 2, 1
  positions[0, :50], positions[0, 50:90], positions[1] = np.arange(50), np.arange(40), np.arange(T)
  ids = rng.randint(5, vocab, (2, T)) * (doc_ids > 0)
  picks = np.asarray([[2, 30, 49, 50, 60, 89], [1, 20, 64, 90, 100, 127]], np.int32)
  return {"input_ids": ids.astype(np.int32), "input_mask": (doc_ids > 0).astype(np.int32),
          "segment_ids": np.zeros_like(ids, np.int32), "document_ids": doc_ids, "position_ids": positions,
          "masked_lm_positions": picks, "masked_lm_ids": np.take_along_axis(ids, picks, 1).astype(np.int32),
          "masked_lm_weights": np.ones(picks.shape, np.float32), "next_sentence_labels": np.zeros(2, np.int32)}


def test_bert_pretraining_loss_and_gradients_under_splash_equal_dot_on_packed_rows(monkeypatch):
  """BERT's masked-LM loss and every parameter's gradient, packed rows (segment ids) through splash's kernel
  (Pallas interpret mode) against the dense mask (dot): the same numbers, so packed BERT batches need no
  dense mask."""
  from bert_jax.models import build, model_config  # pylint: disable=import-outside-toplevel
  from bert_jax.training import objectives  # pylint: disable=import-outside-toplevel
  from bert_jax.training.objectives.base import mlm_sums  # pylint: disable=import-outside-toplevel
  vocab = 64
  batch = _packed_bert_batch(vocab)
  inputs = objectives.model_inputs(batch)

  config = model_config(dict(vocab_size=vocab, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=48,
                             max_position_embeddings=T, attention_dropout=0.0, hidden_dropout=0.0, use_pooler=False,
                             sentence_head="none"))
  params = nn.meta.unbox(jax.jit(build(config).init)(jax.random.key(0), **inputs)["params"])

  def loss_and_grads(backend):
    model = build(config.replace(attention=backend))
    loss = lambda p: mlm_sums(model.apply({"params": p}, **inputs).mlm_logits, batch)["mlm_loss"]  # noqa: E731
    return jax.jit(jax.value_and_grad(loss))(params)

  kernels = []
  monkeypatch.setattr(attention, "_splash", lambda *args, run=attention._splash: kernels.append(1) or run(*args))
  (want, want_grads), (got, got_grads) = loss_and_grads("dot"), loss_and_grads("splash")
  assert kernels  # the layer ran splash's kernel (the forward traced once)
  assert float(want) > 1.0  # ~12 predictions x ln(64)
  np.testing.assert_allclose(float(got), float(want), rtol=1e-5)
  flat_want, flat_got = jax.tree.leaves(want_grads), jax.tree.leaves(got_grads)
  assert len(flat_want) == len(flat_got) > 10
  for w, g in zip(flat_want, flat_got):
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=2e-5, rtol=1e-4)
  assert max(float(jnp.abs(w).max()) for w in flat_want) > 1e-2  # not a comparison of zeros


@pytest.mark.parametrize("backend,length,platform,dropout,want", [
    ("auto", 512, "tpu", 0.0, "splash"), ("auto", 128, "tpu", 0.0, "dot"), ("auto", 100, "tpu", 0.0, "dot"),
    ("auto", 512, "cpu", 0.0, "dot"), ("auto", 512, "gpu", 0.0, "dot"), ("auto", 512, "tpu", 0.1, "dot"),
    ("dot", 512, "tpu", 0.0, "dot"), ("splash", 512, "cpu", 0.0, "splash")])
def test_auto_runs_splash_only_compiled_for_tpu_without_attention_dropout(backend, length, platform, dropout, want):
  model = type("Model", (), {"attention": backend, "attention_dropout": dropout})()
  assert attention.configured(model, length, platform) == want
  attention.check(model, length, platform)  # auto is refused nowhere


def test_bert_large_gets_splash_at_512_tokens_on_tpu_and_dot_with_berts_attention_dropout():
  """The recipe switch is one field: the large preset (no attention dropout, `auto`) runs splash when compiled
  for TPU; model.attention_dropout=0.1 (BERT's recipe) runs dot; splash asked for with it is refused."""
  from bert_jax.config_utils import load_config  # pylint: disable=import-outside-toplevel
  from bert_jax.models import model_config  # pylint: disable=import-outside-toplevel
  phase2 = ["--config.data.max_seq_length=512"]
  large = load_config("configs/bert.py:large", phase2).model
  assert (large.attention, large.attention_dropout) == ("auto", 0.0)
  assert attention.configured(large, 512, "tpu") == "splash"
  bert = load_config("configs/bert.py:large", phase2 + ["--config.model.attention_dropout=0.1"]).model
  assert attention.configured(bert, 512, "tpu") == "dot"
  model_config(bert)  # auto with dropout is a valid model
  with pytest.raises(UserError, match="model.attention='splash' has no dropout on the attention probabilities"):
    model_config(load_config("configs/bert.py:large", phase2 + ["--config.model.attention_dropout=0.1",
                                                                "--config.model.attention=splash"]).model)
