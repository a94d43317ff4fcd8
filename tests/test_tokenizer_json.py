"""Hugging Face tokenizer.json folders of the kinds released encoders ship (byte-level BPE as ModernBERT's,
Unigram with Metaspace as XLM-R-like multilingual ones, WordPiece), trained here with the `tokenizers`
trainers on a few hundred multilingual lines and saved by transformers' PreTrainedTokenizerFast: bert_jax's
tokenizer_json kind against transformers' AutoTokenizer on held-out lines, and a tiny ModernBERT folder beside
each through load_pretrained, convert, embed, fine-tuning's features and data prepare."""
import glob
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from core_helpers import slow
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

import bert_jax
from bert_jax import cli
from bert_jax.data_pipelines import hf_tokenizer, prepare, shards, tftools
from bert_jax.data_pipelines.errors import DataError
from bert_jax.data_pipelines.tokenizers import BERT_LAYOUT, load_tokenizer
from bert_jax.models import ModernBertModel

tf = tftools.tf()  # TensorFlow without Keras, as bert_jax imports it

_WORDS = {
    "en": "the quick brown fox jumps over a lazy dog while children play in the garden near old houses".split(),
    "de": "der schnelle braune Fuchs springt über den faulen Hund während Kinder im Garten spielen".split(),
    "zh": list("敏捷的棕色狐狸跳过了懒狗孩子们在花园里玩耍老房子附近"),
    "ar": "الثعلب البني السريع يقفز فوق الكلب الكسول بينما يلعب الأطفال في الحديقة".split(),
    "emoji": ["🎉", "❤️", "👍🏽", "🙂", "🚀", "café", "naïve", "12,345", "3.14", "e-mail", "(yes)", "don't"],
}
HELD_OUT = [
    "A brown dog plays; the garden's houses are old!",
    "Die Kinder spielen über Füchse und Hündinnen.",
    "孩子们在老花园里跳。狐狸很快！",
    "يلعب الكلب في الحديقة الكبيرة",
    "Party 🎉🎉 at the café 🚀 — naïve rockets, 42,000 of them 👍🏽",
    "  spaces\tand tabs   between\nlines  ",
    "[MASK] and <mask> as text, [CLS] too",
    "Ω≈ç√∫ µ unseen ДОМ 🦄",
    "Москва — столица России; ёлка и Ёж.",
    "日本語のテキスト、한국어 문장도 있어요。",
]


def _lines(count=300, seed=0):
  rng = np.random.RandomState(seed)
  out = []
  for i in range(count):
    words = _WORDS[list(_WORDS)[i % len(_WORDS)]]
    picked = [words[j] for j in rng.randint(0, len(words), rng.randint(3, 10))]
    out.append(("" if words is _WORDS["zh"] else " ").join(picked) + rng.choice([".", "!", "?", ""]))
  return out


