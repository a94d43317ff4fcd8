"""The peers' own tokenizer tests as data, and their tokenizers re-implemented here as references.

- google-research/bert `tokenization_test.py`: its cases, and its FullTokenizer (re-implemented below,
  string by string as the original) on real and tricky text, with its word limit of 200 characters;
  HF's limit of 100 against transformers' BertTokenizerFast.
- google-research/albert `tokenization.py`: `preprocess_text` and `encode_pieces` (re-implemented
  below) on a SentencePiece model trained with ALBERT's own spm_train flags (`<pad>`/`<unk>`).
- Character spans of words holding characters the basic tokenizer deletes.
"""
import io
import json
import random
import unicodedata

import numpy as np
import pytest

import data_fixtures
from bert_jax import pretrained
from bert_jax.data_pipelines import tokenizers as T
from bert_jax.data_pipelines import vocab as vocab_lib

# --- google-research/bert, re-implemented as the reference ------------------------------------------


def _g_whitespace(c):
  return c in " \t\n\r" or unicodedata.category(c) == "Zs"


def _g_control(c):
  return c not in "\t\n\r" and unicodedata.category(c) in ("Cc", "Cf")


def _g_punctuation(c):
  cp = ord(c)
  return 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126 or \
      unicodedata.category(c).startswith("P")


def _g_chinese(cp):
  return any(lo <= cp <= hi for lo, hi in [(0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF),
                                           (0x2A700, 0x2B73F), (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF),
                                           (0xF900, 0xFAFF), (0x2F800, 0x2FA1F)])


def google_basic(text, lower_case):
  text = "".join(" " if _g_whitespace(c) else c for c in text
                 if not (ord(c) == 0 or ord(c) == 0xFFFD or _g_control(c)))
  text = "".join(f" {c} " if _g_chinese(ord(c)) else c for c in text)
  split = []
  for token in text.strip().split():
    if lower_case:
      token = "".join(c for c in unicodedata.normalize("NFD", token.lower()) if unicodedata.category(c) != "Mn")
    words, new_word = [], True
    for c in token:
      if _g_punctuation(c):
        words.append([c])
        new_word = True
      else:
        if new_word:
          words.append([])
        new_word = False
        words[-1].append(c)
    split.extend("".join(w) for w in words)
  return " ".join(split).strip().split()


def google_wordpiece(word, vocab, max_chars=200):
  if len(word) > max_chars:
    return ["[UNK]"]
  pieces, start = [], 0
  while start < len(word):
    end, current = len(word), None
    while start < end:
      sub = ("##" if start > 0 else "") + word[start:end]
      if sub in vocab:
        current = sub
        break
      end -= 1
    if current is None:
      return ["[UNK]"]
    pieces.append(current)
    start = end
  return pieces


def google_ids(text, vocab, lower_case):
  return [vocab[p] for w in google_basic(text, lower_case) for p in google_wordpiece(w, vocab)]


# The cases of google-research/bert tokenization_test.py (albert's copy has the same). bert_jax needs
# [PAD] and [MASK]: they go last, so the cases' ids hold.
GOOGLE_VOCAB = ["[UNK]", "[CLS]", "[SEP]", "want", "##want", "##ed", "wa", "un", "runn", "##ing", ",",
                "[PAD]", "[MASK]"]

# Deleted characters (NUL, DEL, U+FFFD, soft hyphen, zero-width space and joiners, BOM), separators
# str.split knows (U+2028), word-final and inner sigma, dotted I, lone combining marks, CJK, long words.
TRICKY = [
    "A zero\u200bwidth space here.", "soft\u00adhyphen and zw\u200djoin and zw\u200cnon-join",
    "nul\x00byte del\x7fchar bom\ufeffmark bad\ufffdchar bell\x07", "line\u2028separator para\u2029graph",
    "ΟΔΟΣ. ΑΣ.Β ΣΑΣ, σοφός ΣΟΦΟΣ!", "İstanbul İİ \u0301lone \u0301\u0302 marks", "a\u0308\u0323b Å ﬁ ＡＢ",
    "日本語のテキスト 北京大学 \U00020000x", "x" * 100 + " " + "x" * 101 + " " + "x" * 150 + ".",
    "ab" * 100 + " " + "ab" * 100 + "a " + "Café" * 40 + " end", "\u200b\u200b \u00ad \x00",
    " \t Tabs\tand\u00a0non-breaking\u2003spaces \u3000 ", "",
]


