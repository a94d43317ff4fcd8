"""XLNet through the fine-tuning tasks: its tokenizer (kind xlnet_spm) against transformers' XLNetTokenizer
built from a SentencePiece model trained here (ids, XLNet's a <sep> b <sep> <cls> with token types 0/1/2,
left padding, NER's word pieces), SQuAD's windows in XLNet's layout, and `bert-jax finetune` of a tiny
random XLNet whose exported XLNetFor{Sequence,Token}Classification gives our logits on transformers'
tokenization of the same text (and XLNetForQuestionAnsweringSimple our span logits)."""
import collections
import io
import json
import random

import numpy as np
import pytest
import sentencepiece as spm
import torch
import transformers

import bert_jax
import data_fixtures
from bert_jax import cli
from bert_jax.data_pipelines import fairseq_spm
from bert_jax.data_pipelines import tokenizers as T
from bert_jax.finetune import embedded, glue, ner
from core_helpers import slow

MAX_LEN = 24


def _numbers(n, seed=0):
  rng = random.Random(seed)
  return [f"In {rng.randint(1800, 2020)}, about {rng.randint(1, 999)},{rng.randint(100, 999)} people paid "
          f"${rng.randint(1, 99)},{rng.randint(100, 999)}, or {rng.randint(2, 9)}, {rng.randint(10, 99)},x."
          for _ in range(n)]


@pytest.fixture(scope="module")
def spiece(tmp_path_factory):
  """A cased unigram model in XLNet's id layout (<unk> <s> </s> <cls> <sep> <pad> <mask> <eop> <eod>);
  numbers may end pieces, so "1990,"-like pieces exist (the digit-comma handling has work to do)."""
  text = list(data_fixtures.real_sentences(1500)) + _numbers(300) + ["naïve Café résumé Ångström déjà"] * 20
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(text), model_writer=model, vocab_size=800, model_type="unigram", unk_id=0, bos_id=1,
      eos_id=2, pad_id=5, control_symbols=["<cls>", "<sep>", "<mask>"], user_defined_symbols=["<eop>", "<eod>"],
      split_by_number=False, minloglevel=2)
  directory = tmp_path_factory.mktemp("xlnet_spm")
  (directory / "spiece.model").write_bytes(model.getvalue())
  return directory / "spiece.model"


def _reference(path, lower_case=False):
  """transformers' XLNetTokenizer as its XLNetConverter builds it from the model: the pieces' scores, those
  ending in a digit and a comma 100 lower, and the model's character map (nmt_nfkc)."""
  sp = spm.SentencePieceProcessor(model_file=str(path))
  vocab = [(sp.id_to_piece(i), sp.get_score(i) - (100.0 if T._digit_comma(sp.id_to_piece(i)) else 0.0))  # pylint: disable=protected-access
           for i in range(sp.get_piece_size())]
  charsmap = fairseq_spm.read_model(path.read_bytes())[1]
  assert charsmap
  return transformers.XLNetTokenizer(vocab=vocab, _spm_precompiled_charsmap=charsmap, do_lower_case=lower_case), sp


def _lines():
  return (list(data_fixtures.real_sentences(1700))[1500:] + data_fixtures.UNICODE_LINES + _numbers(60, seed=1)
          + ["naïve Café ``Quoted,'' she   said\tin 1990, 25,5 ways. ", "Ａ１, ２, ﬁne", "\u00a0x\u2003y  ",
             "e\u0301te\u0301 déjà-vu, 3,14"])


def _ours(spiece, reference, source, lower_case=False):
  """Our tokenizer from the spiece.model, or from the tokenizer.json transformers saves (all it saves)."""
  if source == "spiece.model":
    return T.load_tokenizer(str(spiece), lower_case, kind="xlnet_spm")
  folder = spiece.parent / f"saved_{lower_case}"
  reference.save_pretrained(folder)
  assert not (folder / "spiece.model").exists()
  (folder / "config.json").write_text(json.dumps({"model_type": "xlnet", "architectures": ["XLNetModel"]}))
  found = bert_jax.load_tokenizer(str(folder))  # an HF XLNet folder with tokenizer.json alone
  assert found.kind == "xlnet_spm" and found.lower_case == lower_case
  return T.load_tokenizer(str(folder / "tokenizer.json"), not lower_case, kind="xlnet_spm")  # its own casing wins


