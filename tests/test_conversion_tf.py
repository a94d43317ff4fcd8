"""Original TF1 checkpoints: written here with tf.compat.v1 variables and a Saver under the names of
google-research/bert, albert and electra, loaded, and compared with the transformers model they hold."""
import glob
import json
import os
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tf = pytest.importorskip("tensorflow")
tf.config.set_visible_devices([], "GPU")

import bert_jax  # noqa: E402
from bert_jax.conversion import tf_checkpoint  # noqa: E402
from bert_jax.errors import UserError  # noqa: E402
from test_conversion_hf import TOL, build_hf, hf_outputs, max_differences, padded_batch  # noqa: E402

_ALBERT = [("albert.", "bert/"), ("encoder.albert_layer_groups.0.albert_layers.0.", "encoder/transformer/group_0/inner_group_0/"),
           ("attention.query", "attention_1/self/query"), ("attention.key", "attention_1/self/key"),
           ("attention.value", "attention_1/self/value"), ("attention.dense", "attention_1/output/dense"),
           ("attention.LayerNorm", "LayerNorm"), ("ffn_output", "ffn_1/intermediate/output/dense"),
           ("ffn.", "ffn_1/intermediate/dense."), ("full_layer_layer_norm", "LayerNorm_1"),
           ("bert/pooler.", "bert/pooler/dense."), ("predictions.dense", "cls/predictions/transform/dense"),
           ("predictions.LayerNorm", "cls/predictions/transform/LayerNorm"), ("predictions.bias", "cls/predictions/output_bias"),
           ("sop_classifier.classifier.weight", "cls/seq_relationship/output_weights"),
           ("sop_classifier.classifier.bias", "cls/seq_relationship/output_bias")]
_BERT = [("cls.predictions.bias", "cls/predictions/output_bias"),
         ("cls.seq_relationship.weight", "cls/seq_relationship/output_weights"),
         ("cls.seq_relationship.bias", "cls/seq_relationship/output_bias"),
         ("discriminator_predictions.dense_prediction", "discriminator_predictions/dense_1"),
         ("generator_lm_head.bias", "generator_predictions/output_bias")]


def tf_variables(model, family, scope="bert"):
  """{original TF name: array} for a transformers model's state dict (TF kernels are [in, out])."""
  out = {}
  for name, value in model.state_dict().items():
    if name.endswith(("decoder.weight", "decoder.bias", "generator_lm_head.weight", "position_ids")):
      continue  # tied to the embeddings / the output bias
    value = value.numpy()
    for old, new in (_ALBERT if family == "albert" else _BERT):
      name = name.replace(old, new)
    name = re.sub(r"layer\.(\d+)\.", r"layer_\1.", name).replace(".", "/")
    name = re.sub(r"^(bert|electra)/", scope + "/", name)
    name = re.sub(r"(LayerNorm(?:_1)?)/weight$", r"\1/gamma", re.sub(r"(LayerNorm(?:_1)?)/bias$", r"\1/beta", name))
    if name.endswith("_embeddings/weight"):
      name = name[:-len("/weight")]
    elif name.endswith("/weight"):
      name, value = name[:-len("weight")] + "kernel", value.T
    out[name] = value
  return out


def save_tf1(variables, directory, config=None, config_name="bert_config.json"):
  os.makedirs(directory, exist_ok=True)
  with tf.Graph().as_default():
    tf_vars = [tf.compat.v1.Variable(v, name=n) for n, v in variables.items()]
    # Originals also hold the step and optimizer slots, which a loader must skip.
    tf_vars += [tf.compat.v1.Variable(np.int64(7), name="global_step"),
                tf.compat.v1.Variable(np.ones(3, np.float32), name="bert/pooler/dense/bias/adam_m")]
    saver = tf.compat.v1.train.Saver(tf_vars)
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      saver.save(sess, os.path.join(directory, "model.ckpt"))
  if config:
    with open(os.path.join(directory, config_name), "w") as f:
      json.dump(config, f)


def tf_config(model):
  c = model.config
  return {"vocab_size": c.vocab_size, "hidden_size": c.hidden_size, "num_hidden_layers": c.num_hidden_layers,
          "num_attention_heads": c.num_attention_heads, "intermediate_size": c.intermediate_size,
          "hidden_act": "gelu", "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
          "max_position_embeddings": c.max_position_embeddings, "type_vocab_size": c.type_vocab_size,
          "initializer_range": 0.02, "embedding_size": getattr(c, "embedding_size", c.hidden_size)}


def stored(prefix):
  reader = tf.train.load_checkpoint(prefix)
  return {n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map()}


