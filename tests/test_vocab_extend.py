"""`bert-jax vocab extend`: a domain's frequent many-piece words become tokens; old ids and old-token logits
stay; the extended model exports to transformers."""
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import bert_jax  # noqa: E402
from bert_jax.cli import main  # noqa: E402
from test_conversion_hf import build_hf  # noqa: E402

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "##s", "dog", ".", "on", "pro", "##tein",
         "##ase", "kin"] + [f"w{i}" for i in range(84)]
DOMAIN = ["the proteinase sat on the kinase .", "the proteinase sat .", "the cats sat on the proteins .",
          "the kinase sat ."] * 3


def test_extend_adds_words_keeps_old_ids_and_exports(tmp_path, capsys):
  model = build_hf("bert")
  model.save_pretrained(tmp_path / "hf")
  (tmp_path / "hf" / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
  (tmp_path / "hf" / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
  (tmp_path / "domain.txt").write_text("\n".join(DOMAIN) + "\n")
  assert main(["vocab", "extend", str(tmp_path / "hf"), str(tmp_path / "ext"), "--corpus",
               str(tmp_path / "domain.txt"), "--count", "2"]) == 0
  assert "added 2 words" in capsys.readouterr().out
  old, new = bert_jax.load_tokenizer(str(tmp_path / "hf")), bert_jax.load_tokenizer(str(tmp_path / "ext"))
  assert new.vocab == VOCAB + ["kinase", "proteinase"]  # 6 uses each (ties by the word), "proteins" 3
  assert new.encode("the proteinase sat") == [5, 101, 7] and old.encode("the proteinase sat") == [5, 12, 13, 14, 7]
  assert new.encode("the cats sat on the kin") == old.encode("the cats sat on the kin")  # old ids unchanged
  encoder, params = bert_jax.load_pretrained(str(tmp_path / "ext"))
  table = np.asarray(params["embeddings"]["word_embeddings"]["embedding"])
  original = model.bert.embeddings.word_embeddings.weight.detach().numpy()
  assert table.shape == (102, original.shape[1]) and encoder.config.vocab_size == 102
  np.testing.assert_allclose(table[101], original[[12, 13, 14]].mean(0), rtol=1e-6)
  np.testing.assert_allclose(table[100], original[[15, 14]].mean(0), rtol=1e-6)
  np.testing.assert_array_equal(table[:100], original)
  assert np.asarray(params["mlm_head"]["output_bias"]).shape == (102,)
  # exports; transformers gives the old logits for old tokens
  assert main(["convert", "--to", "hf", str(tmp_path / "ext"), str(tmp_path / "hf2")]) == 0
  reloaded = transformers.BertForPreTraining.from_pretrained(tmp_path / "hf2").eval()
  ids = torch.tensor([[2, 5, 6, 7, 3]])
  with torch.no_grad():
    before, after = model(ids).prediction_logits.numpy(), reloaded(ids).prediction_logits.numpy()
  assert after.shape[-1] == 102
  np.testing.assert_allclose(after[..., :100], before, atol=1e-5)
  tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf2")
  assert tokenizer("the proteinase sat", add_special_tokens=False)["input_ids"] == [5, 101, 7]


def test_a_checkpoint_without_tokenizer_is_refused_in_one_line(tmp_path, capsys):
  model = build_hf("bert")
  model.save_pretrained(tmp_path / "hf")
  (tmp_path / "domain.txt").write_text("the cat\n")
  assert main(["vocab", "extend", str(tmp_path / "hf"), str(tmp_path / "ext"), "--corpus",
               str(tmp_path / "domain.txt")]) == 2
  assert "no tokenizer files" in capsys.readouterr().err