@pytest.mark.parametrize("source", ["spiece.model", "tokenizer.json"])
def test_ids_equal_transformers_xlnet_tokenizer(spiece, source):
  reference, sp = _reference(spiece)
  tok = _ours(spiece, reference, source)
  assert tok.kind == "xlnet_spm" and not tok.lower_case
  roles = {"[PAD]": "pad", "[UNK]": "unk", "[CLS]": "cls", "[SEP]": "sep", "[MASK]": "mask"}
  assert tok.special_ids == {r: getattr(reference, f"{n}_token_id") for r, n in roles.items()}
  assert tok.special_ids == {"[PAD]": 5, "[UNK]": 0, "[CLS]": 3, "[SEP]": 4, "[MASK]": 6}
  lines = _lines()
  got = [tok.encode(line) for line in lines]
  want = [reference(line, add_special_tokens=False)["input_ids"] for line in lines]
  score = lambda ids: sum(sp.get_score(i) for i in ids)  # noqa: E731
  for line, g, w in zip(lines, got, want):
    if g != w:  # only where two segmentations tie (the same pieces in another order, as "00" "0" / "0" "00")
      assert collections.Counter(g) == collections.Counter(w) and score(g) == pytest.approx(score(w)), line
  assert sum(g != w for g, w in zip(got, want)) <= 2
  # XLNet's preprocessing (accents, quotes) and the digit-comma scores both changed ids on these lines
  assert sum(g != sp.encode(line) for g, line in zip(got, lines)) >= 20
  assert sum(g != sp.encode(T.xlnet_preprocess(line, False)) for g, line in zip(got, lines)) >= 10
  assert tok.decode_tokens(tok.encode("Naïve")) == tok.decode_tokens(tok.encode("Naive"))  # keep_accents=False
  assert tok.encode("``a''") == tok.encode('"a"')
  lower, _ = _reference(spiece, lower_case=True)
  lowered = _ours(spiece, lower, source, lower_case=True)
  assert lowered.lower_case
  assert [lowered.encode(l) for l in lines[:40]] == [lower(l, add_special_tokens=False)["input_ids"]
                                                     for l in lines[:40]]


def test_pairs_and_singles_left_padded_as_transformers(spiece):
  """GLUE rows: a <sep> b <sep> <cls>, token types 0, 1 and 2, padded on the left with attention mask 0,
  the longer text cut; as transformers' XLNetTokenizer(a, b, padding="max_length", truncation=True). (Where
  both texts are cut, the odd token goes to a as in XLNet's _truncate_seq_pair; transformers may give it to b.)"""
  reference, _ = _reference(spiece)
  tok = T.load_tokenizer(str(spiece), False, kind="xlnet_spm")
  sentences = list(data_fixtures.real_sentences(12))
  long = sorted(sentences, key=len)[-2:]
  pairs = [("Naïve ``café'' in 1990, 25,5.", "Short one."), (long[0], "Short, 25."), ("Tiny.", long[1]),
           ("Yes.", "No.")]
  spec = glue.SPECS["mrpc"]
  ours = glue.featurize([(a, b, spec.labels[0]) for a, b in pairs], spec, tok, MAX_LEN)
  theirs = reference([a for a, _ in pairs], [b for _, b in pairs], padding="max_length", truncation="longest_first",
                     max_length=MAX_LEN, return_token_type_ids=True, return_attention_mask=True, return_tensors="np")
  for name in ("input_ids", "token_type_ids", "attention_mask"):
    np.testing.assert_array_equal(ours[name], theirs[name], err_msg=name)
  assert ours["attention_mask"][3, 0] == 0 and ours["input_ids"][3, 0] == 5 and ours["attention_mask"][3, -1]
  assert (ours["input_ids"][:, -1] == 3).all() and (ours["token_type_ids"][:, -1] == 2).all()
  assert ours["attention_mask"][1].all() and ours["attention_mask"][2].all()  # a and b were cut to fit
  singles = embedded.make_rows(sentences[3:9] + ["À bientôt, 1990, x."], seed=0)
  ours = glue.featurize(singles, embedded.SPEC, tok, MAX_LEN)
  theirs = reference([s for s, _, _ in singles], padding="max_length", truncation=True, max_length=MAX_LEN,
                     return_token_type_ids=True, return_tensors="np")
  for name in ("input_ids", "token_type_ids", "attention_mask"):
    np.testing.assert_array_equal(ours[name], theirs[name], err_msg=name)


