"""Hugging Face checkpoints: parity with the transformers PyTorch models, exact round trips, bad input."""
import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import safetensors.numpy  # noqa: E402

import bert_jax  # noqa: E402
from bert_jax.conversion import hf  # noqa: E402
from bert_jax.errors import UserError  # noqa: E402

TOL = 1e-5
SIZES = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
             hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
# family: (transformers model class, config class, config overrides, {bert_jax output: HF output})
FAMILIES = {
    "bert": ("BertForPreTraining", "BertConfig", dict(max_position_embeddings=64),
             {"mlm_logits": "prediction_logits", "nsp_logits": "seq_relationship_logits"}),
    "roberta": ("RobertaForMaskedLM", "RobertaConfig", dict(max_position_embeddings=66, pad_token_id=1,
                                                             type_vocab_size=1, layer_norm_eps=1e-5),
                {"mlm_logits": "logits"}),
    "albert": ("AlbertForPreTraining", "AlbertConfig", dict(embedding_size=16, max_position_embeddings=64),
               {"mlm_logits": "prediction_logits", "sop_logits": "sop_logits"}),
    "electra_generator": ("ElectraForMaskedLM", "ElectraConfig", dict(embedding_size=16, max_position_embeddings=64),
                          {"mlm_logits": "logits"}),
    "electra_discriminator": ("ElectraForPreTraining", "ElectraConfig",
                              dict(embedding_size=32, max_position_embeddings=64), {"rtd_logits": "logits"}),
}


def build_hf(family, seed=0, **overrides):
  cls_name, config_name, extra, _ = FAMILIES[family]
  torch.manual_seed(seed)
  config = getattr(transformers, config_name)(**{**SIZES, **extra, **overrides})
  model = getattr(transformers, cls_name)(config).eval()
  with torch.no_grad():  # random, non-trivial LayerNorms and biases, so a swapped tensor shows
    for name, p in model.named_parameters():
      if name.endswith("bias") or "LayerNorm" in name or "layer_norm" in name:
        p.add_(torch.randn_like(p) * 0.1)
  return model


