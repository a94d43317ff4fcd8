"""The seq2seq job (finetune/seq2seq.py): a tiny T5 learns the first-word sst2 task recast as text to text
(exact match of the greedy strings rises from chance to all or nearly all), a too-long target is one line before
the workdir, `predict` generates the run's strings, and the exported T5ForConditionalGeneration's `generate` gives
the same tokens under transformers."""
from __future__ import annotations

import json

import numpy as np
import pytest

import data_fixtures
from core_helpers import slow
from bert_jax import cli
from bert_jax.data_pipelines import t5_spm

TINY = ["--config.model.num_layers=1", "--config.model.hidden_size=32", "--config.model.num_heads=2",
        "--config.model.head_dim=16", "--config.model.intermediate_size=64", "--config.model.vocab_size=320",
        "--config.model.dropout=0.0", "--config.model.relative_buckets=8", "--config.model.relative_max_distance=16",
        "--config.data.max_seq_length=24", "--config.data.max_target_length=4", "--config.train.batch_size=16",
        "--config.train.eval_batch_size=16", "--config.train.tensorboard=false", "--config.train.log_every_steps=8",
        "--config.optimizer.name=adamw", "--config.optimizer.learning_rate=3e-3"]


@pytest.fixture(scope="module")
def sst2(tmp_path_factory):
  """The first-word sst2 TSVs (data_fixtures) and a 200-piece T5 vocabulary learnt from their sentences."""
  root = tmp_path_factory.mktemp("s2s")
  data_dir = data_fixtures.write_first_word_sst2(root / "sst2", n_train=128, n_dev=32)
  lines = [l.split("\t")[0] for l in (root / "sst2" / "train.tsv").read_text().splitlines()[1:]]
  vocab = t5_spm.train(lines + ["sst2 sentence: positive negative"] * 20, 200, str(root / "vocab"))
  return data_dir, vocab


def _run(workdir, sst2, *extra):
  data_dir, vocab = sst2
  return cli.main(["finetune", "--config", "configs/t5_finetune.py:sst2", f"--config.data.data_dir={data_dir}",
                   f"--config.data.vocab={vocab}", "--workdir", str(workdir), *TINY, *extra])


@pytest.fixture(scope="module")
def trained(sst2, tmp_path_factory):
  """The workdir of a fresh tiny T5 fine-tuned for 32 steps (4 epochs of 8), evaluated at steps 16 and 32."""
  workdir = tmp_path_factory.mktemp("s2s-run") / "run"
  assert _run(workdir, sst2, "--config.train.num_steps=32", "--config.train.eval_every_steps=16") == 0
  return workdir


def test_a_tiny_t5_learns_the_first_word_task(trained):
  evals = [json.loads(l) for l in (trained / "metrics.jsonl").read_text().splitlines() if "exact_match" in l]
  assert [e["step"] for e in evals] == [16, 32]
  results = json.loads((trained / "eval_results.json").read_text())
  # Two labels: chance is about 0.5; the first word gives the label away.
  assert results["exact_match"] >= 0.9 and results["exact_match"] == max(e["exact_match"] for e in evals), evals
  losses = [json.loads(l)["loss"] for l in (trained / "metrics.jsonl").read_text().splitlines() if '"loss"' in l]
  assert losses[-1] < 0.5 * losses[0], losses
  rows = [json.loads(l) for l in (trained / "predictions" / "dev.jsonl").read_text().splitlines()]
  assert len(rows) == 32 and np.mean([r["prediction"] == r["target"] for r in rows]) == results["exact_match"]
  assert {r["target"] for r in rows} == {"positive", "negative"}
  assert rows[0]["source"].startswith("sst2 sentence: ")
  finished = json.loads((trained / "finished.json").read_text())
  assert finished["score"] == "exact_match" and finished["best_score"] == results["exact_match"]


def test_predict_generates_the_runs_strings_greedy_and_with_beams(trained, tmp_path, capsys):
  rows = [json.loads(l) for l in (trained / "predictions" / "dev.jsonl").read_text().splitlines()]
  (tmp_path / "in.txt").write_text("".join(r["source"] + "\n" for r in rows))
  for beams in ("1", "3"):
    assert cli.main(["predict", "--model", str(trained), "--input", str(tmp_path / "in.txt"), "--num-beams", beams,
                     "--output", str(tmp_path / f"out{beams}.jsonl")]) == 0
  assert "32 generated strings" in capsys.readouterr().err
  greedy = [json.loads(l)["prediction"] for l in (tmp_path / "out1.jsonl").read_text().splitlines()]
  assert greedy == [r["prediction"] for r in rows]
  beam = [json.loads(l)["prediction"] for l in (tmp_path / "out3.jsonl").read_text().splitlines()]
  assert np.mean([b == r["target"] for b, r in zip(beam, rows)]) >= 0.9  # a learnt label is also the beam's best


def test_the_hf_export_generates_the_same_tokens(trained, tmp_path, capsys):
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  import bert_jax  # pylint: disable=import-outside-toplevel
  from bert_jax.finetune import seq2seq  # pylint: disable=import-outside-toplevel
  assert cli.main(["convert", "--to", "hf", str(trained), str(tmp_path / "hf")]) == 0
  capsys.readouterr()
  theirs = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path / "hf").eval()
  rows = [json.loads(l) for l in (trained / "predictions" / "dev.jsonl").read_text().splitlines()]
  generator = seq2seq.Generator.load(str(trained))
  tokenizer = bert_jax.load_tokenizer(str(tmp_path / "hf"))
  features = seq2seq.text_to_text.encode_pairs([(r["source"], "") for r in rows], tokenizer, 24, 4)
  with torch.no_grad():
    want = theirs.generate(input_ids=torch.tensor(features["input_ids"]),
                           attention_mask=torch.tensor(features["attention_mask"]), max_new_tokens=4,
                           do_sample=False, num_beams=1, min_length=0).numpy()[:, 1:]
  strings = [tokenizer.decode(row[:list(row).index(1)] if 1 in row else row) for row in want.tolist()]
  assert strings == generator([r["source"] for r in rows]) == [r["prediction"] for r in rows]


