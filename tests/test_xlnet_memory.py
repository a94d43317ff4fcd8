"""XLNet pretraining with memory across steps (models/xlnet.py bi_data, training/objectives/xlnet.py,
data_pipelines/xlnet_stream.py): bi_data's relative positions against transformers' XLNetModel, the stream
layout on a hand-made corpus, the memory carried by the train state, and exact resume."""
import dataclasses

import jax.numpy as jnp
import numpy as np
import torch
import transformers

import bert_jax

VOCAB = 50


def test_bi_data_positions_match_transformers(tmp_path):
  """bi_data (and clamp_len) on a memory: the batch's second half reads its distances negated, as transformers'
  relative_positional_encoding."""
  config = transformers.XLNetConfig(vocab_size=VOCAB, d_model=32, n_layer=2, n_head=4, d_inner=37, mem_len=3,
                                    bi_data=True, clamp_len=5)
  torch.manual_seed(0)
  hf = transformers.XLNetLMHeadModel(config).eval()
  with torch.no_grad():
    for name, p in hf.named_parameters():
      if name.endswith(("_bias", "seg_embed", "mask_emb", "layer_norm.bias", "lm_loss.bias")):
        p.normal_(0.0, 0.3)
  hf.save_pretrained(tmp_path / "hf")
  model, params = bert_jax.load_pretrained(str(tmp_path / "hf"))
  assert model.config.bi_data and model.config.clamp_len == 5
  rs = np.random.RandomState(0)
  ids = rs.randint(6, VOCAB, (4, 6))
  types = np.zeros_like(ids)
  types[:, 3:] = 1
  mems = rs.normal(size=(2, 4, 3, 32)).astype(np.float32)  # [L, B, M, H]
  with torch.no_grad():
    ref = hf(torch.tensor(ids), token_type_ids=torch.tensor(types), use_mems=True,
             mems=[torch.tensor(m).transpose(0, 1) for m in mems], output_hidden_states=True)
  out = model.apply({"params": params}, jnp.asarray(ids), None, jnp.asarray(types), mems=jnp.asarray(mems))
  np.testing.assert_allclose(np.asarray(out.last_hidden_state), ref.hidden_states[-1].numpy(), atol=1e-5)
  np.testing.assert_allclose(np.asarray(out.mlm_logits), ref.logits.numpy(), atol=1e-5)
  forward = model.clone(config=dataclasses.replace(model.config, bi_data=False))
  plain = forward.apply({"params": params}, jnp.asarray(ids), None, jnp.asarray(types), mems=jnp.asarray(mems))
  np.testing.assert_allclose(plain.last_hidden_state[:2], out.last_hidden_state[:2], atol=1e-6)
  assert np.abs(np.asarray(plain.last_hidden_state[2:] - out.last_hidden_state[2:])).max() > 1e-3  # what the test above checks