@pytest.fixture(scope="module")
def google_vocab(tmp_path_factory):
  path = tmp_path_factory.mktemp("google") / "vocab.txt"
  path.write_text("".join(t + "\n" for t in GOOGLE_VOCAB))
  return str(path)


def test_google_tokenization_test_cases(google_vocab):
  tok = T.load_tokenizer(google_vocab)
  assert tok.encode("UNwant\u00E9d,running") == [7, 4, 5, 10, 8, 9]
  assert tok.encode("") == []
  assert tok.decode_tokens(tok.encode("unwanted running")) == ["un", "##want", "##ed", "runn", "##ing"]
  assert tok.decode_tokens(tok.encode("unwantedX running")) == ["[UNK]", "runn", "##ing"]
  for tokenize in (T.basic_tokenize, lambda text, lower: [w for w, _, _ in T.basic_tokenize_spans(text, lower)]):
    assert tokenize("ah\u535A\u63A8zz", True) == ["ah", "\u535A", "\u63A8", "zz"]
    assert tokenize(" \tHeLLo!how  \n Are yoU?  ", True) == ["hello", "!", "how", "are", "you", "?"]
    assert tokenize("H\u00E9llo", True) == ["hello"]
    assert tokenize(" \tHeLLo!how  \n Are yoU?  ", False) == ["HeLLo", "!", "how", "Are", "yoU", "?"]
  assert all(T._is_whitespace(c) for c in " \t\r\n\u00A0") and not any(T._is_whitespace(c) for c in "A-")
  assert T._is_control("\u0005") and not any(T._is_control(c) for c in ["A", " ", "\t", "\r", "\U0001F4A9"])
  assert all(T._is_punctuation(c) for c in "-$`.") and not any(T._is_punctuation(c) for c in "A ")


def test_word_limit_is_googles_200_and_hfs_100_on_request(tmp_path):
  path = tmp_path / "vocab.txt"
  path.write_text("".join(t + "\n" for t in ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "xx", "##xx", "##x"]))
  google = T.load_tokenizer(str(path))
  pieces = google.decode_tokens(google.encode("x" * 101))
  assert pieces == ["xx"] + ["##xx"] * 49 + ["##x"]  # the issue's case: 51 pieces, as google-research/bert
  assert len(google.encode("x" * 200)) == 100 and google.encode("x" * 201) == [1]
  hf = T.load_tokenizer(str(path), max_chars_per_word=T.HF_MAX_CHARS_PER_WORD)
  assert hf.encode("x" * 101) == [1] and len(hf.encode("x" * 100)) == 50


@pytest.mark.parametrize("lower_case", [True, False])
def test_wordpiece_equals_google_full_tokenizer(lower_case):
  path = data_fixtures.embedded_paths()[1]
  vocab = {t: i for i, t in enumerate(open(path, encoding="utf-8").read().splitlines())}
  tok = T.load_tokenizer(path, lower_case)
  lines = list(data_fixtures.real_sentences(800)) + data_fixtures.UNICODE_LINES + TRICKY
  mismatches = [(l, tok.encode(l), google_ids(l, vocab, lower_case)) for l in lines
                if tok.encode(l) != google_ids(l, vocab, lower_case)]
  assert not mismatches, mismatches[:2]
  assert len(tok.encode(TRICKY[8])) > 100  # words of 101 and 150 characters are pieces, not [UNK]