def _byte_level_bpe(lines):
  """ModernBERT's layout: byte-level BPE, [CLS] $A [SEP], an extra <|padding|> before its [PAD]."""
  t = Tokenizer(models.BPE())
  t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  t.decoder = decoders.ByteLevel()
  t.train_from_iterator(lines, trainers.BpeTrainer(
      vocab_size=420, special_tokens=["|||IP_ADDRESS|||", "<|padding|>", "[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"],
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  return t, dict(cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]", mask_token="[MASK]", unk_token="[UNK]")


def _unigram(lines):
  """XLM-R-like: NFKC, Metaspace, Unigram; <s> $A </s>."""
  t = Tokenizer(models.Unigram())
  t.normalizer = normalizers.NFKC()
  t.pre_tokenizer = pre_tokenizers.Metaspace()
  t.decoder = decoders.Metaspace()
  t.train_from_iterator(lines, trainers.UnigramTrainer(
      vocab_size=300, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"], unk_token="<unk>"))
  return t, dict(bos_token="<s>", eos_token="</s>", cls_token="<s>", sep_token="</s>", pad_token="<pad>",
                 mask_token="<mask>", unk_token="<unk>")


def _wordpiece(lines):
  t = Tokenizer(models.WordPiece(unk_token="[UNK]"))
  t.normalizer = normalizers.BertNormalizer(lowercase=True)
  t.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  t.decoder = decoders.WordPiece()
  t.train_from_iterator(lines, trainers.WordPieceTrainer(
      vocab_size=300, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]))
  return t, dict(cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]", mask_token="[MASK]", unk_token="[UNK]")


KINDS = {"byte_level_bpe": _byte_level_bpe, "unigram": _unigram, "wordpiece": _wordpiece}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
  """{kind: a folder with tokenizer.json + tokenizer_config.json}, as PreTrainedTokenizerFast saves them."""
  lines, out = _lines(), {}
  for kind, train in KINDS.items():
    tokenizer, special = train(lines)
    cls, sep = special["cls_token"], special["sep_token"]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} $B:1 {sep}:1",
        special_tokens=[(t, tokenizer.token_to_id(t)) for t in (cls, sep)])
    out[kind] = tmp_path_factory.mktemp(kind)
    transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, **special).save_pretrained(out[kind])
  return out


@pytest.mark.parametrize("kind", KINDS)
def test_ids_and_special_tokens_are_transformers(folders, kind):
  """encode(text): AutoTokenizer's ids without special tokens on held-out lines in five scripts; the roles
  are its cls/sep/pad/mask/unk tokens, and [CLS] a [SEP] b [SEP] its pair encoding."""
  theirs = transformers.AutoTokenizer.from_pretrained(folders[kind])
  for source in (folders[kind], folders[kind] / "tokenizer.json"):
    ours = bert_jax.load_tokenizer(str(source))
    assert ours.kind == "tokenizer_json"
    for line in HELD_OUT:
      assert ours.encode(line) == theirs(line, add_special_tokens=False)["input_ids"], line
    assert ours.vocab_size == len(theirs)
    for role, attribute in (("[CLS]", "cls"), ("[SEP]", "sep"), ("[PAD]", "pad"), ("[MASK]", "mask"), ("[UNK]", "unk")):
      assert ours.special_ids[role] == getattr(theirs, f"{attribute}_token_id"), role
    a, b = ours.encode(HELD_OUT[0]), ours.encode(HELD_OUT[1])
    ids, types = BERT_LAYOUT.wrap(ours.special_ids["[CLS]"], ours.special_ids["[SEP]"], a, b)
    want = theirs(HELD_OUT[0], HELD_OUT[1], return_token_type_ids=True)
    assert ids == want["input_ids"] and types == want["token_type_ids"]
    assert ours.decode(a) == theirs.decode(a, skip_special_tokens=True)
  special = ours.special_mask()
  assert special[[ours.special_ids[r] for r in ("[CLS]", "[SEP]", "[PAD]", "[MASK]", "[UNK]")]].all()
  assert special.sum() == len(theirs.all_special_ids) + (kind == "byte_level_bpe") * 2  # its two extra added ones


def test_roles_without_tokenizer_config_come_from_the_file(folders, tmp_path):
  """A tokenizer.json alone (what a bert_jax workdir keeps): [CLS]/[SEP] from its template, [UNK] from the
  model, [PAD]/[MASK] by name; a role it lacks is None, and asking for it is one DataError naming it."""
  for kind in KINDS:
    alone = tmp_path / kind / "tokenizer.json"
    alone.parent.mkdir()
    shutil.copy(folders[kind] / "tokenizer.json", alone)
    with_config = load_tokenizer(str(folders[kind] / "tokenizer.json"))
    assert dict(load_tokenizer(str(alone)).special_ids) == dict(with_config.special_ids)
  spec = json.loads((folders["unigram"] / "tokenizer.json").read_text())
  spec["added_tokens"] = [a for a in spec["added_tokens"] if a["content"] != "<mask>"]
  spec["model"]["vocab"] = [v if v[0] != "<mask>" else ["<notmask>", v[1]] for v in spec["model"]["vocab"]]
  (tmp_path / "nomask.json").write_text(json.dumps(spec))
  ours = load_tokenizer(str(tmp_path / "nomask.json"))
  assert ours.special_ids.get("[MASK]") is None and ours.special_ids["[CLS]"] is not None
  with pytest.raises(DataError, match=r"has no \[MASK\] token \(mask_token\)"):
    ours.special_ids["[MASK]"]  # pylint: disable=pointless-statement
  (tmp_path / "broken.json").write_text('{"model": {"type": "Nope"}}')
  with pytest.raises(DataError, match="cannot load tokenizer"):
    load_tokenizer(str(tmp_path / "broken.json"))


