"""SQuAD pre- and post-processing on hand-made examples: spans, windows, answers across windows,
unanswerable questions, n-best decoding and the no-answer threshold."""
import ml_collections
import numpy as np
import pytest

from bert_jax.finetune import squad
from bert_jax.data_pipelines.tokenizers import load_tokenizer

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "broncos", "won", "super", "bowl", "50", ".",
         "who", "?", "in", "santa", "clara", "game", "was", "played", "where", "##s", "team"]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
  path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
  path.write_text("\n".join(WORDS) + "\n")
  return load_tokenizer(str(path), lower_case=True)


def _task(**kw):
  values = dict(version="v1.1", doc_stride=2, max_query_length=4, n_best_size=5, max_answer_length=5,
                null_score_diff_threshold=0.0)
  values.update(kw)
  return ml_collections.ConfigDict(values)


def test_context_tokens_keep_character_spans(tokenizer):
  context = "The Broncos won Super Bowl 50."
  ids, spans = squad.tokenize_context(context, tokenizer)
  assert [WORDS[i] for i in ids] == ["the", "broncos", "won", "super", "bowl", "50", "."]
  assert [context[s:e] for s, e in spans] == ["The", "Broncos", "won", "Super", "Bowl", "50", "."]
  assert squad.answer_tokens(spans, "Super Bowl 50", context.index("Super")) == (3, 5)
  assert squad.answer_tokens(spans, "50", 50) is None


def test_windows_and_max_context():
  assert squad.windows(10, 4, 2) == [(0, 4), (2, 4), (4, 4), (6, 4)]
  assert squad.windows(3, 4, 2) == [(0, 3)]
  # token 3 sits in windows 0 (i=3: min(3, 0)), 1 (i=1: min(1, 2)) and 2 (i=... not there): window 1 wins
  best = squad.max_context([(0, 4), (2, 4)])
  assert best[0].tolist() == [True, True, True, False]
  assert best[1].tolist() == [False, True, True, True]


def test_answer_across_windows_targets_only_windows_holding_it(tokenizer):
  context = "The Broncos won Super Bowl 50 in Santa Clara."
  example = squad.Example("q", "who won?", context, [("Super Bowl 50", context.index("Super"))])
  # query "who won ?" = 3 tokens -> offset 5; 16 - 5 - 1 = 10 context tokens fit; make it 6 per window
  out = squad.featurize([example], tokenizer, _task(doc_stride=3), max_len=12, training=True)
  f, placed = out.features, [(w.start, w.length) for w in out.windows]
  assert placed == [(0, 6), (3, 6), (6, 4)]
  # answer tokens 3..5: whole in windows 0 and 1 only; window 2 points at [CLS]
  assert f["start_positions"].tolist() == [3 + 5, 0 + 5, 0] and f["end_positions"].tolist() == [5 + 5, 2 + 5, 0]
  row = f["input_ids"][1]
  assert [WORDS[i] for i in row[f["start_positions"][1]:f["end_positions"][1] + 1]] == ["super", "bowl", "50"]
  assert f["token_type_ids"][0].tolist() == [0] * 5 + [1] * 7


def test_unanswerable_points_at_cls(tokenizer):
  example = squad.Example("q", "where?", "The game was played in Santa Clara.", [], impossible=True)
  out = squad.featurize([example], tokenizer, _task(version="v2.0"), max_len=32, training=True)
  assert out.features["start_positions"].tolist() == [0] and out.features["end_positions"].tolist() == [0]


def _logits_for(out, row, start, end, cls_score=0.0):
  t = out.features["input_ids"].shape[1]
  s, e = np.full((len(out.windows), t), -10.0), np.full((len(out.windows), t), -10.0)
  s[:, 0] = e[:, 0] = cls_score / 2
  s[row, start], e[row, end] = 5.0, 5.0
  return s, e