def test_hf_limit_equals_transformers_bert_tokenizer():
  from transformers import BertTokenizer  # transformers 5: the tokenizers-backed (fast) one
  path = data_fixtures.embedded_paths()[1]
  tok = T.load_tokenizer(path, max_chars_per_word=T.HF_MAX_CHARS_PER_WORD)
  reference = BertTokenizer(vocab=path, do_lower_case=True)
  lines = TRICKY[8:10] + ["x" * n for n in (99, 100, 101, 199, 200, 201)]
  expected = [reference(l, add_special_tokens=False)["input_ids"] for l in lines]
  assert [tok.encode(l) for l in lines] == expected
  assert len(expected[3]) > 90 and expected[4] == [tok.special_ids["[UNK]"]]  # 100 characters: pieces; 101: [UNK]


@pytest.mark.parametrize("limit", [T.GOOGLE_MAX_CHARS_PER_WORD, T.HF_MAX_CHARS_PER_WORD])
def test_tf_wordpiece_keeps_the_word_limit(limit):
  tok = T.load_tokenizer(data_fixtures.embedded_paths()[1], max_chars_per_word=limit)
  lines = [TRICKY[8], TRICKY[9].encode("ascii", "ignore").decode(), "x" * 200 + " y " + "x" * 201, "short line."]
  assert [list(r) for r in tok.tokenize_tf(lines).numpy()] == [tok.encode(l) for l in lines]


# --- spans --------------------------------------------------------------------------------------------

def test_issue_example_span():
  assert T.basic_tokenize_spans("A zero\u200bwidth space here.", True)[1] == ("zerowidth", 2, 12)


@pytest.mark.parametrize("lower_case", [True, False])
def test_spans_are_non_empty_and_give_back_their_words(lower_case):
  alphabet = ["a", "B", "É", "Σ", "σ", "ß", ".", "-", " ", "\u200b", "\u200d", "\u00ad", "\x00", "\x7f",
              "\ufeff", "\ufffd", "北", "\u0301", "\u2028", "İ", "1", "\t"]
  rng = random.Random(0)
  texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 24))) for _ in range(2000)]
  for text in texts + TRICKY + data_fixtures.UNICODE_LINES:
    spans = T.basic_tokenize_spans(text, lower_case)
    assert [w for w, _, _ in spans] == google_basic(text, lower_case), text
    ends = [0] + [e for _, _, e in spans]
    for (word, start, end), previous_end in zip(spans, ends):
      assert previous_end <= start < end <= len(text), (text, word)
      # the span alone tokenizes back to the word (up to the final sigma, which depends on what follows)
      assert "".join(google_basic(text[start:end], lower_case)).replace("ς", "σ") == word.replace("ς", "σ")


# --- google-research/albert ---------------------------------------------------------------------------

def albert_preprocess_text(inputs, lower=False):
  outputs = " ".join(inputs.strip().split())
  outputs = unicodedata.normalize("NFKD", outputs)
  outputs = "".join(c for c in outputs if not unicodedata.combining(c))
  return outputs.lower() if lower else outputs


def albert_encode_ids(sp, text):
  new_pieces = []
  for piece in sp.EncodeAsPieces(text):
    if len(piece) > 1 and piece[-1] == "," and piece[-2].isdigit():
      cur = sp.EncodeAsPieces(piece[:-1].replace("\u2581", ""))
      if piece[0] != "\u2581" and cur[0][0] == "\u2581":
        cur = cur[1:] if len(cur[0]) == 1 else [cur[0][1:]] + cur[1:]
      new_pieces.extend(cur + [piece[-1]])
    else:
      new_pieces.append(piece)
  return [sp.PieceToId(p) for p in new_pieces]


def _numbers(n):
  rng = random.Random(0)
  return [f"In {rng.randint(1800, 2020)}, about {rng.randint(1, 999)},{rng.randint(100, 999)} people paid "
          f"${rng.randint(1, 99)},{rng.randint(100, 999)}, or {rng.randint(2, 9)}, {rng.randint(10, 99)},x."
          for _ in range(n)]