def test_a_tokenizer_class_that_rebuilds_the_file_is_read_as_it_reads_it(folders, tmp_path):
  """tokenizer_config.json naming XLMRobertaTokenizer: transformers rebuilds the pipeline (no NFKC, its own
  white-space split), so the folder loads as kind xlmr_spm and gives those ids, where the file's own differ."""
  folder = tmp_path / "xlmr"
  shutil.copytree(folders["unigram"], folder)
  settings = json.loads((folder / "tokenizer_config.json").read_text())
  (folder / "tokenizer_config.json").write_text(json.dumps({**settings, "tokenizer_class": "XLMRobertaTokenizer"}))
  theirs = transformers.AutoTokenizer.from_pretrained(folder)
  _modernbert_folder(folder, tmp_path / "mb")
  as_written = load_tokenizer(str(folder / "tokenizer.json"))
  for source in (folder, folder / "tokenizer.json", tmp_path / "mb"):
    ours = bert_jax.load_tokenizer(str(source))
    assert ours.kind == "xlmr_spm"
    assert [ours.encode(line) for line in HELD_OUT] == [theirs(line, add_special_tokens=False)["input_ids"]
                                                        for line in HELD_OUT]
  assert [as_written.encode(line) for line in HELD_OUT] != [ours.encode(line) for line in HELD_OUT]


def test_tokens_tokenizer_config_names_are_added_as_transformers_adds_them(folders, tmp_path):
  """A token tokenizer_config.json names and the file lacks (an extra special token, a mask token that is a
  plain piece there) is matched whole in raw text with transformers' id, also from a converted checkpoint
  and in its export."""
  folder = tmp_path / "extra"
  shutil.copytree(folders["wordpiece"], folder)
  settings = json.loads((folder / "tokenizer_config.json").read_text())
  (folder / "tokenizer_config.json").write_text(json.dumps(
      {**settings, "mask_token": "hund", "extra_special_tokens": ["<lang_de>", "[SEP]"]}))
  theirs = transformers.AutoTokenizer.from_pretrained(folder)
  ours = bert_jax.load_tokenizer(str(folder))
  line = "<lang_de> der Hund und hunde [SEP] <lang_de>"
  assert ours.encode(line) == theirs(line, add_special_tokens=False)["input_ids"]
  assert ours.special_ids["[MASK]"] == theirs.mask_token_id and ours.vocab_size == len(theirs)
  assert ours.encode("<lang_de>") == [len(theirs) - 1] and ours.special_mask()[len(theirs) - 1]
  # through a bert_jax checkpoint (which keeps the tokenizer_config.json) and back to a Hugging Face folder
  _modernbert_folder(folders["wordpiece"], tmp_path / "mb")
  for name in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(folder / name, tmp_path / "mb" / name)
  assert cli.main(["convert", "--from", "hf", str(tmp_path / "mb"), str(tmp_path / "native")]) == 0
  assert cli.main(["convert", "--to", "hf", str(tmp_path / "native"), str(tmp_path / "back")]) == 0
  assert bert_jax.load_tokenizer(str(tmp_path / "native")).encode(line) == ours.encode(line)
  back = transformers.AutoTokenizer.from_pretrained(tmp_path / "back")
  assert back(line, add_special_tokens=False)["input_ids"] == ours.encode(line) and back.mask_token == "hund"