def test_ner_rows_put_labels_on_each_word_first_piece(spiece):
  """Words tokenized one by one (each with its ▁), then <sep> <cls>, padded on the left: the labels sit
  at each word's first piece, where transformers' word_ids() says the word starts."""
  reference, _ = _reference(spiece)
  tok = T.load_tokenizer(str(spiece), False, kind="xlnet_spm")
  sentences = [(s.split(), [("B-PER" if w[0].isupper() else "O") for w in s.split()])
               for s in data_fixtures.real_sentences(6)]
  sentences.append((["Ångström", "paid", "1990,", "déjà"], ["B-PER", "O", "O", "O"]))
  labels = ("O", "B-PER")
  rows, first_positions = ner.featurize(sentences, labels, tok, MAX_LEN)
  for i, (words, tags) in enumerate(sentences):
    theirs = reference(words, is_split_into_words=True, padding="max_length", truncation=True, max_length=MAX_LEN,
                       return_token_type_ids=True)
    kept = len(first_positions[i])
    if kept < len(words):  # a cut sentence: transformers cuts within a word, bert_jax at word ends
      continue
    for name in ("input_ids", "token_type_ids", "attention_mask"):
      assert list(rows[name][i]) == theirs[name], (name, words)
    word_ids = theirs.word_ids()
    starts = [p for p, w in enumerate(word_ids) if w is not None and (p == 0 or word_ids[p - 1] != w)]
    assert list(first_positions[i]) == starts
    assert list(rows["token_labels"][i][starts]) == [labels.index(t) for t in tags]
    assert rows["label_weights"][i].sum() == len(words)
  assert sum(len(p) == len(w) for p, (w, _) in zip(first_positions, sentences)) >= 4


def test_squad_rows_follow_xlnet_layout(spiece):
  """SQuAD windows for XLNet: context <sep> question <sep> <cls>, types 0/1/2, padded on the left (as
  transformers' SQuAD features for a left-padding tokenizer); "no answer" is the <cls> position, the last;
  an answer's positions cover its text; the decoding reads the null score there."""
  import ml_collections
  from bert_jax.finetune import squad
  tok = T.load_tokenizer(str(spiece), False, kind="xlnet_spm")
  context = "The naïve café opened in 1990, said Ångström, and closed later that year."
  examples = [squad.Example("a", "When did it open?", context, [("1990", context.index("1990"))]),
              squad.Example("b", "Who?", "Nobody knows.", [], impossible=True)]
  task = ml_collections.ConfigDict({"max_query_length": 6, "doc_stride": 4, "n_best_size": 5,
                                    "max_answer_length": 8, "version": "v2.0", "null_score_diff_threshold": 0.0})
  out = squad.featurize(examples, tok, task, MAX_LEN, training=True)
  rows, windows = out.features, out.windows
  assert len(windows) >= 3 and windows[-1].example == 1  # the long context needs several windows
  cls, sep, pad = 3, 4, 5
  for r, w in enumerate(windows):
    query = tok.encode(examples[w.example].question)[:6]
    ids, _ = squad.tokenize_context(examples[w.example].context, tok)
    real = [*ids[w.start:w.start + w.length], sep, *query, sep, cls]
    first = MAX_LEN - len(real)
    assert list(rows["input_ids"][r]) == [pad] * first + real
    assert list(rows["attention_mask"][r]) == [0] * first + [1] * len(real)
    assert list(rows["token_type_ids"][r]) == [0] * (first + w.length + 1) + [1] * (len(query) + 1) + [2]
    assert w.offset == first and w.null == MAX_LEN - 1
    start, end = rows["start_positions"][r], rows["end_positions"][r]
    if start != MAX_LEN - 1:  # the window holds the answer
      spans = out.spans[w.example]
      assert context[spans[w.start + start - w.offset][0]:spans[w.start + end - w.offset][1]] == "1990"
    else:
      assert end == MAX_LEN - 1
  assert sum(rows["start_positions"] != MAX_LEN - 1) >= 1 and sum(rows["start_positions"] == MAX_LEN - 1) >= 2
  # decoding: a window scoring the answer's tokens answers; <cls> scoring highest says "no answer"
  starts = np.zeros((len(windows), MAX_LEN), np.float32)
  ends = np.zeros_like(starts)
  answering = next(r for r, w in enumerate(windows) if rows["start_positions"][r] != MAX_LEN - 1
                   and w.max_context[rows["start_positions"][r] - w.offset])
  starts[answering, rows["start_positions"][answering]] = ends[answering, rows["end_positions"][answering]] = 5.0
  starts[:, -1] = ends[:, -1] = 1.0
  answers, _ = squad.best_answers(starts, ends, examples, out, task)
  assert answers == {"a": "1990", "b": ""}


