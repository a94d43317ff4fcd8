"""`bert-jax data prepare` and `data preview` through their CLI handlers."""
import argparse

import numpy as np

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