@pytest.mark.parametrize("processor", ["template", "roberta"])
def test_a_roberta_pair_template_lays_out_rows_as_transformers(folders, tmp_path, processor):
  """A tokenizer.json whose pair template is RoBERTa's (<s> a </s> </s> b </s>, types 0; as a template or
  RobertaProcessing): fine-tuning's rows and SQuAD's answer offsets follow it, truncated longest-first and
  padded to max_len as transformers' tokenizer(a, b) does; BERT's template keeps BERT's layout."""
  from bert_jax.finetune import features  # pylint: disable=import-outside-toplevel
  spec = json.loads((folders["unigram"] / "tokenizer.json").read_text())
  ids = {a["content"]: a["id"] for a in spec["added_tokens"]}
  spec["post_processor"] = ({"type": "RobertaProcessing", "sep": ["</s>", ids["</s>"]], "cls": ["<s>", ids["<s>"]],
                             "trim_offsets": True, "add_prefix_space": False} if processor == "roberta" else
                            json.loads(processors.TemplateProcessing(
                                single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
                                special_tokens=[("<s>", ids["<s>"]), ("</s>", ids["</s>"])]).__getstate__()))
  folder = tmp_path / "roberta"
  shutil.copytree(folders["unigram"], folder)
  (folder / "tokenizer.json").write_text(json.dumps(spec))
  theirs = transformers.AutoTokenizer.from_pretrained(folder)
  ours = bert_jax.load_tokenizer(str(folder))
  assert ours.layout.pair_specials == 4 and bert_jax.load_tokenizer(str(folders["unigram"])).layout == BERT_LAYOUT
  for a, b in zip(HELD_OUT, HELD_OUT[1:]):
    for max_len in (64, 12):
      row = features.encode_pair(ours, ours.encode(a), ours.encode(b), max_len)
      want = theirs(a, b, truncation="longest_first", max_length=max_len, padding="max_length",
                    return_token_type_ids=True)
      assert list(row["input_ids"]) == want["input_ids"] and list(row["attention_mask"]) == want["attention_mask"]
      assert list(row["token_type_ids"]) == want["token_type_ids"]
  query, context = ours.encode(HELD_OUT[0]), ours.encode(HELD_OUT[1])
  row_ids, _ = ours.layout.wrap(ours.special_ids["[CLS]"], ours.special_ids["[SEP]"], query, context)
  assert row_ids[len(query) + ours.layout.pair_specials - 1:][:len(context)] == context


def test_continuation_pieces_by_kind(folders):
  """Whole-word masking's table: WordPiece's ##x, Metaspace's pieces without ▁, byte-level pieces without Ġ."""
  for kind, starts in (("wordpiece", None), ("unigram", "\u2581"), ("byte_level_bpe", "\u0120")):
    ours = load_tokenizer(str(folders[kind] / "tokenizer.json"))
    joins = ours.continuation_mask()
    for i, token in enumerate(ours.vocab):
      if ours.special_mask()[i]:
        assert not joins[i]
      else:
        assert joins[i] == (token.startswith("##") if starts is None else not token.startswith(starts)), token


def _modernbert_folder(tokenizer_folder, path, seed=0):
  """A released-style ModernBERT folder: a tiny random ModernBertForMaskedLM beside the tokenizer's files."""
  tok = transformers.AutoTokenizer.from_pretrained(tokenizer_folder)
  torch.manual_seed(seed)
  config = transformers.ModernBertConfig(
      vocab_size=len(tok), hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
      local_attention=8, global_attn_every_n_layers=2, max_position_embeddings=128, pad_token_id=tok.pad_token_id,
      cls_token_id=tok.cls_token_id, sep_token_id=tok.sep_token_id, bos_token_id=tok.cls_token_id,
      eos_token_id=tok.sep_token_id, attn_implementation="eager")
  model = transformers.ModernBertForMaskedLM(config).eval()
  with torch.no_grad():
    for p in model.parameters():
      p.add_(0.05 * torch.randn_like(p))
  model.save_pretrained(path)
  tok.save_pretrained(path)
  return model, tok


