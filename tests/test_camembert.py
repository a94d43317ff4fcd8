"""CamemBERT and XLM-RoBERTa against transformers: tokenizer ids, outputs with padding, convert both ways.

A SentencePiece unigram vocabulary is trained here on French sentences (tests/testdata/french.txt, the
first TRAIN lines); the held-out French lines and German, Chinese, Arabic and emoji lines
(multilingual.txt) are tokenized by both sides. transformers' tokenizer is its CamembertTokenizer /
XLMRobertaTokenizer over that model's pieces in fairseq's layout (what its converters make of a
sentencepiece.bpe.model) with the model's nmt_nfkc character map, saved to a folder as tokenizer.json.
"""
import os
import pathlib
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import sentencepiece as spm  # noqa: E402

import bert_jax  # noqa: E402
from bert_jax.cli import main  # noqa: E402
from bert_jax.data_pipelines import fairseq_spm  # noqa: E402
from bert_jax.data_pipelines.tokenizers import load_tokenizer  # noqa: E402
from core_helpers import slow  # noqa: E402
import test_conversion_heads as heads_test  # noqa: E402

DATA = pathlib.Path(__file__).parent / "testdata"
FRENCH = (DATA / "french.txt").read_text(encoding="utf-8").splitlines()
OTHER = (DATA / "multilingual.txt").read_text(encoding="utf-8").splitlines()
TRAIN = 200
HELD_OUT = FRENCH[TRAIN:] + OTHER + [
    "  espaces   multiples\tet tabulations  ", "", "Il a dit <mask> hier.", "ﬁn ½ ＡＢＣ…", "l’été « oui »",
    "e\u0301te\u0301 (accents décomposés)", "x\u00a0y\u202fz",
    # grapheme clusters the character map sees whole (tokenizers' Precompiled) or character by character
    "é\u0301\u0301 e\u0301\u0300 ﬁ\u0301 a\r\nb 👨\u200d👩\u200d👧 1\ufe0f\u20e3 \u200bzéro"]


