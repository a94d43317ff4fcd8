"""`bert-jax analyze` and `bert-jax prune` end to end, on a transformers checkpoint converted in the test
and on a model fine-tuned from it: outputs against transformers' own attentions, pruned checkpoints
that fine-tune and convert, one-line errors."""
import json
import os
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("matplotlib")

import data_fixtures  # noqa: E402
from bert_jax import cli  # noqa: E402
from bert_jax.analysis import inputs  # noqa: E402
from core_helpers import slow

SENTENCES = 24


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
  """A transformers BERT with the embedded vocabulary, converted with `bert-jax convert`, and a text file."""
  root = tmp_path_factory.mktemp("bertology")
  vocab = data_fixtures.embedded_paths()[1]
  with open(vocab, encoding="utf-8") as f:
    size = sum(1 for _ in f)
  torch.manual_seed(0)
  model = transformers.BertForPreTraining(transformers.BertConfig(
      vocab_size=size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
      max_position_embeddings=64, attn_implementation="eager")).eval()
  model.save_pretrained(root / "hf")
  shutil.copy(vocab, root / "hf" / "vocab.txt")
  with open(root / "text.txt", "w", encoding="utf-8") as f:
    f.write("\n".join(data_fixtures.real_sentences(SENTENCES - 1)) + "\nA first segment.\tAnd a second one!\n")
  assert cli.main(["convert", "--from", "hf", str(root / "hf"), str(root / "ckpt")]) == 0
  return root, model


def test_analyze_attention_matches_transformers_attentions(converted):
  root, model = converted
  assert cli.main(["analyze", "attention", "--checkpoint", str(root / "ckpt"), "--text", str(root / "text.txt"),
                   "--out", str(root / "att"), "--max-length", "40", "--batch-size", "8"]) == 0
  for name in ("statistics", "special_tokens", "patterns", "effective_attention", "attention_maps"):
    assert os.path.getsize(root / "att" / f"{name}.png") > 5000, name
  with open(root / "att" / "attention.json") as f:
    report = json.load(f)
  assert report["inputs"] == SENTENCES
  # Mean attention to [CLS] and [SEP] per head, from transformers' own attention probabilities.
  import bert_jax  # pylint: disable=import-outside-toplevel
  tokenizer = bert_jax.load_tokenizer(str(root / "ckpt"))
  features = inputs.encode(tokenizer, inputs.read_lines(str(root / "text.txt")), 40)
  with torch.no_grad():
    attentions = np.stack([a.numpy() for a in model.bert(
        torch.tensor(features["input_ids"]), attention_mask=torch.tensor(features["attention_mask"]),
        token_type_ids=torch.tensor(features["token_type_ids"]), output_attentions=True).attentions])
  valid = features["attention_mask"].astype(bool)
  for name, token in (("cls", "[CLS]"), ("sep", "[SEP]")):
    keys = (features["input_ids"] == tokenizer.special_ids[token]).astype(float)
    per_query = np.einsum("lbnts,bs->lbnt", attentions, keys)
    want = np.einsum("lbnt,bt->ln", per_query, valid) / valid.sum()
    np.testing.assert_allclose(report["statistics"][name], want, atol=1e-5)
  shares = np.array([report["patterns"]["shares"][c] for c in report["patterns"]["shares"]])
  np.testing.assert_allclose(shares.sum(axis=0), 1.0, atol=1e-6)
  bins = report["effective_attention"]["by_length"]
  assert sum(b["inputs"] for b in bins) == SENTENCES
  assert all(hi - lo == 7 and lo % 8 == 1 and -1 <= b["correlation"] <= 1 for b in bins for lo, hi in [b["lengths"]])


def _glue(root):
  directory = root / "sst2"
  os.makedirs(directory, exist_ok=True)
  sentences = data_fixtures.real_sentences(160)
  rng = np.random.default_rng(0)
  for split, chunk in (("train", sentences[:128]), ("dev", sentences[128:])):
    with open(directory / f"{split}.tsv", "w", encoding="utf-8") as f:
      f.write("sentence\tlabel\n")
      for sentence in chunk:
        y = int(rng.integers(2))
        f.write(f"{('false', 'true')[y]} {sentence}\t{y}\n")
  return ["--config.data.max_seq_length=24", "--config.train.batch_size=16", "--config.train.eval_batch_size=16",
          f"--config.data.data_dir={directory}", "--config.optimizer.learning_rate=3e-3", "--config.train.epochs=2"]


