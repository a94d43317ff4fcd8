"""`bert-jax data prepare` and `data preview` through their CLI handlers."""
import argparse
import glob
import os

import numpy as np
import pytest

import data_fixtures
from bert_jax.cli import data as cli


def _run(argv, overrides=()):
  parser = argparse.ArgumentParser()
  cli.register(parser.add_subparsers(dest="command"))
  args = parser.parse_args(argv)
  args.config_overrides = list(overrides)
  return args.handler(args)


def test_prepare_then_preview(tmp_path, capsys):
  corpus = data_fixtures.write_corpus(str(tmp_path / "text"), num_docs=40, num_files=2)
  _run(["data", "prepare", "--corpus", corpus, "--output", str(tmp_path / "records"), "--workers", "1"])
  assert '"documents": 40' in capsys.readouterr().out
  out = str(tmp_path / "preview.npz")
  _run(["data", "preview", "--config", "configs/bert.py:demo", "--num-batches", "2", "--output", out],
       # 40 documents: 2 hash shards, not the default 8 (a shard may get none; that is an error).
       [f"--config.data.prepared={tmp_path}/records/*.tfrecord", "--config.data.num_shards=2",
        "--config.data.masking=span",
        "--config.data.max_seq_length=64", "--config.data.max_predictions_per_seq=10"])
  printed = capsys.readouterr().out
  assert "->" in printed and "[CLS]" in printed
  saved = np.load(out)
  assert saved["input_ids"].shape == (2, 32, 64) and saved["masked_lm_span_offset"].shape == (2, 32, 10)
  vocab = list(saved["vocab"])
  assert vocab[int(saved["mask_token_id"])] == "[MASK]"
  assert [vocab[i] for i in saved["special_token_ids"]] == ["[CLS]", "[SEP]", "[MASK]", "[PAD]"]


class _FirstBatch(Exception):
  pass


def test_preview_shows_the_trainers_first_batch(tmp_path, monkeypatch):
  """One seed path (data.seed) from config to batch: preview's first batch is the one the train step gets."""
  from bert_jax.training import partitioning, trainer
  overrides = ["--config.data.max_seq_length=32", "--config.data.max_predictions_per_seq=5",
               "--config.train.batch_size=8", "--config.train.num_steps=1", "--config.train.eval_every_steps=0",
               "--config.data.seed=5", "--config.train.seed=9", "--config.data.shuffle_buffer=50"]
  out = str(tmp_path / "preview.npz")
  _run(["data", "preview", "--config", "configs/bert.py:demo", "--num-batches", "1", "--output", out], overrides)
  seen = []

  def first_batch(batch, mesh):  # what the first train step would get; the run stops there (not compiled)
    del mesh
    seen.append(batch)
    raise _FirstBatch

  monkeypatch.setattr(partitioning, "global_batch", first_batch)
  with pytest.raises(_FirstBatch):
    trainer.pretrain(trainer.load_run_config("configs/bert.py:demo", overrides), str(tmp_path / "run"))
  previewed = np.load(out)
  assert seen and set(seen[0]) <= set(previewed)
  for name, value in seen[0].items():
    assert np.array_equal(previewed[name][0], value), name


def test_throughput_reports_examples_and_real_tokens(capsys):
  import json
  _run(["data", "throughput", "--config", "configs/bert.py:demo", "--batches", "4", "--json"],
       ["--config.data.shuffle_buffer=50", "--config.train.batch_size=16"])
  result = json.loads(capsys.readouterr().out)
  assert result["examples_per_sec"] > 0 and result["batch_size"] == 16
  # real tokens per row lie between a pair's minimum ([CLS] a [SEP] b [SEP]) and max_seq_length=64
  assert 5 <= result["mean_real_tokens_per_row"] <= 64
  assert abs(result["real_tokens_per_sec"] / result["examples_per_sec"] - result["mean_real_tokens_per_row"]) < 1e-6


def _burn(seconds, done, stop):
  import time
  while time.process_time() < seconds:
    pass
  done.set()
  stop.wait(30)


def test_throughputs_cpu_time_counts_the_worker_processes():
  """`data.num_workers` workers build the rows, so the per-CPU-second rate must count their CPU time too (it
  counted the main process alone: 15-22M tokens per CPU second on 2026-11-28)."""
  import multiprocessing
  import time
  from bert_jax.data_pipelines import throughput
  mp = multiprocessing.get_context("fork")
  done, stop = mp.Event(), mp.Event()
  child = mp.Process(target=_burn, args=(0.3, done, stop))
  start = throughput._cpu_seconds() - time.process_time()  # pylint: disable=protected-access
  child.start()
  try:
    assert done.wait(60)
    assert throughput._cpu_seconds() - time.process_time() - start >= 0.2  # pylint: disable=protected-access
  finally:
    stop.set()
    child.join()


def test_an_unquoted_glob_is_refused_not_half_read(tmp_path, capsys):
  """`--corpus dir/*.txt` unquoted: the shell hands the second file over as a word of its own, which went to Beam
  as a flag (1 of 2 files read, exit 0) or, without --runner, was blamed on a missing --runner. Refused in one
  line naming the cause, with and without --runner, for `data prepare` and `vocab`, before anything is written."""
  from bert_jax.cli import main
  corpus = data_fixtures.write_corpus(str(tmp_path / "text"), num_docs=4, num_files=2)
  first, second = sorted(glob.glob(corpus))
  out = str(tmp_path / "out")
  for command in (["data", "prepare"], ["vocab", "--size", "100"]):
    for runner in ([], ["--runner", "DirectRunner"]):
      assert main([*command, "--corpus", first, second, "--output", out, *runner]) == 2
      err = capsys.readouterr().err.strip()
      assert err.startswith(f"bert-jax {command[0]}: error: {second!r} is not a flag of this command: quote a "
                            "--corpus glob") and "\n" not in err, err
      assert not os.path.exists(out)
  assert main(["data", "prepare", "--corpus", first, "--output", out, "--runner", "DirectRunner", "--", "--project",
               "p"]) == 2
  assert "Beam's own flags after -- are written --flag=value" in capsys.readouterr().err