def padded_batch(pad_id=0, type_vocab=2, vocab=100):
  """Right-padded rows of different lengths with two segments."""
  rng = np.random.RandomState(1)
  lengths = np.array([9, 5, 7])
  mask = (np.arange(9)[None] < lengths[:, None]).astype(np.int64)
  ids = np.where(mask, rng.randint(3, vocab, (3, 9)), pad_id)
  types = ((np.arange(9)[None] >= lengths[:, None] // 2) * mask) if type_vocab > 1 else np.zeros_like(ids)
  return ids, mask, types


def hf_outputs(model, family, ids, mask, types):
  with torch.no_grad():
    out = model(torch.tensor(ids), attention_mask=torch.tensor(mask), token_type_ids=torch.tensor(types),
                output_hidden_states=True)
  result = {"last_hidden_state": out.hidden_states[-1].numpy()}
  result.update({ours: getattr(out, theirs).numpy() for ours, theirs in FAMILIES[family][3].items()})
  if family in ("bert", "albert"):
    base = model.bert if family == "bert" else model.albert
    with torch.no_grad():
      result["pooled_output"] = base(torch.tensor(ids), attention_mask=torch.tensor(mask),
                                     token_type_ids=torch.tensor(types)).pooler_output.numpy()
  return result


def max_differences(model, params, reference, ids, mask, types):
  out = model.apply({"params": params}, jnp.asarray(ids), attention_mask=jnp.asarray(mask),
                    token_type_ids=jnp.asarray(types), deterministic=True)
  present = {k for k in ("pooled_output", "mlm_logits", "nsp_logits", "sop_logits", "rtd_logits")
             if getattr(out, k) is not None}
  assert present | {"last_hidden_state"} == set(reference)
  return {k: float(np.abs(np.asarray(getattr(out, k)) - v).max()) for k, v in reference.items()}


@pytest.mark.parametrize("scan_layers", [True, False])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_parity_with_transformers(tmp_path, family, scan_layers):
  hf_model = build_hf(family)
  hf_model.save_pretrained(tmp_path)
  cfg = hf_model.config
  ids, mask, types = padded_batch(cfg.pad_token_id or 0, cfg.type_vocab_size)
  model, params = bert_jax.load_pretrained(str(tmp_path), scan_layers=scan_layers)
  assert model.config.scan_layers == scan_layers
  assert ("layers" in params["encoder"]) == scan_layers
  diffs = max_differences(model, params, hf_outputs(hf_model, family, ids, mask, types), ids, mask, types)
  print(family, scan_layers, diffs)
  assert max(diffs.values()) <= TOL, diffs


def _state(directory):
  return safetensors.numpy.load_file(os.path.join(directory, "model.safetensors"))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_hf_round_trip_is_exact(tmp_path, family):
  hf_model = build_hf(family, seed=3)
  hf_model.save_pretrained(tmp_path / "src")
  hf.write(str(tmp_path / "dst"), hf.read(str(tmp_path / "src")))
  original, written = _state(tmp_path / "src"), _state(tmp_path / "dst")
  assert sorted(written) == sorted(original)
  for name, value in original.items():
    np.testing.assert_array_equal(written[name], value, err_msg=name)
  reloaded = type(hf_model).from_pretrained(tmp_path / "dst").eval()
  ids, mask, types = padded_batch(hf_model.config.pad_token_id or 0, hf_model.config.type_vocab_size)
  for key, value in hf_outputs(hf_model, family, ids, mask, types).items():
    np.testing.assert_array_equal(hf_outputs(reloaded, family, ids, mask, types)[key], value, err_msg=key)


def save_as_bin(model, directory):
  """The pre-safetensors layout: config.json + a torch.save'd state dict."""
  model.config.save_pretrained(directory)
  torch.save(model.state_dict(), os.path.join(directory, "pytorch_model.bin"))


def test_pytorch_bin_reads_like_safetensors(tmp_path):
  hf_model = build_hf("bert")
  hf_model.save_pretrained(tmp_path / "st")
  save_as_bin(hf_model, tmp_path / "bin")
  from_bin, from_st = hf.read_weights(str(tmp_path / "bin")), hf.read_weights(str(tmp_path / "st"))
  for name, value in from_st.items():
    np.testing.assert_array_equal(from_bin[name], value, err_msg=name)


def test_bare_model_heads_are_off_or_fresh(tmp_path, capsys):
  torch.manual_seed(0)
  transformers.BertModel(transformers.BertConfig(**SIZES)).save_pretrained(tmp_path)
  model, params = bert_jax.load_pretrained(str(tmp_path))
  assert "no weights for mlm, sentence" in capsys.readouterr().out
  assert (model.config.use_pooler, model.config.mlm_head, model.config.sentence_head) == (True, False, "none")
  model, params = bert_jax.load_pretrained(str(tmp_path), init_missing_heads=True)
  assert "initialised fresh" in capsys.readouterr().out
  assert (model.config.mlm_head, model.config.sentence_head) == (True, "nsp")
  assert jax.tree.map(np.shape, params) == jax.tree.map(np.shape, nn.meta.unbox(jax.eval_shape(
      lambda: model.init(jax.random.key(0), jnp.ones((1, 4), jnp.int32))))["params"])


def _saved_bert(tmp_path):
  build_hf("bert").save_pretrained(tmp_path)
  return str(tmp_path), os.path.join(tmp_path, "model.safetensors")


def test_unknown_architecture(tmp_path):
  directory, _ = _saved_bert(tmp_path)
  with open(os.path.join(directory, "config.json")) as f:
    config = json.load(f)
  config.update(model_type="gpt2", architectures=["GPT2LMHeadModel"])
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump(config, f)
  with pytest.raises(UserError, match="unknown architecture GPT2LMHeadModel"):
    bert_jax.load_pretrained(directory)


def test_missing_tensor_is_named(tmp_path):
  directory, weights = _saved_bert(tmp_path)
  tensors = safetensors.numpy.load_file(weights)
  del tensors["bert.encoder.layer.1.output.dense.bias"]
  safetensors.numpy.save_file(tensors, weights, metadata={"format": "pt"})
  with pytest.raises(UserError, match=r"missing tensors bert\.encoder\.layer\.1\.output\.dense\.bias"):
    bert_jax.load_pretrained(directory)


def test_shape_mismatch_names_tensor_and_shapes(tmp_path):
  directory, weights = _saved_bert(tmp_path)
  tensors = safetensors.numpy.load_file(weights)
  tensors["bert.encoder.layer.0.intermediate.dense.weight"] = np.zeros((40, 32), np.float32)
  safetensors.numpy.save_file(tensors, weights, metadata={"format": "pt"})
  with pytest.raises(UserError, match=r"intermediate\.dense\.weight: checkpoint \(40, 32\) vs config \(37, 32\)"):
    bert_jax.load_pretrained(directory)


@pytest.mark.parametrize("safe", [True, False])
def test_truncated_weights(tmp_path, safe):
  if safe:
    build_hf("bert").save_pretrained(tmp_path)
  else:
    save_as_bin(build_hf("bert"), tmp_path)
  weights = os.path.join(tmp_path, "model.safetensors" if safe else "pytorch_model.bin")
  with open(weights, "rb") as f:
    data = f.read()
  with open(weights, "wb") as f:
    f.write(data[:len(data) // 2])
  with pytest.raises(UserError, match="truncated"):
    bert_jax.load_pretrained(str(tmp_path))


def test_pickle_with_code_is_refused(tmp_path):
  torch.save({"w": torch.zeros(2), "evil": print}, tmp_path / "pytorch_model.bin")
  from bert_jax.conversion.torch_zip import load_torch_zip
  with pytest.raises(UserError, match="refusing to unpickle .*print"):
    load_torch_zip(str(tmp_path / "pytorch_model.bin"))