def _hf_vocab(family: str, sp) -> list[tuple[str, float]]:
  """transformers' CamembertConverter / XLMRobertaConverter vocabulary, written out from the model's pieces."""
  pieces = [(sp.id_to_piece(i), sp.get_score(i)) for i in range(sp.get_piece_size())]
  if family == "camembert":
    return ([("<s>NOTUSED", 0.0), ("<pad>", 0.0), ("</s>NOTUSED", 0.0), ("<unk>", 0.0), ("<unk>NOTUSED", -100.0)]
            + pieces[1:] + [("<mask>", 0.0)])
  return [("<s>", 0.0), ("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)] + pieces[3:] + [("<mask>", 0.0)]


VARIANTS = {"camembert": ("Camembert", "camembert_spm"), "xlm-roberta": ("XLMRoberta", "xlmr_spm")}


@pytest.fixture(scope="module")
def spm_model(tmp_path_factory):
  path = tmp_path_factory.mktemp("spm") / fairseq_spm.HF_MODEL_FILE
  spm.SentencePieceTrainer.train(sentence_iterator=iter(FRENCH[:TRAIN]), model_prefix=str(path.with_suffix("")),
                                 vocab_size=600, model_type="unigram", minloglevel=2)
  path.with_suffix(".model").rename(path)
  return path


def _folders(root: pathlib.Path, family: str, spm_path: pathlib.Path):
  """(HF model folder with tokenizer.json and sentencepiece.bpe.model, the HF model, the HF tokenizer)."""
  prefix, _ = VARIANTS[family]
  sp = spm.SentencePieceProcessor(model_file=str(spm_path))
  charsmap = fairseq_spm.read_model(spm_path.read_bytes())[1]
  assert charsmap  # spm_train's nmt_nfkc
  tokenizer = getattr(transformers, f"{prefix}Tokenizer")(vocab=_hf_vocab(family, sp),
                                                           _spm_precompiled_charsmap=charsmap)
  torch.manual_seed(0)
  config = getattr(transformers, f"{prefix}Config")(
      vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
      max_position_embeddings=66, pad_token_id=1, bos_token_id=tokenizer.cls_token_id,
      eos_token_id=tokenizer.sep_token_id)
  model = getattr(transformers, f"{prefix}ForMaskedLM")(config).eval()
  folder = root / family
  model.save_pretrained(folder)
  tokenizer.save_pretrained(folder)
  shutil.copy(spm_path, folder / fairseq_spm.HF_MODEL_FILE)
  return folder, model, getattr(transformers, f"{prefix}Tokenizer").from_pretrained(folder)


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def hf(request, tmp_path_factory, spm_model):
  return (request.param, *_folders(tmp_path_factory.mktemp("hf"), request.param, spm_model))


@pytest.mark.parametrize("source", ["tokenizer.json", "sentencepiece.bpe.model"])
def test_ids_equal_hf(hf, source, tmp_path):
  family, folder, _, reference = hf
  if source == "sentencepiece.bpe.model":  # a folder without tokenizer.json: the model laid out here
    folder = pathlib.Path(shutil.copytree(folder, tmp_path / "model_only"))
    (folder / "tokenizer.json").unlink()
  tokenizer = bert_jax.load_tokenizer(str(folder))
  assert tokenizer.kind == VARIANTS[family][1] and os.path.basename(tokenizer.path) == source
  expected = [reference(line, add_special_tokens=False)["input_ids"] for line in HELD_OUT]
  got = [tokenizer.encode(line) for line in HELD_OUT]
  wrong = [(line, g, e) for line, g, e in zip(HELD_OUT, got, expected) if g != e]
  assert not wrong, wrong[:3]
  assert tokenizer.vocab == reference.convert_ids_to_tokens(list(range(len(reference))))
  roles = {"[PAD]": "pad", "[UNK]": "unk", "[CLS]": "cls", "[SEP]": "sep", "[MASK]": "mask"}
  assert tokenizer.special_ids == {r: getattr(reference, f"{name}_token_id") for r, name in roles.items()}
  # the held-out text reaches the unknown token (Chinese, Arabic), `<mask>` and the fairseq offset
  flat = sum(got, [])
  assert tokenizer.special_ids["[UNK]"] in flat and tokenizer.special_ids["[MASK]"] in flat
  assert (tokenizer.special_ids["[CLS]"], tokenizer.special_ids["[SEP]"]) == ((5, 6) if family == "camembert"
                                                                              else (0, 2))


def _batch(tokenizer, lines):
  ids = [[tokenizer.special_ids["[CLS]"], *tokenizer.encode(line)[:30], tokenizer.special_ids["[SEP]"]]
         for line in lines]
  width = max(map(len, ids))
  pad = tokenizer.special_ids["[PAD]"]
  batch = np.array([row + [pad] * (width - len(row)) for row in ids], np.int32)
  return batch, (batch != pad).astype(np.int32)


def _reference(model, ids, mask):
  with torch.no_grad():
    out = model(torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(mask), output_hidden_states=True)
  return out.logits.numpy(), out.hidden_states[-1].numpy()


def test_outputs_equal_hf_with_padding(hf):
  family, folder, model, _ = hf
  encoder, params = bert_jax.load_pretrained(str(folder))
  assert encoder.config.family == family and encoder.config.position_style == "roberta"
  ids, mask = _batch(bert_jax.load_tokenizer(str(folder)), ["Le chat dort.", HELD_OUT[0], "Bonjour 😀 中文"])
  assert mask.min() == 0  # padding in the batch
  out = encoder.apply({"params": params}, ids, attention_mask=mask)
  logits, hidden = _reference(model, ids, mask)
  keep = mask.astype(bool)
  np.testing.assert_allclose(np.asarray(out.mlm_logits)[keep], logits[keep], atol=1e-5, rtol=0)
  np.testing.assert_allclose(np.asarray(out.last_hidden_state)[keep], hidden[keep], atol=1e-5, rtol=0)


@slow  # weekly suite (BERT_JAX_SLOW_TESTS=1): the suite's 15 minutes; the family's HF-equality test stays
def test_convert_both_ways(hf, tmp_path):
  """HF -> bert_jax -> HF: the same weights, a tokenizer transformers loads (tokenizer.json written when the
  source had only the SentencePiece model) and gives the same ids."""
  family, folder, model, reference = hf
  source = pathlib.Path(shutil.copytree(folder, tmp_path / "source"))
  (source / "tokenizer.json").unlink()
  assert main(["convert", "--from", "hf", str(source), str(tmp_path / "ours")]) == 0
  assert main(["convert", "--to", "hf", str(tmp_path / "ours"), str(tmp_path / "back")]) == 0
  back = tmp_path / "back"
  assert {"sentencepiece.bpe.model", "tokenizer.json"} <= set(os.listdir(back))
  reloaded = transformers.AutoModelForMaskedLM.from_pretrained(back).eval()
  assert reloaded.config.model_type == family and type(reloaded).__name__ == type(model).__name__
  ids, mask = _batch(bert_jax.load_tokenizer(str(back)), HELD_OUT[:4])
  np.testing.assert_array_equal(_reference(reloaded, ids, mask)[0], _reference(model, ids, mask)[0])
  tokenizer = transformers.AutoTokenizer.from_pretrained(back)
  assert type(tokenizer).__name__ == type(reference).__name__
  for line in HELD_OUT[:40]:
    assert tokenizer(line)["input_ids"] == reference(line)["input_ids"], line


def _french_sst2(directory: pathlib.Path) -> str:
  """sst2-format train.tsv/dev.tsv of French sentences whose label is their first word (vrai/faux)."""
  directory.mkdir()
  rng = np.random.default_rng(0)
  for split, lines in (("train", FRENCH[:128]), ("dev", FRENCH[128:160])):
    rows = ["sentence\tlabel"]
    for line in lines:
      label = int(rng.integers(2))
      rows.append(f"{('faux', 'vrai')[label]} {line}\t{label}")
    (directory / f"{split}.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
  return str(directory)


@slow  # weekly suite (BERT_JAX_SLOW_TESTS=1): the suite's 15 minutes; the family's HF-equality test stays
@pytest.mark.parametrize("family,kind", [("camembert", "classification"), ("xlm-roberta", "token")])
def test_fine_tuned_heads_export(tmp_path, monkeypatch, family, kind):
  """A fine-tuned head (random weights, test_conversion_heads' workdir) exports to Camembert/XLMRoberta
  For<Task>, whose logits are the Predictor's."""
  prefix = VARIANTS[family][0]
  monkeypatch.setitem(heads_test.FAMILIES, family, (prefix, dict(
      family=family, position_style="roberta", pad_token_id=1, type_vocab_size=1, layer_norm_eps=1e-5,
      max_position_embeddings=66)))
  config, params = heads_test.fine_tuned_workdir(tmp_path / "ft", family, kind)
  assert main(["convert", "--to", "hf", str(tmp_path / "ft"), str(tmp_path / "hf")]) == 0
  model = getattr(transformers, prefix + heads_test.HF_CLASSES[kind]).from_pretrained(tmp_path / "hf").eval()
  assert model.config.model_type == family
  rows = heads_test.batch(config)
  ours = bert_jax.Predictor.build(config, params, tokenizer=None).run(rows)["logits"]
  theirs = heads_test.hf_logits(model, kind, rows)["logits"]
  keep = rows["attention_mask"] > 0 if kind == "token" else slice(None)
  np.testing.assert_allclose(ours[keep], theirs[keep], atol=1e-5, rtol=0)
  assert np.abs(theirs).max() > 0.05


@slow  # a ~3 min chain on a loaded 2-core machine; its parts are the tests above
def test_finetune_predict_and_export(tmp_path, spm_model):
  """`bert-jax finetune` from the HF CamemBERT folder itself (init_from), its tokenizer travelling with the
  run: the exported CamembertForSequenceClassification and its tokenizer give the Predictor's logits."""
  folder, _, _ = _folders(tmp_path, "camembert", spm_model)
  workdir = tmp_path / "ft"
  assert main(["finetune", "--config", "configs/glue.py:sst2", "--workdir", str(workdir),
               f"--config.init_from={folder}", f"--config.data.data_dir={_french_sst2(tmp_path / 'sst2')}",
               "--config.data.max_seq_length=32", "--config.train.batch_size=16", "--config.train.epochs=1",
               "--config.train.eval_batch_size=32", "--config.train.tensorboard=false"]) == 0
  sentences = ["vrai Le chat dort.", "faux Il pleut à Paris 😀", HELD_OUT[3]]
  ours = bert_jax.Predictor.load(str(workdir)).outputs(sentences)["logits"]
  assert main(["convert", "--to", "hf", str(workdir), str(tmp_path / "hf")]) == 0
  model = transformers.CamembertForSequenceClassification.from_pretrained(tmp_path / "hf").eval()
  tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
  with torch.no_grad():
    theirs = model(**tokenizer(sentences, padding=True, truncation=True, max_length=32,
                               return_tensors="pt")).logits.numpy()
  np.testing.assert_allclose(ours, theirs, atol=1e-5, rtol=0)
  assert np.abs(theirs).max() > 0.01


@slow  # weekly suite (BERT_JAX_SLOW_TESTS=1): the suite's 15 minutes; the family's HF-equality test stays
@pytest.mark.parametrize("kind,head", [("camembert_spm", 5), ("xlmr_spm", 2)])
def test_vocabulary_training_writes_the_fairseq_layout(tmp_path, kind, head):
  """`bert-jax vocab --type camembert_spm|xlmr_spm`: a cased unigram model and the tokenizer.json of its layout,
  which transformers loads and tokenizes with as bert_jax does; whole-word masking sees its word starts."""
  corpus = tmp_path / "fr.txt"
  corpus.write_text("\n".join(FRENCH[:TRAIN]) + "\n", encoding="utf-8")
  assert main(["vocab", "--type", kind, "--size", "400", "--corpus", str(corpus), "--output",
               str(tmp_path / "vocab")]) == 0
  assert sorted(os.listdir(tmp_path / "vocab")) == ["sentencepiece.bpe.model", "tokenizer.json"]
  ours = load_tokenizer(str(tmp_path / "vocab" / "sentencepiece.bpe.model"), kind=kind)
  prefix = VARIANTS["camembert" if kind == "camembert_spm" else "xlm-roberta"][0]
  theirs = getattr(transformers, f"{prefix}Tokenizer").from_pretrained(tmp_path / "vocab")
  assert ours.vocab_size == len(theirs) == 400 + head and ours.special_ids["[PAD]"] == theirs.pad_token_id == 1
  for line in HELD_OUT:
    assert ours.encode(line) == theirs(line, add_special_tokens=False)["input_ids"], line
  assert "Le" not in ours.vocab[:head] and ours.vocab[-1] == "<mask>"
  word_starts = ~ours.continuation_mask()
  pieces = theirs.convert_ids_to_tokens(ours.encode("Les randonneurs"))
  assert [word_starts[ours.vocab.index(p)] for p in pieces] == [p.startswith("\u2581") for p in pieces]
  assert not all(word_starts[ours.vocab.index(p)] for p in pieces)  # a word of several pieces


@slow  # ~2 min on a loaded 2-core machine (the embedded corpus's unigram vocabulary, once, and compiles)
def test_camembert_tiny_pretrains_and_exports_as_camembert(tmp_path):
  """configs/camembert.py:tiny pretrains a few steps; `convert --to hf` gives a CamembertForMaskedLM and a
  CamembertTokenizer that reproduce bert_jax's logits and ids."""
  from bert_jax.config_utils import load_config  # pylint: disable=import-outside-toplevel
  from bert_jax.training import trainer  # pylint: disable=import-outside-toplevel
  config = load_config("configs/camembert.py:tiny", [
      "--config.train.batch_size=8", "--config.data.max_seq_length=32", "--config.train.num_steps=4",
      "--config.train.log_every_steps=2", "--config.train.eval_every_steps=0", "--config.checkpoint.every_steps=100",
      "--config.checkpoint.async_save=False", "--config.data.num_shards=2", "--config.optimizer.warmup_steps=2"])
  assert config.data.masking == "whole_word" and config.data.tokenizer == "camembert_spm"
  trainer.pretrain(config, str(tmp_path / "run"))
  assert main(["convert", "--to", "hf", str(tmp_path / "run"), str(tmp_path / "hf")]) == 0
  model = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path / "hf").eval()
  assert type(model).__name__ == "CamembertForMaskedLM"
  theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
  ours = bert_jax.load_tokenizer(str(tmp_path / "run"))
  assert type(theirs).__name__ == "CamembertTokenizer" and ours.kind == "camembert_spm"
  lines = ["The module returns a list of strings.", "Le chat dort.", "An object's attributes, e.g. __dict__."]
  for line in lines:
    assert ours.encode(line) == theirs(line, add_special_tokens=False)["input_ids"], line
  ids, mask = _batch(ours, lines)
  encoder, params = bert_jax.load_pretrained(str(tmp_path / "run"))
  logits = np.asarray(encoder.apply({"params": params}, ids, attention_mask=mask).mlm_logits)
  keep = mask.astype(bool)
  np.testing.assert_allclose(logits[keep], _reference(model, ids, mask)[0][keep], atol=1e-4, rtol=0)


def test_a_tokenizer_of_symbols_alone_loads_as_transformers_saves_it(tmp_path):
  """CamembertTokenizer(vocab_file=...) in transformers 5 keeps fairseq's symbols alone (its converter runs in
  from_pretrained only); such a folder's tokenizer.json, its added tokens past the vocabulary, still loads."""
  reference = transformers.CamembertTokenizer()
  reference.save_pretrained(tmp_path)
  ours = fairseq_spm.FairseqSentencePieceTokenizer(str(tmp_path / "tokenizer.json"), "camembert_spm")
  assert ours.vocab_size == len(reference)
  for line in ["Le chat dort.", "a <mask> b", "<s>x</s>", ""]:
    assert ours.encode(line) == reference(line, add_special_tokens=False)["input_ids"], line


def test_a_folder_without_tokenizer_names_its_files_and_takes_its_model_as_data_vocab(hf, tmp_path):
  """Before: "no tokenizer files (vocab.txt, *.model, or vocab.json + merges.txt)" without the family's two
  names, and the folder's sentencepiece.bpe.model as data.vocab read as ALBERT's layout (refused for lacking
  [PAD] [CLS] [SEP] [MASK], with advice to train a vocabulary)."""
  import ml_collections  # pylint: disable=import-outside-toplevel
  from bert_jax.data_pipelines import shards  # pylint: disable=import-outside-toplevel
  from bert_jax.data_pipelines.errors import DataError  # pylint: disable=import-outside-toplevel
  from bert_jax.errors import UserError  # pylint: disable=import-outside-toplevel
  from bert_jax.finetune import init  # pylint: disable=import-outside-toplevel
  family, folder, _, reference = hf
  bare = tmp_path / "bare"
  bare.mkdir()
  for name in ("config.json", "model.safetensors"):
    shutil.copy(folder / name, bare / name)
  with pytest.raises(UserError, match=f"no tokenizer files found; a {family} model reads tokenizer.json or "
                                      "sentencepiece.bpe.model: put its tokenizer there, or give it as data.vocab"):
    bert_jax.load_tokenizer(str(bare))
  for source in ("sentencepiece.bpe.model", "tokenizer.json"):
    config = ml_collections.ConfigDict({"init_from": str(bare), "data": {"vocab": str(folder / source),
                                                                          "lower_case": True}})
    tokenizer = init.load_tokenizer(config)
    assert tokenizer.kind == VARIANTS[family][1]
    assert [tokenizer.encode(line) for line in HELD_OUT[:20]] == [
        reference(line, add_special_tokens=False)["input_ids"] for line in HELD_OUT[:20]]
  # pretraining's data.tokenizer left at wordpiece: told which kinds read the model
  data = ml_collections.ConfigDict({"vocab": str(folder / "sentencepiece.bpe.model"), "tokenizer": "wordpiece",
                                    "lower_case": True})
  with pytest.raises(DataError, match="read it with data.tokenizer=sentencepiece .*camembert_spm or xlmr_spm"):
    shards.make_tokenizer(data)
