"""`bert-jax convert` end to end: HF -> bert_jax params checkpoint -> HF / TF, tokenizer included."""
import json
import os
import subprocess
import sys

import jax
import flax.linen as nn
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import safetensors.numpy  # noqa: E402

import bert_jax  # noqa: E402
from bert_jax.cli import main  # noqa: E402
from bert_jax.models import BertModel, ModelConfig  # noqa: E402
from bert_jax.training import checkpoint  # noqa: E402
from test_conversion_hf import build_hf  # noqa: E402

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "##s", "Dog", ".", "on"] + [
    f"w{i}" for i in range(88)]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
  """A cased HF BERT with its vocab, converted to a bert_jax params checkpoint by the CLI."""
  root = tmp_path_factory.mktemp("cli")
  model = build_hf("bert")
  model.save_pretrained(root / "hf")
  (root / "hf" / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
  (root / "hf" / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}))
  assert main(["convert", "--from", "hf", str(root / "hf"), str(root / "ours")]) == 0
  return root, model


def test_params_checkpoint_fits_init_from(converted):
  root, _ = converted
  params, config = checkpoint.load_params(str(root / "ours"))
  assert config["data"] == {"vocab": "vocab.txt", "tokenizer": "wordpiece", "lower_case": False,
                            "max_chars_per_word": 100}
  assert config["heads"] == ["pooler", "mlm", "sentence"]
  model = BertModel(ModelConfig.from_dict(config["model"]))
  abstract = jax.eval_shape(lambda: model.init(jax.random.key(1), jnp.ones((1, 4), jnp.int32)))["params"]
  checkpoint.check_shapes(params, nn.meta.unbox(abstract), "converted")  # what init_from checks


def test_tokenizer_travels(converted):
  root, _ = converted
  tokenizer = bert_jax.load_tokenizer(str(root / "ours"))
  assert tokenizer.encode("Dog sat on the cats.") == [9, 7, 11, 5, 6, 8, 10]
  assert tokenizer.vocab == VOCAB


def test_a_tokenizer_keeps_the_word_limit_of_where_it_came_from(converted):
  """HF's BertTokenizer makes a word over 100 characters [UNK]; Google's tokenizer (and a plain vocab.txt
  here) allows 200. The converted checkpoint keeps HF's limit, in its config.json."""
  from bert_jax.conversion import native
  root, _ = converted
  text = "the cat" + "s" * 147 + " sat"  # a 150-character word: cat ##s ##s ... under Google's limit
  hf = transformers.BertTokenizer(str(root / "hf" / "vocab.txt"), do_lower_case=False)
  assert hf.tokenize(text) == ["the", "[UNK]", "sat"]
  converted_tokenizer = bert_jax.load_tokenizer(str(root / "ours"))
  assert [VOCAB[i] for i in converted_tokenizer.encode(text)] == ["the", "[UNK]", "sat"]
  google = bert_jax.load_tokenizer(str(root / "hf" / "vocab.txt"))
  assert [VOCAB[i] for i in google.encode(text)] == ["the", "cat"] + ["##s"] * 147 + ["sat"]
  assert google.encode("the cat" + "s" * 198 + " sat") == [5, 1, 7]  # 201 characters: past Google's 200
  assert native.tokenizer(str(root / "ours")).max_chars_per_word == 100


def test_own_checkpoint_loads_in_either_layout(converted):
  root, _ = converted
  ids = jnp.array([[2, 5, 6, 3, 0]])
  outs = []
  for scan in (None, False):
    model, params = bert_jax.load_pretrained(str(root / "ours"), scan_layers=scan)
    outs.append(model.apply({"params": params}, ids, attention_mask=(ids > 0)).mlm_logits)
  np.testing.assert_allclose(outs[0], outs[1], atol=1e-6)


def test_back_to_hf_is_exact(converted):
  root, model = converted
  assert main(["convert", "--to", "hf", str(root / "ours"), str(root / "hf2")]) == 0
  original = safetensors.numpy.load_file(str(root / "hf" / "model.safetensors"))
  written = safetensors.numpy.load_file(str(root / "hf2" / "model.safetensors"))
  assert sorted(original) == sorted(written)
  for name in original:
    np.testing.assert_array_equal(written[name], original[name], err_msg=name)
  reloaded = transformers.BertForPreTraining.from_pretrained(root / "hf2")
  ids = torch.tensor([[2, 5, 6, 3]])
  with torch.no_grad():
    np.testing.assert_array_equal(reloaded(ids).prediction_logits, model(ids).prediction_logits)
  assert (root / "hf2" / "vocab.txt").read_text().split() == VOCAB
  tokenizer = transformers.AutoTokenizer.from_pretrained(root / "hf2")
  assert tokenizer.convert_tokens_to_ids(["Dog", "##s"]) == [9, 8]


def test_to_tf_and_back(converted, capsys):
  root, _ = converted
  assert main(["convert", "--to", "tf", str(root / "ours"), str(root / "tf")]) == 0
  assert "tanh approximation" in capsys.readouterr().out
  assert json.loads((root / "tf" / "bert_config.json").read_text())["num_attention_heads"] == 4
  assert main(["convert", "--from", "tf", str(root / "tf"), str(root / "ours2")]) == 0
  first, _ = checkpoint.load_params(str(root / "ours"))
  second, config = checkpoint.load_params(str(root / "ours2"))
  jax.tree.map(np.testing.assert_array_equal, first, second)
  assert config["model"]["hidden_act"] == "gelu_tanh"
  assert bert_jax.load_tokenizer(str(root / "tf")).vocab == VOCAB


@pytest.mark.parametrize("argv, message", [
    (["convert", "--from", "hf", "/no/such/dir", "/tmp/x"], "does not exist"),
    (["convert", "--from", "tf", "HF", "/tmp/x"], "is a hf checkpoint, not tf"),
    (["convert", "--to", "hf", "HF", "/tmp/x"], "is a hf checkpoint, not bert_jax"),
])
def test_bad_input_is_one_line(converted, capsys, argv, message):
  root, _ = converted
  argv = [str(root / "hf") if a == "HF" else a for a in argv]
  assert main(argv) == 2
  err = capsys.readouterr().err.strip()
  assert message in err and "\n" not in err


def test_import_without_tensorflow():
  code = "import sys, bert_jax, bert_jax.pretrained; assert 'tensorflow' not in sys.modules"
  subprocess.run([sys.executable, "-c", code], check=True, cwd=os.path.dirname(os.path.dirname(__file__)))