def _hf_folder(tmp_path, spiece):
  """A tiny random XLNetLMHeadModel (2 layers, d_model 32) over the trained vocabulary, saved with its
  spiece.model; biases drawn large enough to matter."""
  config = transformers.XLNetConfig(vocab_size=800, d_model=32, n_layer=2, n_head=4, d_inner=37, pad_token_id=5)
  torch.manual_seed(0)
  model = transformers.XLNetLMHeadModel(config).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith(("_bias", "seg_embed")):
        p.normal_(0.0, 0.3)
  folder = tmp_path / "hf"
  model.save_pretrained(folder)
  (folder / "spiece.model").write_bytes(spiece.read_bytes())
  (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "XLNetTokenizer",
                                                            "do_lower_case": False, "padding_side": "left"}))
  return folder


FINETUNE = ["--config.data.max_seq_length=32", "--config.train.batch_size=8", "--config.train.epochs=1",
            "--config.train.eval_batch_size=16", "--config.train.tensorboard=false"]


@slow  # ~1-2 min on a loaded 2-core machine: two fine-tuning runs, exports and transformers' models
def test_finetune_predict_and_export_classification_and_ner(tmp_path, spiece):
  """`bert-jax finetune` from the HF XLNet folder (init_from, its spiece.model travelling as xlnet_spm) on
  the embedded task and on CoNLL files: the exported XLNetForSequenceClassification /
  XLNetForTokenClassification, fed by the exported tokenizer.json (transformers' XLNetTokenizer, left
  padding), give the Predictor's logits."""
  folder = _hf_folder(tmp_path, spiece)
  assert bert_jax.load_tokenizer(str(folder)).kind == "xlnet_spm"
  run = tmp_path / "glue"
  assert cli.main(["finetune", "--config", "configs/glue.py:embedded", "--workdir", str(run),
                   f"--config.init_from={folder}", "--config.task.num_train=48", "--config.task.num_dev=16",
                   *FINETUNE]) == 0
  assert json.loads((run / "config.json").read_text())["data"]["tokenizer"] == "xlnet_spm"
  sentences = ["Naïve ``café'' in 1990, said she.", "short", data_fixtures.real_sentences(3)[2]]
  ours = bert_jax.Predictor.load(str(run)).outputs(sentences)["logits"]
  assert cli.main(["convert", "--to", "hf", str(run), str(tmp_path / "glue_hf")]) == 0
  model = transformers.XLNetForSequenceClassification.from_pretrained(tmp_path / "glue_hf").eval()
  tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "glue_hf")
  assert type(tokenizer).__name__ == "XLNetTokenizer" and tokenizer.padding_side == "left"
  batch = tokenizer(sentences, padding=True, truncation=True, max_length=32, return_tensors="pt",
                    return_token_type_ids=True)
  assert batch["attention_mask"][1, 0] == 0  # the short sentence is padded on the left
  with torch.no_grad():
    theirs = model(**batch).logits.numpy()
  np.testing.assert_allclose(ours, theirs, atol=1e-5, rtol=0)
  assert np.abs(theirs).max() > 0.01

  lines = []
  for sentence in data_fixtures.real_sentences(24):
    lines += [f"{w} NN O {'B-PER' if w[0].isupper() else 'O'}" for w in sentence.split()] + [""]
  (tmp_path / "conll").mkdir()
  for name in ("train.txt", "valid.txt"):
    (tmp_path / "conll" / name).write_text("\n".join(lines))
  run = tmp_path / "ner"
  assert cli.main(["finetune", "--config", "configs/ner.py:conll2003", "--workdir", str(run),
                   f"--config.init_from={folder}", f"--config.data.data_dir={tmp_path / 'conll'}", *FINETUNE]) == 0
  words = [["Ångström", "paid", "1990,", "in", "Paris"], "Short one".split()]
  ours = bert_jax.Predictor.load(str(run)).outputs([" ".join(w) for w in words])["logits"]
  assert cli.main(["convert", "--to", "hf", str(run), str(tmp_path / "ner_hf")]) == 0
  model = transformers.XLNetForTokenClassification.from_pretrained(tmp_path / "ner_hf").eval()
  tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "ner_hf")
  batch = tokenizer(words, is_split_into_words=True, padding="max_length", max_length=32, return_tensors="pt",
                    return_token_type_ids=True)
  with torch.no_grad():
    theirs = model(**batch).logits.numpy()
  real = batch["attention_mask"].numpy() > 0
  np.testing.assert_allclose(ours[real], theirs[real], atol=1e-5, rtol=0)
  assert not real[1, 0] and np.abs(theirs).max() > 0.01