def test_a_target_longer_than_the_decoder_is_one_line_before_the_workdir(tmp_path, sst2, capsys):
  capsys.readouterr()
  assert _run(tmp_path / "run", sst2, "--config.data.max_target_length=1", "--config.train.num_steps=1") == 2
  err = capsys.readouterr().err.strip()
  assert "longer than the decoder's length 1" in err and len(err.splitlines()) == 1, err
  assert not (tmp_path / "run").exists()


@slow
def test_init_from_a_hugging_face_t5(tmp_path, sst2, capsys):
  """A Hugging Face T5 folder is converted into the workdir and its weights start the run (at a learning rate
  of 1e-9 the saved token table is transformers')."""
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  from bert_jax.training import checkpoint  # pylint: disable=import-outside-toplevel
  torch.manual_seed(0)
  hf = transformers.T5ForConditionalGeneration(transformers.T5Config(
      vocab_size=320, d_model=32, d_kv=16, d_ff=64, num_layers=1, num_heads=2, feed_forward_proj="gated-gelu",
      tie_word_embeddings=False, relative_attention_num_buckets=8, relative_attention_max_distance=16,
      dropout_rate=0.0, decoder_start_token_id=0))
  hf.save_pretrained(tmp_path / "hf")
  assert _run(tmp_path / "run", sst2, f"--config.init_from={tmp_path / 'hf'}", "--config.train.num_steps=1",
              "--config.optimizer.learning_rate=1e-9", "--config.train.eval_every_steps=0") == 0
  assert "initialised the T5 from" in capsys.readouterr().out
  params, _ = checkpoint.load_params(tmp_path / "run")
  np.testing.assert_allclose(np.asarray(params["shared"]["embedding"]), hf.shared.weight.detach().numpy(), atol=1e-6)


def test_a_bert_checkpoint_as_init_is_one_line(tmp_path, sst2, capsys):
  import transformers  # pylint: disable=import-outside-toplevel
  transformers.BertForMaskedLM(transformers.BertConfig(
      vocab_size=100, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
  ).save_pretrained(tmp_path / "bert")
  capsys.readouterr()
  assert _run(tmp_path / "run2", sst2, f"--config.init_from={tmp_path / 'bert'}", "--config.train.num_steps=1") == 2
  err = capsys.readouterr().err.strip()
  assert "family 'bert'" in err and "T5" in err and len(err.splitlines()) == 1, err
  assert not (tmp_path / "run2").exists()


def test_source_and_target_files_and_their_bad_input(tmp_path, sst2, capsys):
  """task.family=files reads line i of the sources with line i of the targets; a dev target too long for the
  decoder, files of different lengths and an unknown task family are each one line, before the workdir."""
  from bert_jax.config_utils import load_config  # pylint: disable=import-outside-toplevel
  from bert_jax.finetune import seq2seq  # pylint: disable=import-outside-toplevel
  for name, text in (("train.src", "a b\nc d\n"), ("train.tgt", "x\ny\n"), ("dev.src", "e f\n"),
                     ("dev.tgt", "a rather long target of many words\n"), ("short.tgt", "x\n")):
    (tmp_path / name).write_text(text)
  files = [f"--config.data.{split}_{side}={tmp_path / f'{split}.{ext}'}" for split in ("train", "dev")
           for side, ext in (("source", "src"), ("target", "tgt"))]
  config = load_config("configs/t5_finetune.py:files", [o[len("--config."):] for o in files])
  assert seq2seq.read_pairs(config, "train") == [("a b", "x"), ("c d", "y")]
  _, vocab = sst2
  cases = [([], "the dev split: target 1 ('a rather long target of many words') is"),
           ([f"--config.data.train_target={tmp_path / 'short.tgt'}"], "pairs line i of the sources"),
           (["--config.task.family=tsv"], "task.family='tsv' is not one of ('glue', 'files', 'embedded')")]
  for extra, message in cases:
    capsys.readouterr()
    assert cli.main(["finetune", "--config", "configs/t5_finetune.py:files", f"--config.data.vocab={vocab}",
                     "--config.data.max_target_length=4", "--config.train.batch_size=2", *files, *extra,
                     "--workdir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "run").exists()


def test_a_t5_pretraining_run_names_the_text_to_text_config_next():
  """The `done:` line's next command fine-tunes with the family's own config (T5: configs/t5_finetune.py, whose
  `embedded` preset exists), not BERT's configs/glue.py."""
  from bert_jax import config_utils  # pylint: disable=import-outside-toplevel
  from bert_jax.training import trainer  # pylint: disable=import-outside-toplevel
  result = {"step": 3, "stopped_by": None, "finished_before": False, "train": {"loss": 4.5}}
  for spec, expected in (("configs/t5.py:tiny", "configs/t5_finetune.py:embedded"),
                         ("configs/bert.py:demo", "configs/glue.py:embedded")):
    line = trainer.summary(config_utils.load_config(spec), "runs/x", result)
    assert f"next: bert-jax finetune --config {expected} --config.init_from=runs/x" in line, line