def test_decoding_picks_best_span_and_exact_context_text(tokenizer):
  context = "The Broncos won Super Bowl 50 in Santa Clara."
  example = squad.Example("q", "who won?", context, [("Super Bowl 50", context.index("Super"))])
  out = squad.featurize([example], tokenizer, _task(doc_stride=3), max_len=12, training=False)
  # windows (0, 6) and (3, 6); offset 5. "Super Bowl 50" = context tokens 3..5: row 0 positions 8..10.
  s, e = _logits_for(out, 0, 8, 10)
  answers, null_diff = squad.best_answers(s, e, [example], out, _task(doc_stride=3))
  assert answers == {"q": "Super Bowl 50"} and null_diff["q"] == pytest.approx(-10.0)
  # The same span in window 1 starts at its edge; window 0 gives "Super" more context, so no candidate.
  s, e = _logits_for(out, 1, 5, 7)
  assert squad.best_answers(s, e, [example], out, _task())[0] == {"q": ""}
  s, e = _logits_for(out, 1, 9, 10)  # context tokens 7..8; the full stop is token 9, left out
  assert squad.best_answers(s, e, [example], out, _task())[0] == {"q": "Santa Clara"}
  s, e = _logits_for(out, 0, 10, 8)  # end before start is never a candidate
  assert squad.best_answers(s, e, [example], out, _task())[0] == {"q": ""}


def test_no_answer_threshold(tokenizer):
  context = "The Broncos won Super Bowl 50 in Santa Clara."
  example = squad.Example("q", "who won?", context, [], impossible=True)
  out = squad.featurize([example], tokenizer, _task(version="v2.0"), max_len=32, training=False)
  s, e = _logits_for(out, 0, 8, 10, cls_score=12.0)  # null 12 vs best span 10: diff 2
  assert squad.best_answers(s, e, [example], out, _task(version="v2.0"))[0] == {"q": ""}
  assert squad.best_answers(s, e, [example], out, _task(version="v2.0", null_score_diff_threshold=3.0)
                            )[0] == {"q": "Super Bowl 50"}
  assert squad.best_answers(s, e, [example], out, _task(version="v1.1"))[0] == {"q": "Super Bowl 50"}


def test_json_reading(tmp_path):
  data = {"data": [{"title": "t", "paragraphs": [{"context": "The game.", "qas": [
      {"id": "a", "question": "q?", "answers": [{"text": "game", "answer_start": 4}]},
      {"id": "b", "question": "q?", "answers": [], "is_impossible": True}]}]}]}
  path = tmp_path / "dev-v2.0.json"
  path.write_text(__import__("json").dumps(data))
  examples = squad.read_json(str(path))
  assert [(e.qid, e.answers, e.impossible) for e in examples] == [("a", [("game", 4)], False), ("b", [], True)]


@pytest.mark.parametrize("answer", ["zero\u200bwidth", "zw\u200djoin", "zw\u200cnon", "soft\u00adhyphen", "nul\x00byte",
                                    "del\x7fchar", "ΟΔΟΣ", "the ΟΔΟΣ", "Broncos\u200b won"])
def test_answers_on_words_holding_deleted_characters_survive(tokenizer, answer):
  context = f"In 2016 {answer} played."
  ids, spans = squad.tokenize_context(context, tokenizer)
  assert len(ids) == len(spans) and (spans[:, 1] > spans[:, 0]).all()
  start = context.index(answer)
  first, last = squad.answer_tokens(spans, answer, start)
  assert context[spans[first][0]:spans[last][1]] == answer
  # training keeps the example, and the best span decodes to the exact context text
  example = squad.Example("q", "who won?", context, [(answer, start)])
  out = squad.featurize([example], tokenizer, _task(), max_len=40, training=True)
  assert out.features["start_positions"].tolist() == [first + 5] and out.features["end_positions"].tolist() == [last + 5]
  s, e = _logits_for(out, 0, first + 5, last + 5)
  assert squad.best_answers(s, e, [example], out, _task())[0] == {"q": answer}


def test_issue_example_span(tokenizer):
  context = "A zero\u200bwidth space here."
  _, spans = squad.tokenize_context(context, tokenizer)
  zero_width_pieces = spans[1:-3]  # "a", then the pieces of "zerowidth", then "space", "here", "."
  assert len(zero_width_pieces) >= 1 and (zero_width_pieces == [2, 12]).all()
  assert spans[-3].tolist() == [13, 18]
