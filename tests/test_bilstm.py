"""The BiLSTM student (models/bilstm.py) against PyTorch's nn.LSTM: a 2-layer bidirectional LSTM over a padded
batch (packed sequences), its outputs at real tokens, its final states and the ReLU layer over them; and
its parameter count formula."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.models import families
from bert_jax.models.bilstm import BiLSTMConfig, parameter_count

torch = pytest.importorskip("torch")


def _torch_lstm(params, config):
  """nn.LSTM(bidirectional) with the flax cells' weights: PyTorch's gate order is i, f, g, o; its input
  weights [4U, in] and recurrent weights [4U, U] hold the flax kernels transposed; flax's input maps have no bias."""
  lstm = torch.nn.LSTM(config.embedding_size, config.lstm_size, num_layers=config.num_layers, bidirectional=True,
                       batch_first=True)
  state = {}
  for layer in range(config.num_layers):
    for direction, suffix in (("forward", ""), ("backward", "_reverse")):
      cell = params[f"{direction}_{layer}"]["cell"]
      w = lambda names: torch.tensor(np.concatenate([np.asarray(cell[n]["kernel"]).T for n in names]))  # noqa: E731
      state[f"weight_ih_l{layer}{suffix}"] = w(["ii", "if", "ig", "io"])
      state[f"weight_hh_l{layer}{suffix}"] = w(["hi", "hf", "hg", "ho"])
      state[f"bias_hh_l{layer}{suffix}"] = torch.tensor(np.concatenate(
          [np.asarray(cell[n]["bias"]) for n in ["hi", "hf", "hg", "ho"]]))
      state[f"bias_ih_l{layer}{suffix}"] = torch.zeros(4 * config.lstm_size)
  lstm.load_state_dict(state)
  return lstm


def test_the_bilstm_equals_torch_lstm_on_a_padded_batch():
  config = BiLSTMConfig(vocab_size=40, embedding_size=6, lstm_size=5, num_layers=2, hidden_size=7, hidden_dropout=0.0)
  lengths = np.array([7, 3, 5, 1])
  ids = np.random.default_rng(0).integers(1, 40, size=(4, 7))
  mask = (np.arange(7)[None] < lengths[:, None]).astype(np.int32)
  ids = ids * mask
  model = families.build(config)
  params = model.init(jax.random.key(0), jnp.asarray(ids), jnp.asarray(mask))["params"]
  out = model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask))

  lstm = _torch_lstm(params, config)
  embedded = torch.tensor(np.asarray(params["word_embeddings"]["embedding"])[ids])
  packed = torch.nn.utils.rnn.pack_padded_sequence(embedded, torch.tensor(lengths), batch_first=True,
                                                   enforce_sorted=False)
  with torch.no_grad():
    outputs, (h_n, _) = lstm(packed)
    outputs, _ = torch.nn.utils.rnn.pad_packed_sequence(outputs, batch_first=True, total_length=7)
    finals = torch.cat([h_n[-2], h_n[-1]], dim=-1)  # the last layer's forward and backward final states
    pooled = torch.relu(finals @ torch.tensor(np.asarray(params["pooler"]["kernel"]))
                        + torch.tensor(np.asarray(params["pooler"]["bias"])))
  np.testing.assert_allclose(np.asarray(out.last_hidden_state), outputs.numpy(), atol=1e-5)  # padding: 0 in both
  np.testing.assert_allclose(np.asarray(out.pooled_output), pooled.numpy(), atol=1e-5)
  assert sum(x.size for x in jax.tree.leaves(params)) == parameter_count(config.to_dict())