@pytest.mark.parametrize("kind", ["byte_level_bpe", "unigram"])
def test_a_modernbert_folder_loads_with_its_tokenizer(folders, tmp_path, kind):
  """load_tokenizer(folder) and load_pretrained(folder) of a ModernBERT folder whose tokenizer is a
  tokenizer.json alone: transformers' ids and logits (within 1e-4) on held-out lines."""
  reference, theirs = _modernbert_folder(folders[kind], tmp_path / "mb")
  tokenizer = bert_jax.load_tokenizer(str(tmp_path / "mb"))
  model, params = bert_jax.load_pretrained(str(tmp_path / "mb"))
  assert isinstance(model, ModernBertModel)
  batch = theirs(HELD_OUT[:4], padding=True, return_tensors="np")
  for row, line in zip(batch["input_ids"], HELD_OUT):
    ids = [tokenizer.special_ids["[CLS]"], *tokenizer.encode(line), tokenizer.special_ids["[SEP]"]]
    assert list(row[:len(ids)]) == ids and set(row[len(ids):]) <= {tokenizer.special_ids["[PAD]"]}
  with torch.no_grad():
    want = reference(input_ids=torch.tensor(batch["input_ids"]),
                     attention_mask=torch.tensor(batch["attention_mask"])).logits.numpy()
  got = jax.jit(model.apply)({"params": params}, jnp.asarray(batch["input_ids"]), jnp.asarray(batch["attention_mask"]))
  real = batch["attention_mask"] > 0
  np.testing.assert_allclose(np.asarray(got.mlm_logits)[real], want[real], atol=1e-4, rtol=0)


def test_convert_round_trip_and_finetune_tokenizer(folders, tmp_path, capsys):
  """convert --from hf keeps tokenizer.json beside the params; convert --to hf writes it back with the
  roles in tokenizer_config.json (transformers' ids and special tokens); fine-tuning's tokenizer is the
  folder's."""
  _modernbert_folder(folders["byte_level_bpe"], tmp_path / "mb")
  assert cli.main(["convert", "--from", "hf", str(tmp_path / "mb"), str(tmp_path / "native")]) == 0
  assert "tokenizer included" in capsys.readouterr().out
  assert cli.main(["convert", "--to", "hf", str(tmp_path / "native"), str(tmp_path / "back")]) == 0
  assert (tmp_path / "native" / "tokenizer.json").exists() and (tmp_path / "back" / "tokenizer.json").exists()
  settings = json.loads((tmp_path / "back" / "tokenizer_config.json").read_text())
  assert settings["tokenizer_class"] == "PreTrainedTokenizerFast" and settings["mask_token"] == "[MASK]"
  want = transformers.AutoTokenizer.from_pretrained(tmp_path / "mb")
  back = transformers.AutoTokenizer.from_pretrained(tmp_path / "back")
  native = bert_jax.load_tokenizer(str(tmp_path / "native"))
  assert native.kind == "tokenizer_json" and dict(native.special_ids) == dict(
      bert_jax.load_tokenizer(str(tmp_path / "mb")).special_ids)
  for line in HELD_OUT:
    assert back(line)["input_ids"] == want(line)["input_ids"]
    assert native.encode(line) == want(line, add_special_tokens=False)["input_ids"]
  assert (back.cls_token, back.sep_token, back.pad_token, back.mask_token) == ("[CLS]", "[SEP]", "[PAD]", "[MASK]")
  exported = json.loads((tmp_path / "back" / "config.json").read_text())  # not HF's defaults of its own vocabulary
  assert [exported[f"{r}_token_id"] for r in ("cls", "sep", "bos", "eos", "pad")] == [
      want.cls_token_id, want.sep_token_id, want.cls_token_id, want.sep_token_id, want.pad_token_id]
  from bert_jax.config_utils import load_config  # pylint: disable=import-outside-toplevel
  from bert_jax.finetune import init  # pylint: disable=import-outside-toplevel
  config = load_config("configs/glue.py:embedded", [f"--config.init_from={tmp_path / 'mb'}"])
  assert init.load_tokenizer(config).encode(HELD_OUT[4]) == want(HELD_OUT[4], add_special_tokens=False)["input_ids"]


