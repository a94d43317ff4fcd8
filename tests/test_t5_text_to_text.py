"""Text-to-text examples for T5 (finetune/text_to_text.py): GLUE recast as T5 does, encoding, metrics."""
from __future__ import annotations

import numpy as np
import pytest

from bert_jax.data_pipelines import t5_spm
from bert_jax.data_pipelines.tokenizers import load_tokenizer
from bert_jax.errors import UserError
from bert_jax.finetune import text_to_text as t2t


def test_glue_recast_as_t5():
  assert t2t.glue_example("sst2", {"sentence": "a gripping film", "label": 1, "idx": 7}) == (
      "sst2 sentence: a gripping film", "positive")
  assert t2t.glue_example("mnli", {"premise": "P.", "hypothesis": "H.", "label": 2, "idx": 0}) == (
      "mnli hypothesis: H. premise: P.", "contradiction")
  assert t2t.glue_example("rte", {"sentence1": "A", "sentence2": "B", "label": -1})[1] == "<unk>"
  assert t2t.glue_example("stsb", {"sentence1": "A", "sentence2": "B", "label": 3.13})[1] == "3.2"
  with pytest.raises(UserError, match="not one of"):
    t2t.glue_example("squad", {"label": 0})


def test_encoding_and_the_too_long_target(tmp_path):
  sentences = ["a gripping film about the sea", "positive negative and neutral words"] * 30
  tok = load_tokenizer(t5_spm.train(sentences, 60, str(tmp_path)), kind="t5_spm")
  (tmp_path / "src.txt").write_text("sst2 sentence: a gripping film\nsst2 sentence: the sea\n")
  (tmp_path / "tgt.txt").write_text("positive\nnegative\n")
  pairs = t2t.read_pairs(str(tmp_path / "src.txt"), str(tmp_path / "tgt.txt"))
  out = t2t.encode_pairs(pairs, tok, 32, 16)
  want = tok.encode("positive") + [1]
  assert out["labels"][0, :len(want)].tolist() == want and not out["labels"][0, len(want):].any()
  assert out["decoder_input_ids"][0, :len(want)].tolist() == [0] + want[:-1]
  source = tok.encode("sst2 sentence: a gripping film") + [1]
  assert out["input_ids"][0, :len(source)].tolist() == source and out["attention_mask"][0].sum() == len(source)
  with pytest.raises(UserError, match="longer than the decoder's length 2") as e:
    t2t.encode_pairs(pairs, tok, 16, 2)
  assert "\n" not in str(e.value)
  (tmp_path / "short.txt").write_text("positive\n")
  with pytest.raises(UserError, match="pairs line i"):
    t2t.read_pairs(str(tmp_path / "src.txt"), str(tmp_path / "short.txt"))


def test_exact_match_from_strings():
  assert t2t.exact_match(["positive", " negative ", "positive"], ["positive", "negative", "negative"]) == \
      pytest.approx(2 / 3)
  assert np.isclose(t2t.exact_match(["a"], ["a"]), 1.0)
