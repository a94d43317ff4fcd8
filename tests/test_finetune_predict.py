"""`bert-jax predict` gives the predictions of the fine-tuning run's own dev evaluation (GLUE TSVs, the
embedded task, NER, SQuAD), and the HF export of a fine-tuned model gives the same labels in transformers.

The GLUE path: `finetune` on sst2-format TSVs (the session's fine-tuned model, tests/conftest.py's
sst2_finetuned) -> `predict` on the dev sentences -> `convert --to hf` -> BertForSequenceClassification and
transformers' pipeline. The embedded task's run starts from a Hugging Face folder (a tiny random BertModel saved
by transformers, converted into the workdir as `convert --from hf` does); a converted checkpoint without a
fine-tuning head is refused by predict.
"""
import importlib.util
import json
import os
import shutil

import numpy as np
import pytest

import data_fixtures
import bert_jax
from bert_jax import cli
from bert_jax.finetune import embedded

TINY = ["--config.data.max_seq_length=32", "--config.train.batch_size=16", "--config.train.eval_batch_size=32",
        "--config.train.log_every_steps=100", "--config.train.tensorboard=false"]
TINY_MODEL = ["--config.model.num_layers=1", "--config.model.hidden_size=32", "--config.model.num_heads=2",
              "--config.model.intermediate_size=64", "--config.model.max_position_embeddings=32"]


def _records(path):
  with open(path, encoding="utf-8") as f:
    return [json.loads(line) for line in f]


def _dev_tsv_predictions(path):
  with open(path, encoding="utf-8") as f:
    return [line.split("\t")[1] for line in f.read().splitlines()[1:]]