def test_data_prepare_and_pretraining_read_a_tokenizer_json(folders, tmp_path):
  """`data prepare --vocab tokenizer.json` writes its ids; pretraining with data.tokenizer=tokenizer_json
  reads the same file (its [MASK] and special ids for masking); a mismatched pair is one DataError."""
  vocab = str(folders["unigram"] / "tokenizer.json")
  (tmp_path / "corpus.txt").write_text("\n".join(HELD_OUT[:3]) + "\n\n" + "\n".join(HELD_OUT[3:5]) + "\n")
  assert cli.main(["data", "prepare", "--corpus", str(tmp_path / "corpus.txt"), "--output", str(tmp_path / "out"),
                   "--vocab", vocab, "--workers", "1"]) == 0
  records = [tf.train.Example.FromString(r.numpy()) for p in sorted(glob.glob(str(tmp_path / "out" / "*.tfrecord")))
             for r in tf.data.TFRecordDataset(p)]
  ours = load_tokenizer(vocab)
  got = [list(r.features.feature["ids"].int64_list.value) for r in records]
  assert got == [[i for line in HELD_OUT[:3] for i in ours.encode(line)],
                 [i for line in HELD_OUT[3:5] for i in ours.encode(line)]]
  from bert_jax.config_utils import load_config  # pylint: disable=import-outside-toplevel
  config = load_config("configs/bert.py:demo",
                       [f"--config.data.vocab={vocab}", "--config.data.tokenizer=tokenizer_json"])
  tokenizer = shards.make_tokenizer(config.data)
  masking = shards.masking_config(config.data, tokenizer)
  assert tokenizer.kind == "tokenizer_json" and masking.mask_id == ours.special_ids["[MASK]"]
  config = load_config("configs/bert.py:demo", [f"--config.data.vocab={vocab}"])
  with pytest.raises(DataError, match="data.tokenizer=tokenizer_json"):
    shards.make_tokenizer(config.data)
  assert hf_tokenizer.KIND == "tokenizer_json" and prepare.vocab_fingerprint(vocab)