def check_parity_and_round_trip(directory, hf_model, family, tmp_path, scopes, **load):
  """Outputs match the transformers model; writing back gives the variables under `scopes` exactly."""
  ids, mask, types = padded_batch()
  model, params = bert_jax.load_pretrained(str(directory), **load)
  diffs = max_differences(model, params, hf_outputs(hf_model, family, ids, mask, types), ids, mask, types)
  print(family, diffs)
  assert max(diffs.values()) <= TOL, diffs
  converted = tf_checkpoint.read(str(directory), **load)
  tf_checkpoint.write(str(tmp_path / "again"), converted)
  original, written = stored(str(directory / "model.ckpt")), stored(str(tmp_path / "again" / "model.ckpt"))
  expected = {n for n in original if n.startswith(scopes) and "adam" not in n}
  assert set(written) == expected
  for name in expected:
    np.testing.assert_array_equal(written[name], original[name], err_msg=name)


@pytest.mark.parametrize("family", ["bert", "albert"])
def test_original_checkpoint_parity(tmp_path, family):
  hf_model = build_hf(family, hidden_act="gelu_new")  # the TF code's "gelu" is the tanh approximation
  config_name = "albert_config.json" if family == "albert" else "bert_config.json"
  save_tf1(tf_variables(hf_model, family), tmp_path / "ckpt", tf_config(hf_model), config_name)
  check_parity_and_round_trip(tmp_path / "ckpt", hf_model, family, tmp_path, ("bert/", "cls/"),
                              scan_layers=family == "bert")


def test_original_electra_checkpoint_holds_both_models(tmp_path, capsys):
  discriminator = build_hf("electra_discriminator", hidden_act="gelu_new", embedding_size=16)
  generator = build_hf("electra_generator", seed=1, hidden_size=24, num_attention_heads=1, intermediate_size=48,
                       hidden_act="gelu_new")
  generator.electra.embeddings.load_state_dict(discriminator.electra.embeddings.state_dict())  # shared
  # transformers hard-codes exact GELU in this head; the original code uses the config's activation.
  generator.generator_predictions.activation = transformers.activations.get_activation("gelu_new")
  variables = tf_variables(discriminator, "electra", "electra")
  variables.update({n: v for n, v in tf_variables(generator, "electra", "generator").items()
                    if not n.startswith("generator/embeddings/")})
  save_tf1(variables, tmp_path / "ckpt", tf_config(discriminator))
  check_parity_and_round_trip(tmp_path / "ckpt", discriminator, "electra_discriminator", tmp_path / "d",
                              ("electra/", "discriminator_predictions/"))
  assert "holds a discriminator and a generator" in capsys.readouterr().out
  check_parity_and_round_trip(tmp_path / "ckpt", generator, "electra_generator", tmp_path / "g",
                              ("generator/", "generator_predictions/", "electra/embeddings/"),
                              electra_part="generator", scan_layers=False)


def test_truncated_checkpoint(tmp_path):
  hf_model = build_hf("bert")
  save_tf1(tf_variables(hf_model, "bert"), tmp_path, tf_config(hf_model))
  data = glob.glob(str(tmp_path / "model.ckpt.data-*"))[0]
  with open(data, "rb") as f:
    content = f.read()
  with open(data, "wb") as f:
    f.write(content[:len(content) // 3])
  with pytest.raises(UserError, match="truncated"):
    bert_jax.load_pretrained(str(tmp_path))


def test_tf_shape_mismatch_names_tensor(tmp_path):
  hf_model = build_hf("bert")
  config = dict(tf_config(hf_model), intermediate_size=40)
  save_tf1(tf_variables(hf_model, "bert"), tmp_path, config)
  with pytest.raises(UserError, match=r"bert/encoder/layer_0/intermediate/dense/kernel: checkpoint \(32, 37\) "
                                      r"vs config \(32, 40\)"):
    bert_jax.load_pretrained(str(tmp_path))


def test_config_json_with_fewer_layers_is_refused(tmp_path):
  hf_model = build_hf("bert")  # 2 layers
  save_tf1(tf_variables(hf_model, "bert"), tmp_path, dict(tf_config(hf_model), num_hidden_layers=1))
  with pytest.raises(UserError, match=r"says num_hidden_layers=1 but the checkpoint holds 2 layers"):
    bert_jax.load_pretrained(str(tmp_path))


@pytest.mark.parametrize("field, value, expected", [("hidden_size", "32", "an integer"),
                                                    ("hidden_dropout_prob", "0.1", "a number")])
def test_a_wrongly_typed_config_json_field_is_one_line(tmp_path, field, value, expected):
  """bert_config.json reads through the same typed reader as a Hugging Face config.json."""
  hf_model = build_hf("bert")
  save_tf1(tf_variables(hf_model, "bert"), tmp_path, dict(tf_config(hf_model), **{field: value}))
  with pytest.raises(UserError, match=f"bert_config.json: {field} is '{value}' \\(a string\\); expected {expected}"):
    bert_jax.load_pretrained(str(tmp_path))