def _squad_files(directory, n=16):
  """SQuAD v2.0 JSON: the answer is the context's first word; every fourth question is unanswerable."""
  directory.mkdir()
  paragraphs = []
  for i, sentence in enumerate(data_fixtures.real_sentences(n)):
    qa = {"id": f"q{i}", "question": "which word comes first?", "is_impossible": i % 4 == 3,
          "answers": [] if i % 4 == 3 else [{"text": sentence.split()[0], "answer_start": 0}]}
    paragraphs.append({"context": sentence, "qas": [qa]})
  for split in ("train", "dev"):
    (directory / f"{split}-v2.0.json").write_text(json.dumps({"data": [{"title": "t", "paragraphs": paragraphs}]}))
  return directory


@slow  # ~1 min on a loaded 2-core machine: a fine-tuning run, its export and transformers' model
def test_squad_v2_finetune_predict_and_export(tmp_path, spiece):
  """`bert-jax finetune` of SQuAD v2.0 from the HF XLNet folder: predict answers every question, and the
  exported XLNetForQuestionAnsweringSimple gives our start and end logits on the XLNet-laid-out windows."""
  folder = _hf_folder(tmp_path, spiece)
  run = tmp_path / "squad"
  assert cli.main(["finetune", "--config", "configs/squad.py:v2", "--workdir", str(run), f"--config.init_from={folder}",
                   f"--config.data.data_dir={_squad_files(tmp_path / 'data')}", "--config.task.doc_stride=8",
                   "--config.task.max_query_length=8", *FINETUNE]) == 0
  with open(run / "predictions" / "predictions.dev.json") as f:
    assert set(json.load(f)) == {f"q{i}" for i in range(16)}
  predictor = bert_jax.Predictor.load(str(run))
  questions = [{"id": "x", "question": "which word comes first?", "context": "The cat paid in 1990, they say."},
               {"id": "y", "question": "who?", "context": "Ångström paid."}]
  features, decode = predictor.featurize(predictor.normalize(questions))
  ours = predictor.run(features)
  assert features["attention_mask"][-1, 0] == 0 and (features["input_ids"][:, -1] == 3).all()  # left padding
  assert [record["id"] for record in decode(ours)] == ["x", "y"]
  assert cli.main(["convert", "--to", "hf", str(run), str(tmp_path / "squad_hf")]) == 0
  model = transformers.XLNetForQuestionAnsweringSimple.from_pretrained(tmp_path / "squad_hf").eval()
  with torch.no_grad():
    theirs = model(**{k: torch.tensor(features[k]) for k in ("input_ids", "attention_mask", "token_type_ids")})
  real = features["attention_mask"] > 0
  for name in ("start_logits", "end_logits"):
    np.testing.assert_allclose(ours[name][real], getattr(theirs, name).numpy()[real], atol=1e-5, rtol=0)
  assert np.abs(theirs.start_logits.numpy()[real]).max() > 0.01