def test_continued_pretraining_from_a_tokenizer_json_folder(folders, tmp_path):
  """configs/continue.py from a ModernBERT folder with a Unigram tokenizer.json: the run reads its corpus with
  the folder's tokenizer (rows [CLS] ids [SEP] of the file's roles, masks by its [MASK]) and its model scores
  those masked rows as transformers' ModernBertForMaskedLM does (the step-0 evaluation's loss, within 1e-4)."""
  from bert_jax import pretrained  # pylint: disable=import-outside-toplevel
  from bert_jax.config_utils import load_config  # pylint: disable=import-outside-toplevel
  from bert_jax.training import trainer  # pylint: disable=import-outside-toplevel
  reference, _ = _modernbert_folder(folders["unigram"], tmp_path / "mb")
  lines = _lines(60, seed=1)
  (tmp_path / "corpus.txt").write_text("\n\n".join("\n".join(lines[i:i + 3]) for i in range(0, 60, 3)) + "\n")
  config = load_config("configs/continue.py:tiny", [
      f"--config.init_from={tmp_path / 'mb'}", f"--config.data.corpus={tmp_path / 'corpus.txt'}",
      f"--config.data.eval_corpus={tmp_path / 'corpus.txt'}", "--config.data.num_shards=1",
      "--config.data.max_seq_length=48", "--config.train.eval_batch_size=4"])
  resolved = pretrained.with_init_from_model(pretrained.native_init_from(config, tmp_path / "run"))
  assert resolved.data.tokenizer == "tokenizer_json" and resolved.model.family == "modernbert"
  ours = bert_jax.load_tokenizer(str(tmp_path / "mb"))
  batch = next(trainer.make_inputs(resolved, "eval", 4))
  ids, real = np.asarray(batch["input_ids"]), np.asarray(batch["input_mask"]) > 0
  restored = ids.copy()
  np.put_along_axis(restored, np.asarray(batch["masked_lm_positions"]),
                    np.where(batch["masked_lm_weights"] > 0, batch["masked_lm_ids"],
                             np.take_along_axis(ids, np.asarray(batch["masked_lm_positions"]), 1)), 1)
  corpus_ids = {i for line in lines for i in ours.encode(line)}
  assert restored[:, 0].tolist() == [ours.special_ids["[CLS]"]] * 4
  assert set(restored[real].tolist()) <= corpus_ids | {ours.special_ids["[CLS]"], ours.special_ids["[SEP]"]}
  assert (ids[real] == ours.special_ids["[MASK]"]).any()
  model, params = bert_jax.load_pretrained(str(tmp_path / "run" / "init_from"))
  got = np.asarray(model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(batch["input_mask"])).mlm_logits)
  with torch.no_grad():
    want = reference(input_ids=torch.tensor(ids), attention_mask=torch.tensor(batch["input_mask"])).logits.numpy()
  np.testing.assert_allclose(got[real], want[real], atol=1e-4, rtol=0)


@slow  # a fine-tuning run, predict, an export and embed: about a minute on two cores
def test_finetune_predict_embed_and_export_from_a_tokenizer_json_folder(folders, tmp_path, capsys):
  """A ModernBERT folder with a Unigram tokenizer.json fine-tunes through the CLI (its rows [CLS] ids [SEP]
  by the file's roles), predict reads the workdir's copy, the export's tokenizer is transformers' own, and
  Embedder reads the folder's."""
  _modernbert_folder(folders["unigram"], tmp_path / "mb")
  ft, hf_dir = str(tmp_path / "ft"), str(tmp_path / "hf")
  assert cli.main(["finetune", "--config", "configs/glue.py:embedded", "--workdir", ft,
                   f"--config.init_from={tmp_path / 'mb'}", "--config.data.max_seq_length=32",
                   "--config.data.train_limit=32", "--config.data.eval_limit=16", "--config.train.batch_size=16",
                   "--config.train.eval_batch_size=16", "--config.train.epochs=1"]) == 0
  saved = json.loads((tmp_path / "ft" / "config.json").read_text())
  assert saved["data"]["tokenizer"] == "tokenizer_json" and (tmp_path / "ft" / "tokenizer.json").exists()
  (tmp_path / "in.txt").write_text("".join(s + "\n" for s in HELD_OUT[:3]))
  assert cli.main(["predict", "--model", ft, "--input", str(tmp_path / "in.txt"),
                   "--output", str(tmp_path / "out.jsonl")]) == 0
  records = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
  embedder = bert_jax.Embedder.load(str(tmp_path / "mb"), batch_size=2, buckets=(128,))
  assert embedder.tokenizer.kind == "tokenizer_json" and embedder(HELD_OUT[:2]).shape == (2, 32)
  assert cli.main(["convert", "--to", "hf", ft, hf_dir]) == 0
  capsys.readouterr()
  theirs = transformers.AutoModelForSequenceClassification.from_pretrained(hf_dir, attn_implementation="eager").eval()
  tokenizer = transformers.AutoTokenizer.from_pretrained(hf_dir)
  for line, record in zip(HELD_OUT, records):
    with torch.no_grad():
      logits = theirs(**tokenizer(line, return_tensors="pt")).logits[0].numpy()
    probabilities = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    np.testing.assert_allclose(sorted(record["scores"].values()), sorted(probabilities), atol=1e-5)
