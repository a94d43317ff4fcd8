"""T5's vocabulary (data_pipelines/t5_spm.py, tokenizer kind t5_spm) against transformers' T5Tokenizer."""
from __future__ import annotations

import pytest
import transformers

from bert_jax.data_pipelines import fairseq_spm, t5_spm
from bert_jax.data_pipelines.errors import DataError
from bert_jax.data_pipelines import tokenizer_kinds
from bert_jax.data_pipelines.tokenizers import load_tokenizer

SENTENCES = ["The quick brown fox jumps over the lazy dog.", "A sentinel marks each dropped span of text.",
             "Numbers like 1,234 and 56.7 stay."] * 40
TEXTS = ["The quick fox jumps.", "a <extra_id_0> dropped <extra_id_1> text", "Numbers 1,234   and\tdog!",
         "unseen wörds ÿ", " lead and trail  ", "<extra_id_99>"]


@pytest.fixture(name="model_path", scope="module")
def _model_path(tmp_path_factory):
  return t5_spm.train(SENTENCES, 120, str(tmp_path_factory.mktemp("spm")))


def test_ids_equal_transformers_t5_tokenizer(model_path):
  ours = load_tokenizer(model_path, kind="t5_spm")
  with open(model_path, "rb") as f:
    pieces, charsmap, _ = fairseq_spm.read_model(f.read())
  # transformers' own layout: the model's pieces, then <extra_id_99> .. <extra_id_0> (its protobuf cannot read
  # the .model here, so the pieces and normaliser are handed over as T5Tokenizer's converter would).
  vocab = [(p, s) for p, s, _ in pieces] + [(f"<extra_id_{i}>", 0.0) for i in range(99, -1, -1)]
  theirs = transformers.T5Tokenizer(vocab=vocab, _spm_precompiled_charsmap=charsmap, extra_ids=100)
  assert ours.vocab_size == len(theirs) == len(pieces) + 100
  for text in TEXTS:
    assert ours.encode(text) == theirs(text, add_special_tokens=False)["input_ids"], text
  for n in (0, 1, 99):
    assert ours.sentinel(n) == theirs.convert_tokens_to_ids(f"<extra_id_{n}>") == ours.vocab_size - 1 - n
  assert (ours.pad_id, ours.eos_id) == (theirs.pad_token_id, theirs.eos_token_id) == (0, 1)


def test_kind_is_registered_and_decode_writes_sentinels(model_path):
  assert "t5_spm" in tokenizer_kinds.loadable()
  tok = load_tokenizer(model_path, kind="t5_spm")
  ids = tok.encode("the lazy <extra_id_0> fox") + [tok.eos_id, tok.pad_id]
  assert tok.decode(ids) == "the lazy <extra_id_0> fox"
  assert tok.special_mask()[tok.sentinel(5)] and not tok.special_mask()[3]
  with pytest.raises(DataError, match="sentinels 0..99"):
    tok.sentinel(100)


def test_a_t5_folder_reads_its_spiece_model_as_t5s_kind(tmp_path, model_path):
  import json, shutil  # pylint: disable=import-outside-toplevel,multiple-imports
  from bert_jax.conversion import hf  # pylint: disable=import-outside-toplevel
  shutil.copyfile(model_path, tmp_path / "spiece.model")
  (tmp_path / "config.json").write_text(json.dumps({"model_type": "t5", "architectures": ["T5ForConditionalGeneration"]}))
  found = hf.tokenizer(str(tmp_path))
  assert found.kind == "t5_spm" and not found.lower_case and list(found.files) == ["spiece.model"]