@pytest.fixture(scope="module")
def albert_model(tmp_path_factory):
  """A model trained with ALBERT's spm_train flags (README): <pad>=0, <unk>=1, control symbols
  [CLS] [SEP] [MASK], its user-defined symbols; numbers may end pieces, so "1990," pieces exist."""
  import sentencepiece as spm
  text = [albert_preprocess_text(l, lower=True) for l in data_fixtures.real_sentences(3000)] + _numbers(600)
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(text), model_writer=model, vocab_size=1500, model_type="unigram", pad_id=0,
      unk_id=1, bos_id=-1, eos_id=-1, control_symbols=["[CLS]", "[SEP]", "[MASK]"],
      user_defined_symbols=["(", ")", '"', "-", ".", "–", "£", "€"], split_by_number=False,
      character_coverage=0.99995, minloglevel=2)
  directory = tmp_path_factory.mktemp("albert")
  (directory / "spiece.model").write_bytes(model.getvalue())
  return directory


def _albert_lines():
  return (list(data_fixtures.real_sentences(3400))[3000:] + data_fixtures.UNICODE_LINES + _numbers(50)[-50:]
          + ["naïve café", "  ``Quoted,'' she   said\tin 1,000, 25,5 ways. ", "Ａ１, ２, ﬁne", "\u00a0x\u2003y"])


def test_albert_layout_special_ids_by_role(albert_model, tmp_path):
  tok = T.load_tokenizer(str(albert_model / "spiece.model"))
  assert tok.vocab[:2] == ["<pad>", "<unk>"]
  assert tok.special_ids == {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4}
  ours = vocab_lib.train_sentencepiece(data_fixtures.real_sentences(1500), 800, str(tmp_path))
  assert T.load_tokenizer(ours).vocab[:2] == ["[PAD]", "[UNK]"]
  assert T.load_tokenizer(ours).special_ids == {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4}
  # a HF ALBERT directory with that model loads (it was refused: "spiece.model lacks [PAD]")
  (albert_model / "config.json").write_text(json.dumps({"model_type": "albert", "architectures": ["AlbertModel"]}))
  (albert_model / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
  assert pretrained.load_tokenizer(str(albert_model)).special_ids["[PAD]"] == 0


def test_albert_ids_equal_google_research_albert(albert_model):
  import sentencepiece as spm
  sp = spm.SentencePieceProcessor(model_file=str(albert_model / "spiece.model"))
  tok = T.load_tokenizer(str(albert_model / "spiece.model"))
  lines = _albert_lines()
  expected = [albert_encode_ids(sp, albert_preprocess_text(l, lower=True)) for l in lines]
  assert [tok.encode(l) for l in lines] == expected
  # the digit-comma re-split and the preprocessing (accents) both mattered on these lines
  assert sum(sp.encode(albert_preprocess_text(l, lower=True)) != e for l, e in zip(lines, expected)) >= 30
  assert sum(albert_encode_ids(sp, l.lower()) != e for l, e in zip(lines, expected)) >= 3
  assert tok.decode_tokens(tok.encode("naïve café")) == tok.decode_tokens(tok.encode("naive cafe"))


def test_albert_quotes_and_casing_options(albert_model):
  import sentencepiece as spm
  path = str(albert_model / "spiece.model")
  sp = spm.SentencePieceProcessor(model_file=path)
  hf_style = T.load_tokenizer(path, quotes_to_double=True)
  text = "``Quoted,'' she said."
  assert hf_style.encode(text) == albert_encode_ids(sp, albert_preprocess_text('"Quoted," she said.', lower=True))
  assert hf_style.encode(text) != T.load_tokenizer(path).encode(text)
  cased = T.load_tokenizer(path, lower_case=False)  # no lower-casing: accents and case kept
  assert cased.encode("  Naïve   Café ") == albert_encode_ids(sp, "Naïve Café")


@pytest.mark.parametrize("quotes_to_double", [False, True])
def test_albert_tf_path_equals_python(albert_model, quotes_to_double):
  tok = T.load_tokenizer(str(albert_model / "spiece.model"), quotes_to_double=quotes_to_double)
  lines = _albert_lines()
  assert [list(r) for r in tok.tokenize_tf(lines).numpy()] == [tok.encode(l) for l in lines]
  assert np.any([tok.encode(l) != tok._sp.encode(l.lower()) for l in lines])
