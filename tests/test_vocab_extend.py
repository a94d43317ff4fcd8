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


def _saved(family, path):
  """A tiny Hugging Face `family` model saved to `path`: (its vocabulary size)."""
  if family == "modernbert":
    import test_modernbert  # pylint: disable=import-outside-toplevel
    test_modernbert._hf_dir(path, transformers.ModernBertForMaskedLM)  # pylint: disable=protected-access
    return test_modernbert.VOCAB
  build_hf(family).save_pretrained(path)
  return 100


@pytest.mark.parametrize("family", ["bert", "modernbert"])
def test_a_padded_table_gives_its_padding_rows_first(tmp_path, capsys, family):
  """Pretraining pads vocab_size to a multiple (runs/demo: 8192 rows, 7716 entries): before, refused; now the
  first new word takes the padding row after the vocabulary, the second grows the table."""
  rows = _saved(family, tmp_path / "hf")
  words = VOCAB[:rows - 1]  # one padding row
  (tmp_path / "hf" / "vocab.txt").write_text("\n".join(words) + "\n")
  (tmp_path / "hf" / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
  (tmp_path / "domain.txt").write_text("\n".join(DOMAIN) + "\n")
  assert main(["vocab", "extend", str(tmp_path / "hf"), str(tmp_path / "ext"), "--corpus",
               str(tmp_path / "domain.txt"), "--count", "2"]) == 0
  assert f"added 2 words (ids {rows - 1}..{rows})" in capsys.readouterr().out
  assert bert_jax.load_tokenizer(str(tmp_path / "ext")).vocab == words + ["kinase", "proteinase"]
  _, before = bert_jax.load_pretrained(str(tmp_path / "hf"))
  encoder, after = bert_jax.load_pretrained(str(tmp_path / "ext"))
  old, new = (np.asarray(p["embeddings"]["word_embeddings"]["embedding"]) for p in (before, after))
  assert new.shape == (rows + 1, old.shape[1]) and encoder.config.vocab_size == rows + 1
  np.testing.assert_array_equal(new[:rows - 1], old[:rows - 1])
  np.testing.assert_allclose(new[rows - 1], old[[15, 14]].mean(0), rtol=1e-6)  # kin ##ase, in the padding row
  np.testing.assert_allclose(new[rows], old[[12, 13, 14]].mean(0), rtol=1e-6)  # pro ##tein ##ase, a new row
  assert np.asarray(after["mlm_head"]["output_bias"]).shape == (rows + 1,)


def test_a_checkpoint_without_tokenizer_is_refused_in_one_line(tmp_path, capsys):
  model = build_hf("bert")
  model.save_pretrained(tmp_path / "hf")
  (tmp_path / "domain.txt").write_text("the cat\n")
  assert main(["vocab", "extend", str(tmp_path / "hf"), str(tmp_path / "ext"), "--corpus",
               str(tmp_path / "domain.txt")]) == 2
  assert "no tokenizer files" in capsys.readouterr().err


# --- SentencePiece ------------------------------------------------------------------------------------------

SP_DOMAIN = ["the immunoglobulin binds the receptor", "an immunoglobulin and a phosphorylation",
             "phosphorylation of the immunoglobulin"] * 4


def _albert_folder(path):
  """A tiny random AlbertForMaskedLM with a unigram spiece.model trained with ALBERT's flags on English text."""
  import io
  import sentencepiece as spm
  import data_fixtures
  from bert_jax.data_pipelines.tokenizers import albert_preprocess
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter([albert_preprocess(s, True) for s in data_fixtures.real_sentences(1500)]),
      model_writer=model, vocab_size=500, model_type="unigram", pad_id=0, unk_id=1, bos_id=-1, eos_id=-1,
      control_symbols=["[CLS]", "[SEP]", "[MASK]"], minloglevel=2)
  path.mkdir()
  (path / "spiece.model").write_bytes(model.getvalue())
  torch.manual_seed(0)
  config = transformers.AlbertConfig(vocab_size=500, embedding_size=16, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=37, max_position_embeddings=64)
  hf = transformers.AlbertForMaskedLM(config).eval()
  hf.save_pretrained(path)
  (path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
  return hf


def _logits(model, ids):
  with torch.no_grad():
    return model(torch.tensor(ids)).logits.numpy()


def test_sentencepiece_extension_appends_unigram_pieces(tmp_path):
  """ALBERT's layout: the words join spiece.model after the old pieces; old ids and logits stay; transformers'
  Unigram over the exported model's pieces and scores (what its AlbertConverter builds) gives our ids."""
  from bert_jax.data_pipelines import fairseq_spm
  model = _albert_folder(tmp_path / "hf")
  (tmp_path / "domain.txt").write_text("\n".join(SP_DOMAIN) + "\n")
  old = bert_jax.load_tokenizer(str(tmp_path / "hf"))
  text = "the immunoglobulin binds phosphorylation"
  assert len(old.encode("immunoglobulin")) > 2 and len(old.encode("phosphorylation")) > 2
  assert main(["vocab", "extend", str(tmp_path / "hf"), str(tmp_path / "ext"), "--corpus",
               str(tmp_path / "domain.txt"), "--count", "2"]) == 0
  new = bert_jax.load_tokenizer(str(tmp_path / "ext"))
  assert new.vocab == old.vocab + ["\u2581immunoglobulin", "\u2581phosphorylation"]
  assert new.encode(text) == [*old.encode("the"), 500, *old.encode("binds"), 501]
  plain = "the cat sat on the mat with 1,000 people."
  assert new.encode(plain) == old.encode(plain)
  _, params = bert_jax.load_pretrained(str(tmp_path / "ext"))
  table = np.asarray(params["embeddings"]["word_embeddings"]["embedding"])
  original = model.albert.embeddings.word_embeddings.weight.detach().numpy()
  np.testing.assert_array_equal(table[:500], original)
  np.testing.assert_allclose(table[500], original[old.encode("immunoglobulin")].mean(0), rtol=1e-6)
  assert main(["convert", "--to", "hf", str(tmp_path / "ext"), str(tmp_path / "hf2")]) == 0
  reloaded = transformers.AlbertForMaskedLM.from_pretrained(tmp_path / "hf2").eval()
  ids = [[2, *old.encode(plain), 3]]
  after = _logits(reloaded, ids)
  assert after.shape[-1] == 502
  np.testing.assert_allclose(after[..., :500], _logits(model, ids), atol=1e-5)
  pieces, charsmap, _ = fairseq_spm.read_model((tmp_path / "hf2" / "spiece.model").read_bytes())
  theirs = transformers.AlbertTokenizer(vocab=[(p, s) for p, s, _ in pieces], _spm_precompiled_charsmap=charsmap)
  assert theirs(text, add_special_tokens=False)["input_ids"] == new.encode(text)


@pytest.mark.parametrize("family", ["camembert", "xlm-roberta"])
def test_fairseq_extension_keeps_mask_and_old_ids(tmp_path, family):
  """CamemBERT's / XLM-R's layout: `<mask>` keeps its id (the last old one), the words take the ids after it
  in the tokenizer.json; transformers loads the export, gives our ids and the old logits for old tokens."""
  import sentencepiece as spm
  import test_camembert as cb
  path = tmp_path / "spm" / "sentencepiece.bpe.model"
  path.parent.mkdir()
  spm.SentencePieceTrainer.train(sentence_iterator=iter(cb.FRENCH[:cb.TRAIN]), model_prefix=str(path.with_suffix("")),
                                 vocab_size=600, model_type="unigram", minloglevel=2)
  path.with_suffix(".model").rename(path)
  folder, model, _ = cb._folders(tmp_path, family, path)  # pylint: disable=protected-access
  domain = ["La phosphorylation de l'immunoglobuline", "une immunoglobuline et la phosphorylation"] * 4
  (tmp_path / "domain.txt").write_text("\n".join(domain) + "\n")
  old = bert_jax.load_tokenizer(str(folder))
  size, mask = old.vocab_size, old.special_ids["[MASK]"]
  assert mask == size - 1
  assert main(["vocab", "extend", str(folder), str(tmp_path / "ext"), "--corpus", str(tmp_path / "domain.txt"),
               "--count", "2"]) == 0
  new = bert_jax.load_tokenizer(str(tmp_path / "ext"))
  assert new.special_ids == old.special_ids and new.vocab[:size] == old.vocab
  assert new.vocab[size:] == ["\u2581immunoglobuline", "\u2581phosphorylation"]
  assert new.encode("La phosphorylation <mask>") == [*old.encode("La"), size + 1, mask]
  held_out = cb.FRENCH[cb.TRAIN:cb.TRAIN + 20]
  assert [new.encode(line) for line in held_out] == [old.encode(line) for line in held_out]
  assert main(["convert", "--to", "hf", str(tmp_path / "ext"), str(tmp_path / "hf2")]) == 0
  reloaded = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path / "hf2").eval()
  ids = [[old.special_ids["[CLS]"], *old.encode(held_out[0])[:20], mask, old.special_ids["[SEP]"]]]
  after = _logits(reloaded, ids)
  assert after.shape[-1] == size + 2
  np.testing.assert_allclose(after[..., :size], _logits(model, ids), atol=1e-5)
  theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf2")
  for line in ["La phosphorylation <mask>", "une immunoglobuline", *held_out[:5]]:
    assert theirs(line, add_special_tokens=False)["input_ids"] == new.encode(line), line
