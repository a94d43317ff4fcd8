"""WordPiece ids equal an independent implementation (HF `tokenizers`, BERT normaliser); SentencePiece round trips."""
import io
import json
import sys

import pytest

from bert_jax.data_pipelines import vocab as vocab_lib
from bert_jax.data_pipelines.errors import DataError
from bert_jax.data_pipelines.tokenizers import HF_MAX_CHARS_PER_WORD, load_tokenizer
import data_fixtures

NUM_LINES = 3000


@pytest.fixture(scope="module")
def lines():
  return list(data_fixtures.real_sentences(NUM_LINES)) + data_fixtures.UNICODE_LINES


@pytest.fixture(scope="module")
def cased_vocab(tmp_path_factory):
  """A cased 4,000-piece vocab.txt of 4,000 real sentences, from `tokenizers`' WordPiece trainer (under 1 s;
  tensorflow-text's learner, vocab_lib.train_wordpiece, took 12-15 s): the test is our tokenizer against HF's
  on a cased vocab, whichever learner made it (`bert-jax vocab` runs train_wordpiece in the CLI test below)."""
  from tokenizers import BertWordPieceTokenizer
  out = str(tmp_path_factory.mktemp("cased"))
  learner = BertWordPieceTokenizer(clean_text=True, handle_chinese_chars=True, strip_accents=False, lowercase=False)
  learner.train_from_iterator(data_fixtures.real_sentences(4000), vocab_size=4000,
                              special_tokens=list(vocab_lib.SPECIAL_TOKENS))
  return learner.save_model(out)[0]


def _reference(vocab_path, lower_case):
  from tokenizers import BertWordPieceTokenizer
  return BertWordPieceTokenizer(vocab_path, clean_text=True, handle_chinese_chars=True,
                                strip_accents=lower_case, lowercase=lower_case)


@pytest.mark.parametrize("lower_case", [True, False])
def test_wordpiece_matches_reference(lines, cased_vocab, lower_case):
  path = data_fixtures.embedded_paths()[1] if lower_case else cased_vocab
  ours = load_tokenizer(path, lower_case, max_chars_per_word=HF_MAX_CHARS_PER_WORD)
  ref = _reference(path, lower_case)
  expected = [e.ids for e in ref.encode_batch(lines, add_special_tokens=False)]
  mismatches = [(l, ours.encode(l), e) for l, e in zip(lines, expected) if ours.encode(l) != e]
  assert not mismatches, mismatches[:3]
  assert sum(len(e) for e in expected) > 30_000  # the comparison covers real volume


def test_unicode_rules_by_hand():
  tok = load_tokenizer(data_fixtures.embedded_paths()[1], lower_case=True)
  from bert_jax.data_pipelines.tokenizers import basic_tokenize
  assert basic_tokenize("Café-Déjà 北京!", True) == ["cafe", "-", "deja", "北", "京", "!"]
  assert basic_tokenize("Café-Déjà 北京!", False) == ["Café", "-", "Déjà", "北", "京", "!"]
  assert basic_tokenize("a\x00b\ufffdc\x07d e", True) == ["abcd", "e"]
  assert tok.encode("x" * 201) == [tok.special_ids["[UNK]"]]  # Google's limit: 200 characters


def test_tf_tokenize_matches_python(lines):
  tok = load_tokenizer(data_fixtures.embedded_paths()[1], lower_case=True)
  ascii_lines = [l for l in lines if l.isascii()][:500]
  ragged = tok.tokenize_tf(ascii_lines)
  assert [list(r) for r in ragged.numpy()] == [tok.encode(l) for l in ascii_lines]


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_sentencepiece_round_trip(tmp_path, lines, model_type):
  path = vocab_lib.train_sentencepiece(lines[:2000], 1000, str(tmp_path), True, model_type)
  tok = load_tokenizer(path, lower_case=True)
  assert tok.special_ids == {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4}
  sample = lines[2000:2300]
  for line in sample:
    assert tok.decode(tok.encode(line)) == " ".join(line.lower().split())
  ragged = tok.tokenize_tf(sample[:50])
  assert [list(r) for r in ragged.numpy()] == [tok.encode(l) for l in sample[:50]]
  assert tok.continuation_mask().sum() > 0 and not tok.continuation_mask()[:5].any()


def test_vocab_missing_specials_is_a_data_error(tmp_path):
  path = tmp_path / "vocab.txt"
  path.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nhello\n")
  with pytest.raises(DataError, match=r"vocab.txt lacks \[MASK\]"):
    load_tokenizer(str(path))
  (tmp_path / "bad.model").write_bytes(b"not a model")
  with pytest.raises(DataError, match="bad.model"):
    load_tokenizer(str(tmp_path / "bad.model"))


def test_tokenize_and_vocab_cli(tmp_path, monkeypatch, capsys):
  import argparse
  from bert_jax.cli import data as cli
  parser = argparse.ArgumentParser()
  cli.register(parser.add_subparsers(dest="command"))
  corpus = data_fixtures.write_corpus(str(tmp_path / "c"), num_docs=40, num_files=1)
  args = parser.parse_args(["vocab", "--corpus", corpus, "--size", "500", "--output", str(tmp_path / "v")])
  args.handler(args)
  vocab = capsys.readouterr().out.strip()
  args = parser.parse_args(["tokenize", "--vocab", vocab])
  monkeypatch.setattr(sys, "stdin", io.StringIO("Hello world.\nA second line\n"))
  args.handler(args)
  out = [json.loads(l) for l in capsys.readouterr().out.splitlines()]
  tok = load_tokenizer(vocab)
  assert out == [[2, *tok.encode("Hello world."), 3], [2, *tok.encode("A second line"), 3]]
