"""A tokenizer kind is one registration (data_pipelines/tokenizer_kinds.py): a toy kind registered here (one
character per token over a chars.txt vocabulary) loads through load_tokenizer, is found in a checkpoint folder
by its file when a family prefers it, is described in messages, records its own field in a workdir's
config.json and is read back from one; nothing else in bert_jax names it. Beside tests/test_family_record.py's
toy family, it is what a family with a new tokenizer brings."""
from __future__ import annotations

import dataclasses
import json

import pytest

from bert_jax.conversion import common, native, vocab_extend
from bert_jax.data_pipelines import tokenizer_kinds, tokenizers
from bert_jax.data_pipelines.errors import DataError
from bert_jax.data_pipelines.tokenizer_base import TokenizerBase
from bert_jax.errors import UserError

SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


class CharTokenizer(TokenizerBase):
  """One token per character; a character not in the vocabulary is [UNK]."""
  kind = "toy_chars"

  def __init__(self, path: str, lower_case: bool):
    self.path, self.lower_case = path, lower_case
    with open(path, encoding="utf-8") as f:
      self.vocab = [line.rstrip("\n") for line in f]
    self._ids = {t: i for i, t in enumerate(self.vocab)}
    self.special_ids = {t: self._ids[t] for t in SPECIALS}

  def encode(self, text: str) -> list[int]:
    text = text.lower() if self.lower_case else text
    return [self._ids.get(c, self.special_ids["[UNK]"]) for c in text if not c.isspace()]


TOY_KIND = tokenizer_kinds.TokenizerKind(
    "toy_chars", lambda path, lower, chars, quotes: CharTokenizer(path, lower), files=("chars.txt",),
    hf_class="PreTrainedTokenizerFast", saved=lambda t: {"alphabet": len(t.vocab) - len(SPECIALS)})


@pytest.fixture
def toy_kind():
  tokenizer_kinds.register(TOY_KIND)
  yield TOY_KIND
  tokenizer_kinds.unregister(TOY_KIND.name)


@pytest.fixture
def chars(tmp_path):
  folder = tmp_path / "ckpt"
  folder.mkdir()
  (folder / "chars.txt").write_text("\n".join([*SPECIALS, *"abcdef"]) + "\n")
  (folder / "vocab.txt").write_text("\n".join([*SPECIALS, "abc"]) + "\n")  # a WordPiece file beside it
  return folder


def test_a_registered_kind_loads_and_tokenizes(toy_kind, chars):
  tokenizer = tokenizers.load_tokenizer(str(chars / "chars.txt"), True, kind="toy_chars")
  assert tokenizer.encode("Fad e!") == [5 + 5, 5 + 0, 5 + 3, 5 + 4, 1]  # f a d e, then "!" unknown
  assert "toy_chars" in tokenizer_kinds.loadable()
  with pytest.raises(DataError, match=r"tokenizer kind 'nope' is not one of \(.*'toy_chars'"):
    tokenizers.load_tokenizer(str(chars / "chars.txt"), kind="nope")


def test_a_family_preferring_the_kind_finds_its_file_and_messages_name_it(toy_kind, chars):
  found = common.tokenizer_from_files(str(chars), lower_case=True, preferred="toy_chars")
  assert found.kind == "toy_chars" and found.files == {"chars.txt": str(chars / "chars.txt")}
  assert common.tokenizer_from_files(str(chars), lower_case=True).kind == "wordpiece"  # BERT's preference wins
  assert common.tokenizer_file_names("toy_chars") == "chars.txt"
  assert "chars.txt" in common.tokenizer_file_names()


def test_a_workdir_records_the_kind_and_reads_it_back(toy_kind, chars):
  tokenizer = tokenizers.load_tokenizer(str(chars / "chars.txt"), False, kind="toy_chars")
  assert tokenizer_kinds.saved_fields(tokenizer) == {"tokenizer": "toy_chars", "lower_case": False, "alphabet": 6}
  (chars / "config.json").write_text(json.dumps({"model": {}, "data": {"vocab": "chars.txt", "lower_case": False,
                                                                       **tokenizer_kinds.saved_fields(tokenizer)}}))
  back = native.tokenizer(str(chars))
  assert back.kind == "toy_chars" and back.files == {"chars.txt": str(chars / "chars.txt")} and not back.lower_case


def test_built_in_kinds_keep_their_order_and_a_kind_registers_once():
  assert tokenizer_kinds.loadable() == ("wordpiece", "sentencepiece", "xlnet_spm", "camembert_spm", "xlmr_spm",
                                        "tokenizer_json", "t5_spm", "deberta_spm")
  assert tokenizer_kinds.get("bpe").load is None and tokenizer_kinds.get("wordpiece").hf_class == "BertTokenizer"
  with pytest.raises(ValueError, match="registered twice"):
    tokenizer_kinds.register(tokenizer_kinds.get("wordpiece"))


def test_word_limit_and_vocabulary_extension_are_fields_of_the_kind(toy_kind):
  # Before the fields, conversion/hf.py and vocab_extend.py named these kinds; the fields keep the same sets.
  assert [k for k in tokenizer_kinds.names() if tokenizer_kinds.get(k).hf_word_limit] == ["wordpiece"]
  assert vocab_extend.extendable() == ("wordpiece", "sentencepiece", "camembert_spm", "xlmr_spm")
  assert "toy_chars" not in vocab_extend.extendable()
  tokenizer_kinds.unregister(toy_kind.name)
  tokenizer_kinds.register(dataclasses.replace(toy_kind, extend="whole_word"))  # a new kind opts in by its field
  assert vocab_extend.extendable()[-1] == "toy_chars"
  with pytest.raises(UserError, match="a bpe vocabulary; `bert-jax vocab extend` extends wordpiece, sentencepiece, "
                                      "camembert_spm, xlmr_spm, toy_chars vocabularies"):
    vocab_extend._way("bpe")  # pylint: disable=protected-access
