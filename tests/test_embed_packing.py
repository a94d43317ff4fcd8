"""The Embedder's packed rows (several sentences per row, attention kept within each): the packing against
hand counts, packed pooling against `pool` on rows of their own, and tiny BERT (absolute and RoBERTa
positions) and ModernBERT (local windows) encoders packed against the same sentences one per row."""
import inspect

import numpy as np
import pytest

import jax
import jax.numpy as jnp

from bert_jax.models import ModelConfig, families
from bert_jax.models.modernbert import ModernBertConfig
from bert_jax.models.pooling import Pooling, pool_segments
from bert_jax.sbert import embed
from bert_jax.sbert.model import SentenceEncoder


def test_pack_rows_fills_rows_best_fit_longest_first():
  lengths = [5, 3, 4, 2, 10, 7, 12, 2]
  got = embed.pack_rows(lengths, (8, 12))
  # Longest first: 12 and 10 open 12-wide rows (2 free after 10); 7, 5 and 4 open 8-wide rows (1, 3 and 4
  # free; 7's is closed, too small for any sentence); 3 fills the 3-free row (closed: 2 sentences at most
  # in 8), the first 2 fills the gap after 10 in its 12-wide row, the second 2 the 4-free row.
  assert got == {8: [[5], [0, 1], [2, 7]], 12: [[6], [4, 3]]}
  assert embed.slots_for(8) == 2
  many = embed.pack_rows([2] * 5, (8,))  # at most slots_for(8) = 2 sentences a row
  assert many == {8: [[0, 1], [2, 3], [4]]}


@pytest.mark.parametrize("modes,normalize", [(("mean",), True), (("max", "cls", "mean_sqrt_len_tokens"), False)])
def test_pooling_packed_rows_matches_pooling_each_sentence_alone(modes, normalize):
  rng = np.random.default_rng(0)
  hidden = rng.normal(size=(2, 9, 5)).astype(np.float32)
  docs = np.array([[1, 1, 1, 2, 2, 3, 3, 3, 0], [1, 1, 1, 1, 1, 1, 1, 0, 0]], np.int32)
  pooling = Pooling(modes, normalize, 9)
  got = np.asarray(pooling.packed(jnp.asarray(hidden), jnp.asarray(docs), 4))
  assert got.shape == (2, 4, pooling.dimension(5))
  for r, d in [(0, 1), (0, 2), (0, 3), (1, 1)]:
    alone = pooling(jnp.asarray(hidden[r:r + 1]), jnp.asarray((docs[r:r + 1] == d).astype(np.int32)))
    np.testing.assert_allclose(got[r, d - 1], np.asarray(alone)[0], rtol=1e-6, atol=1e-6)
  assert pool_segments(jnp.asarray(hidden), jnp.asarray(docs), 4, ("mean",)).shape == (2, 4, 5)


CONFIGS = {
    "bert": ModelConfig(vocab_size=64, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32,
                        max_position_embeddings=40, hidden_dropout=0.0, attention_dropout=0.0),
    "roberta positions": ModelConfig(vocab_size=64, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32,
                                     max_position_embeddings=44, hidden_dropout=0.0, attention_dropout=0.0,
                                     position_style="roberta", pad_token_id=1),
    "modernbert": ModernBertConfig(vocab_size=64, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=24,
                                   global_every=2, local_window=6, pad_token_id=0, max_position_embeddings=40),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_packed_rows_embed_each_sentence_as_a_row_of_its_own(name):
  model = SentenceEncoder(CONFIGS[name], Pooling(("mean", "max"), True, 32))
  assert embed.can_pack(model)
  rng = np.random.default_rng(1)
  sentences = [list(rng.integers(5, 64, n)) for n in (2, 7, 3, 12, 5, 9, 30, 4)]
  # init compiled whole (eager, each of its ops compiles on its own)
  params = jax.jit(model.init)(jax.random.key(0), jnp.ones((1, 4), jnp.int32), jnp.ones((1, 4), jnp.int32))["params"]
  ids, mask = np.zeros((len(sentences), 32), np.int32), np.zeros((len(sentences), 32), np.int32)
  for i, s in enumerate(sentences):
    ids[i, :len(s)], mask[i, :len(s)] = s, 1
  alone = np.asarray(jax.jit(model.apply)({"params": params}, ids, mask))  # one sentence per row, padded
  packed = embed.pack_rows([len(s) for s in sentences], (16, 32))
  assert sorted(len(r) for r in packed[16]) != [1] * len(packed[16])  # some row holds several sentences
  forward = jax.jit(embed.packed_apply(model))
  got = np.zeros_like(alone)
  for width, rows in packed.items():
    out = np.asarray(forward(params, *embed.packed_arrays([[sentences[i] for i in row] for row in rows], width, 0)))
    assert out.shape == (len(rows), embed.slots_for(width), alone.shape[1])
    for r, row in enumerate(rows):
      got[row] = out[r, :len(row)]
  np.testing.assert_allclose(got, alone, atol=2e-6)


def test_the_records_packs_capability_is_what_each_module_takes():
  """A family record's `packs` (sbert/embed.py reads it) against the module's own signature: the families whose
  module takes document_ids and position_ids, and no other."""
  takes = {}
  for name in families.names():
    module = families.get(name).module
    params = inspect.signature(module.__call__).parameters
    takes[name] = "document_ids" in params and "position_ids" in params
    assert families.get(name).packs == takes[name], name
  assert takes["bert"] and takes["modernbert"] and not takes["t5"] and not takes["xlnet"]