def _hf_bert(directory):
  """A tiny random BERT saved by transformers, with the embedded vocabulary (a stand-in for MiniLM)."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  vocab = data_fixtures.embedded_paths()[1]
  with open(vocab, encoding="utf-8") as f:
    vocab_size = len(f.read().splitlines())
  torch.manual_seed(0)
  config = transformers.BertConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                   intermediate_size=64, max_position_embeddings=64)
  transformers.BertModel(config).save_pretrained(directory)
  shutil.copyfile(vocab, os.path.join(directory, "vocab.txt"))
  with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
    json.dump({"do_lower_case": True, "tokenizer_class": "BertTokenizer"}, f)
  return str(directory)


@pytest.fixture(scope="module")
def sst2_run(tmp_path_factory, sst2_finetuned):
  """A folder of this module's own, and the session's fine-tuned sst2 model (read only: shared)."""
  data, workdir, _ = sst2_finetuned
  return tmp_path_factory.mktemp("sst2"), data, workdir


def test_predict_matches_dev_evaluation(sst2_run, capsys):
  root, data, workdir = sst2_run
  with open(os.path.join(data, "dev.tsv"), encoding="utf-8") as f:
    rows = [line.split("\t") for line in f.read().splitlines()[1:]]
  (root / "dev.txt").write_text("".join(sentence + "\n" for sentence, _ in rows), encoding="utf-8")
  out = str(root / "dev.jsonl")
  assert cli.main(["predict", "--model", workdir, "--input", str(root / "dev.txt"), "--output", out]) == 0
  assert "64 predictions (sst2, classification)" in capsys.readouterr().err
  records = _records(out)
  labels = [r["label"] for r in records]
  assert labels == _dev_tsv_predictions(os.path.join(workdir, "predictions", "SST-2.dev.tsv"))
  assert len(set(labels)) == 2  # the model learnt something, so the comparison is not trivial
  with open(os.path.join(workdir, "eval_results.json")) as f:
    accuracy = json.load(f)["accuracy"]
  assert np.mean([p == gold for p, (_, gold) in zip(labels, rows)]) == pytest.approx(accuracy)
  assert accuracy >= 0.75
  for r in records:
    assert set(r["scores"]) == {"0", "1"} and r["score"] == max(r["scores"].values())
    assert sum(r["scores"].values()) == pytest.approx(1.0)
  # The dev TSV itself (header row, label column) reads as fine-tuning reads it; the Python API agrees.
  assert cli.main(["predict", "--model", workdir, "--input", os.path.join(data, "dev.tsv"),
                   "--output", str(root / "tsv.jsonl")]) == 0
  assert _records(root / "tsv.jsonl") == records
  api = bert_jax.Predictor.load(workdir)([sentence for sentence, _ in rows[:5]])
  assert [r["label"] for r in api] == labels[:5]


def test_hf_export_gives_the_same_labels(sst2_run, capsys):
  transformers = pytest.importorskip("transformers")
  torch = pytest.importorskip("torch")
  root, data, workdir = sst2_run
  assert cli.main(["convert", "--to", "hf", workdir, str(root / "export")]) == 0
  assert "not written" not in capsys.readouterr().out
  with open(os.path.join(data, "dev.tsv"), encoding="utf-8") as f:
    sentences = [line.split("\t")[0] for line in f.read().splitlines()[1:]]
  model = transformers.BertForSequenceClassification.from_pretrained(root / "export").eval()
  assert model.config.id2label == {0: "0", 1: "1"} and model.config.problem_type == "single_label_classification"
  tokenizer = transformers.AutoTokenizer.from_pretrained(root / "export")
  with torch.no_grad():
    # The export's tokenizer truncates at the fine-tuning length (some dev sentences are longer).
    logits = model(**tokenizer(sentences, padding=True, truncation=True, return_tensors="pt")).logits.numpy()
  predictor = bert_jax.Predictor.load(workdir)
  np.testing.assert_allclose(predictor.outputs(sentences)["logits"], logits, atol=1e-5)
  pipeline = transformers.pipeline("text-classification", model=str(root / "export"), device="cpu")
  ours = predictor(sentences)
  theirs = pipeline(sentences, truncation=True)
  assert [r["label"] for r in theirs] == [r["label"] for r in ours]
  np.testing.assert_allclose([r["score"] for r in theirs], [r["score"] for r in ours], atol=1e-5)


def test_embedded_task(tmp_path, capsys):
  """Fine-tuned from a Hugging Face folder (init_from; without torch and transformers, from scratch): the folder
  is converted once into the workdir, and the run ends with its lock released."""
  workdir = str(tmp_path / "run")
  num_dev, num_train = 32, 64
  hf = importlib.util.find_spec("torch") and importlib.util.find_spec("transformers")
  start = [f"--config.init_from={_hf_bert(tmp_path / 'hf')}"] if hf else TINY_MODEL
  assert cli.main(["finetune", "--config", "configs/glue.py:embedded", "--workdir", workdir, *TINY, *start,
                   f"--config.task.num_dev={num_dev}", f"--config.task.num_train={num_train}",
                   "--config.train.epochs=2", "--config.optimizer.learning_rate=1e-3"]) == 0
  if hf:
    assert "is a Hugging Face folder: converted it to" in capsys.readouterr().out
    assert os.path.exists(os.path.join(workdir, "init_from", "config.json"))
  assert os.path.exists(os.path.join(workdir, "eval_results.json")) and not os.path.exists(
      os.path.join(workdir, "run.lock"))
  with open(os.path.join(workdir, "config.json")) as f:
    task = json.load(f)["task"]
  assert (task["head"], task["num_labels"], task["labels"]) == ("classification", 2, ["original", "shuffled"])
  rows = embedded.make_rows(embedded.corpus_sentences(num_dev + num_train)[:num_dev], seed=1)
  (tmp_path / "dev.txt").write_text("".join(text + "\n" for text, _, _ in rows), encoding="utf-8")
  assert cli.main(["predict", "--model", workdir, "--input", str(tmp_path / "dev.txt"),
                   "--output", str(tmp_path / "out.jsonl")]) == 0
  labels = [r["label"] for r in _records(tmp_path / "out.jsonl")]
  assert labels == _dev_tsv_predictions(os.path.join(workdir, "predictions", "EMBEDDED.dev.tsv"))
  with open(os.path.join(workdir, "eval_results.json")) as f:
    assert np.mean([p == gold for p, (*_, gold) in zip(labels, rows)]) == pytest.approx(json.load(f)["accuracy"])
  # Bad input is one line naming the problem: a pair for a one-sentence task, a missing file.
  (tmp_path / "pairs.txt").write_text("first\tsecond\n")
  capsys.readouterr()
  assert cli.main(["predict", "--model", workdir, "--input", str(tmp_path / "pairs.txt")]) == 2
  assert "example 1: the model's task takes one sentence" in capsys.readouterr().err
  assert cli.main(["predict", "--model", workdir, "--input", str(tmp_path / "missing.txt")]) == 2
  assert "no such file" in capsys.readouterr().err


def _conll_lines(sentences):
  lines = []
  for sentence in sentences:
    lines += [f"{w} NN O {'B-PER' if w[0].isupper() else 'O'}" for w in sentence.split()] + [""]
  return "\n".join(lines)


def test_ner_tags_match_dev_predictions(tmp_path):
  sentences = data_fixtures.real_sentences(48)
  (tmp_path / "train.txt").write_text(_conll_lines(sentences[:32]))
  (tmp_path / "valid.txt").write_text(_conll_lines(sentences[32:]))
  workdir = str(tmp_path / "run")
  assert cli.main(["finetune", "--config", "configs/ner.py:conll2003", "--workdir", workdir, *TINY, *TINY_MODEL,
                   f"--config.data.data_dir={tmp_path}", "--config.train.epochs=2",
                   "--config.optimizer.learning_rate=3e-3"]) == 0
  (tmp_path / "dev.txt").write_text("".join(s + "\n" for s in sentences[32:]))
  assert cli.main(["predict", "--model", workdir, "--input", str(tmp_path / "dev.txt"),
                   "--output", str(tmp_path / "out.jsonl")]) == 0
  records = _records(tmp_path / "out.jsonl")
  with open(os.path.join(workdir, "eval_results.json")) as f:
    assert set(json.load(f)) == {"precision", "recall", "f1"}
  with open(os.path.join(workdir, "predictions", "ner.dev.txt")) as f:
    dev = [[line.split() for line in block.splitlines()] for block in f.read().strip().split("\n\n")]
  assert len(dev) == 16  # every dev sentence
  assert [r["words"] for r in records] == [[w for w, _, _ in block] for block in dev]
  assert [r["tags"] for r in records] == [[p for _, _, p in block] for block in dev]
  assert len({t for r in records for t in r["tags"]}) >= 2


def test_squad_answers_match_dev_predictions(tmp_path):
  paragraphs = []
  for i, sentence in enumerate(data_fixtures.real_sentences(16)):
    first = sentence.split()[0]
    paragraphs.append({"context": sentence, "qas": [{
        "id": f"q{i}", "question": "which word comes first?", "is_impossible": i % 4 == 3,
        "answers": [] if i % 4 == 3 else [{"text": first, "answer_start": 0}]}]})
  for split in ("train", "dev"):
    (tmp_path / f"{split}-v2.0.json").write_text(json.dumps({"data": [{"title": "t", "paragraphs": paragraphs}]}))
  workdir = str(tmp_path / "run")
  assert cli.main(["finetune", "--config", "configs/squad.py:v2", "--workdir", workdir, *TINY, *TINY_MODEL,
                   f"--config.data.data_dir={tmp_path}", "--config.train.epochs=1", "--config.task.doc_stride=8",
                   "--config.task.max_query_length=8"]) == 0
  assert cli.main(["predict", "--model", workdir, "--input", str(tmp_path / "dev-v2.0.json"),
                   "--output", str(tmp_path / "out.jsonl")]) == 0
  records = _records(tmp_path / "out.jsonl")
  with open(os.path.join(workdir, "eval_results.json")) as f:
    results = json.load(f)
  assert set(results) == {"exact_match", "f1"} and 0.0 <= results["f1"] <= 100.0
  with open(os.path.join(workdir, "predictions", "predictions.dev.json")) as f:
    answers = json.load(f)
  assert set(answers) == {f"q{i}" for i in range(16)}
  with open(os.path.join(workdir, "predictions", "null_odds.dev.json")) as f:
    null_odds = json.load(f)
  assert {r["id"]: r["answer"] for r in records} == answers
  for r in records:
    assert r["null_score_diff"] == pytest.approx(null_odds[r["id"]], abs=1e-4)
  assert len(set(answers.values())) >= 2


def test_predict_refuses_a_pretraining_checkpoint(sst2_run, capsys):
  root, _, _ = sst2_run
  assert cli.main(["convert", "--from", "hf", _hf_bert(root / "hf_bert"), str(root / "ckpt")]) == 0
  (root / "in.txt").write_text("a sentence\n")
  capsys.readouterr()
  assert cli.main(["predict", "--model", str(root / "ckpt"), "--input", str(root / "in.txt")]) == 2
  assert "records no fine-tuning head" in capsys.readouterr().err
