"""Byte-level BPE against the `tokenizers` package, and RoBERTa's tokenizer travelling with its checkpoint."""
import json
import os

import pytest

tokenizers = pytest.importorskip("tokenizers")

from bert_jax.conversion.bpe import ByteLevelBPETokenizer  # noqa: E402

CORPUS = ["The quick brown fox jumps over the lazy dog's back, doesn't it?",
          "Numbers 12345 and 3.14159 — with ünïcödé, naïve café, 東京 and emoji 🙂🙂.",
          "  leading spaces,\ttabs\nand newlines   at the end   ",
          "We'll see: they're here; I'm sure you've heard it'd work."] * 20
SAMPLES = CORPUS[:4] + ["unseen wordsmithery zzzqx", "Ⅻ ² ½ 〇 numerals", "", "a", "don't  stop 🙂 now"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  directory = str(tmp_path_factory.mktemp("bpe"))
  reference = tokenizers.ByteLevelBPETokenizer()
  reference.train_from_iterator(CORPUS, vocab_size=400, min_frequency=1,
                                special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
  reference.save_model(directory)
  return reference, directory


def test_encode_matches_tokenizers(trained):
  reference, directory = trained
  ours = ByteLevelBPETokenizer(os.path.join(directory, "vocab.json"), os.path.join(directory, "merges.txt"))
  for text in SAMPLES:
    assert ours.encode(text) == reference.encode(text).ids, text
    assert ours.decode(ours.encode(text)) == text
  assert ours.vocab_size == reference.get_vocab_size()
  assert ours.special_ids == {"[PAD]": 1, "[UNK]": 3, "[CLS]": 0, "[SEP]": 2, "[MASK]": 4}
  assert ours.id_to_token(0) == "<s>"


def test_roberta_directory_brings_its_tokenizer(trained, tmp_path):
  import bert_jax
  _, directory = trained
  for name in ("vocab.json", "merges.txt"):
    with open(os.path.join(directory, name), "rb") as src, open(tmp_path / name, "wb") as dst:
      dst.write(src.read())
  with open(tmp_path / "config.json", "w") as f:
    json.dump({"model_type": "roberta", "architectures": ["RobertaForMaskedLM"]}, f)
  tokenizer = bert_jax.load_tokenizer(str(tmp_path))
  assert isinstance(tokenizer, ByteLevelBPETokenizer)
  assert tokenizer.encode("the lazy dog") == trained[0].encode("the lazy dog").ids