@slow  # an end-to-end chain; its parts are tested in the suite (BERT_JAX_SLOW_TESTS=1)
def test_heads_prune_finetune_and_convert(converted, capsys):
  root, _ = converted
  overrides = _glue(root)
  assert cli.main(["finetune", "--config", "configs/glue.py:sst2", "--workdir", str(root / "ft"),
                   f"--config.init_from={root / 'ckpt'}", *overrides]) == 0
  assert cli.main(["analyze", "heads", "--checkpoint", str(root / "ft"), "--out", str(root / "heads"),
                   "--step", "0.25"]) == 0
  with open(root / "heads" / "heads.json") as f:
    report = json.load(f)
  importance = np.array(report["importance"])
  np.testing.assert_allclose(np.linalg.norm(importance, axis=1), 1.0, rtol=1e-6)  # normalised per layer
  assert [p["heads_pruned"] for p in report["pruning_curve"]] == [0, 2, 4, 6]
  assert np.array(report["disable_one"]).shape == (2, 4) and len(report["keep_one"]["best_head"]) == 2
  assert os.path.getsize(root / "heads" / "pruning_curve.png") > 5000
  # Prune the 25% least important heads; the pruned checkpoint evaluates, fine-tunes further and converts.
  capsys.readouterr()
  assert cli.main(["prune", "--from", str(root / "ft"), "--to", str(root / "pruned"), "--fraction", "0.25",
                   "--importance", str(root / "heads" / "heads.json")]) == 0
  summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  order = sorted(((importance[l, h], l, h) for l in range(2) for h in range(4)))
  assert sorted((int(l), h) for l, hs in summary["pruned_heads"].items() for h in hs) == sorted(
      (l, h) for _, l, h in order[:2])
  assert summary["heads_left"] == 6
  assert cli.main(["finetune", "--config", "configs/glue.py:sst2", "--workdir", str(root / "eval"),
                   f"--config.init_from={root / 'pruned'}", "--config.eval_only=true", *overrides]) == 0
  assert cli.main(["finetune", "--config", "configs/glue.py:sst2", "--workdir", str(root / "more"),
                   f"--config.init_from={root / 'pruned'}", *overrides, "--config.train.epochs=1"]) == 0
  assert cli.main(["convert", "--to", "hf", str(root / "pruned"), str(root / "pruned_hf")]) == 0
  with open(root / "pruned_hf" / "config.json") as f:
    assert json.load(f)["pruned_heads"] == summary["pruned_heads"]
  assert cli.main(["analyze", "change", "--pretrained", str(root / "ckpt"), "--finetuned", str(root / "ft"),
                   "--text", str(root / "text.txt"), "--out", str(root / "change"), "--max-length", "24"]) == 0
  with open(root / "change" / "change.json") as f:
    change = json.load(f)
  assert len(change["weight_cosine_distance"]) == 2 and min(change["weight_cosine_distance"]) > 0


@pytest.mark.parametrize("argv,message", [
    (["prune", "--heads", '{"0": [4]}'], "head 4 of layer 0 is out of range"),
    (["prune", "--heads", '{"0": [0, 1, 2, 3]}'], "pruning every head of layer 0"),
    (["prune", "--heads", "[0]"], "is not a JSON object"),
    (["prune", "--fraction", "0.3"], "--fraction needs --importance"),
    (["analyze", "heads", "--out", "OUT"], "has no fine-tuning head"),
])
def test_bad_input_is_one_line(converted, capsys, argv, message):
  root, _ = converted
  where = ["--from", str(root / "ckpt"), "--to", str(root / "bad")] if argv[0] == "prune" else \
      ["--checkpoint", str(root / "ckpt")]
  capsys.readouterr()
  assert cli.main([*argv, *where]) == 2
  err = capsys.readouterr().err.strip()
  assert message in err and len(err.splitlines()) == 1
