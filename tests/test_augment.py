"""TinyBERT's data augmentation (compress/augment.py, `bert-jax data augment`): each single-piece word's
candidates are transformers' own top MLM predictions for the masked word (a tiny random BertForMaskedLM);
replacement draws follow replace_prob; the augmented GLUE folder reads back as the task's data."""
import os
import shutil

import numpy as np
import pytest

import data_fixtures
from bert_jax import cli
from bert_jax.compress import augment
from bert_jax.data_pipelines.tokenizers import basic_tokenize
from bert_jax.finetune import glue

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SENTENCES = ["The cat sat on the warm mat today.", "A quiet river runs through the old town of Bern."]


@pytest.fixture(scope="module")
def mlm_folder(tmp_path_factory):
  """A tiny random BertForMaskedLM with the embedded vocabulary, as transformers saves it."""
  directory = tmp_path_factory.mktemp("mlm")
  torch.manual_seed(0)
  config = transformers.BertConfig(vocab_size=8192, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                   intermediate_size=64, max_position_embeddings=64, initializer_range=0.5)
  model = transformers.BertForMaskedLM(config).eval()
  model.save_pretrained(directory)
  shutil.copy(data_fixtures.embedded_paths()[1], directory / "vocab.txt")
  return str(directory), model


def _reference(model, folder, words, count):
  """Per word: transformers' top MLM predictions for the word masked (whole words, no special token, not
  the word itself), or [] for a word of several pieces."""
  tokenizer = transformers.BertTokenizer(os.path.join(folder, "vocab.txt"))
  vocab = tokenizer.convert_ids_to_tokens(list(range(tokenizer.vocab_size)))
  allowed = torch.tensor([not t.startswith("##") and not t.startswith("[") for t in vocab]
                         + [False] * (model.config.vocab_size - len(vocab)))  # the table's padding rows
  pieces = [tokenizer.convert_tokens_to_ids(tokenizer.tokenize(w)) for w in words]
  out = []
  for w, own in enumerate(pieces):
    if len(own) != 1:
      out.append([])
      continue
    ids = [tokenizer.cls_token_id] + [i for k, p in enumerate(pieces) for i in ([tokenizer.mask_token_id] if k == w else p)]
    ids.append(tokenizer.sep_token_id)
    at = 1 + sum(len(p) for p in pieces[:w])
    with torch.no_grad():
      logits = model(torch.tensor([ids])).logits[0, at]
    order = torch.argsort(torch.where(allowed, logits, -torch.inf), descending=True).tolist()
    out.append([vocab[i] for i in order if allowed[i] and vocab[i] != words[w].lower()][:count])
  return out


def test_candidates_are_transformers_top_mlm_predictions(mlm_folder):
  folder, model = mlm_folder
  sentences = [basic_tokenize(s, False) for s in SENTENCES]
  found, several = augment.Candidates(folder, 5, batch_size=8).of(sentences)
  expected = [_reference(model, folder, words, 5) for words in sentences]
  assert found == expected
  assert several == sum(1 for words in expected for c in words if not c)
  assert sum(1 for words in found for c in words if c) >= 10  # 12 of these 20 words are one piece here


def test_replacement_follows_replace_prob():
  words, cands = ["a", "b", "c"], [["x", "y"], [], ["z"]]
  rng = np.random.default_rng(0)
  assert augment.augmented(words, cands, 3, 0.0, rng) == ["a b c"] * 3
  always = augment.augmented(words, cands, 50, 1.0, rng)
  assert {s.split()[0] for s in always} == {"x", "y"} and all(s.split()[1:] == ["b", "z"] for s in always)
  some = augment.augmented(words * 100, cands * 100, 20, 0.4, rng)
  share = np.mean([w != o for s in some for w, o in zip(s.split()[::3], ["a"] * 100)])
  assert 0.33 < share < 0.47


def test_data_augment_writes_a_glue_folder_the_task_reads(mlm_folder, tmp_path, capsys):
  folder, _ = mlm_folder
  data = data_fixtures.write_first_word_sst2(tmp_path / "sst2", n_train=6, n_dev=4)
  out = tmp_path / "augmented"
  assert cli.main(["data", "augment", "--model", folder, "--task", "sst2", "--input", data, "--output", str(out),
                   "--per-example", "3", "--candidates", "4"]) == 0
  assert f"6 training rows -> 24 in {out}/train.tsv" in capsys.readouterr().out
  original = glue.read_tsv(os.path.join(data, "train.tsv"), glue.SPECS["sst2"], labelled=True)
  rows = glue.read_tsv(str(out / "train.tsv"), glue.SPECS["sst2"], labelled=True)
  assert len(rows) == 24 and [rows[4 * i] for i in range(6)] == original  # each row, then its 3 copies
  assert [r[2] for r in rows] == [r[2] for r in original for _ in range(4)]
  changed = sum(r[0] != " ".join(basic_tokenize(original[i // 4][0], False)) for i, r in enumerate(rows) if i % 4)
  assert changed >= 12  # 18 copies, each of ~20 words at p=0.4: nearly all differ
  assert (out / "dev.tsv").read_text() == (tmp_path / "sst2" / "dev.tsv").read_text()
  bare = tmp_path / "bare"
  transformers.BertModel(transformers.BertConfig(vocab_size=8192, hidden_size=32, num_hidden_layers=1,
                                                 num_attention_heads=2, intermediate_size=64)).save_pretrained(bare)
  shutil.copy(data_fixtures.embedded_paths()[1], bare / "vocab.txt")
  assert cli.main(["data", "augment", "--model", str(bare), "--task", "sst2", "--input", data,
                   "--output", str(tmp_path / "x")]) == 2
  assert "no MLM head" in capsys.readouterr().err
