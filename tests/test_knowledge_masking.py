"""Knowledge masking (ERNIE 1.0): the annotators, the units' statistics and labels against hand-built rows, and
names masked whole through `bert-jax data preview` on documents where they recur."""
import argparse

import numpy as np
import pytest

from bert_jax.cli import data as cli
from bert_jax.configs import common
from bert_jax.data_pipelines import knowledge, prepare
from bert_jax.data_pipelines.errors import DataError
from bert_jax.data_pipelines.masking import MaskingConfig, mask_batch, row_keys
from bert_jax.data_pipelines.pipeline import make_pretrain_input
from core_helpers import slow

VOCAB = 1000
CLS, SEP, MASK = 2, 3, 4
SPECIAL = np.arange(VOCAB) < 5
CONTINUATION = np.arange(VOCAB) >= 600  # ids 600.. play "##piece"
E1, P1 = knowledge.first_tag(knowledge.ENTITY), knowledge.first_tag(knowledge.PHRASE)


def _config(weights=(1.0, 1.0, 1.0), rate=0.15, max_predictions=40):
  return MaskingConfig("knowledge", rate, max_predictions, MASK, SPECIAL, CONTINUATION, level_weights=weights)


def _mask(ids, tags, cfg, seed=7):
  ids, tags = np.asarray(ids, np.int32), np.asarray(tags, np.int32)
  lengths = np.full(len(ids), ids.shape[1], np.int32)
  keys = row_keys((seed,), np.zeros(len(ids)), np.arange(len(ids)))
  return {k: v.numpy() for k, v in mask_batch(ids, lengths, keys, cfg, tags).items()}


def _predicted(out, r):
  k = int(out["masked_lm_weights"][r].sum())
  return out["masked_lm_positions"][r, :k], out["masked_lm_ids"][r, :k]


# [CLS] w1 E E E w2 [SEP]: with rate 0.6 the budget is 3 of the 5 tokens: the entity (3 tokens) when it comes
# first, else the two words (the entity no longer fits after one of them).
HAND_IDS = [CLS, 10, 20, 21, 22, 30, SEP]
HAND_TAGS = [0, 0, E1, E1 + 1, E1 + 1, 0, 0]


def test_labels_of_a_hand_built_row():
  n = 600
  out = _mask([HAND_IDS] * n, [HAND_TAGS] * n, _config(rate=0.6, max_predictions=4))
  entity_rows = 0
  for r in range(n):
    positions, labels = _predicted(out, r)
    assert list(positions) in ([2, 3, 4], [1, 5]), positions
    assert list(labels) == [HAND_IDS[p] for p in positions]
    assert list(out["masked_lm_weights"][r]) == [1.0] * len(positions) + [0.0] * (4 - len(positions))
    assert list(out["masked_lm_positions"][r, len(positions):]) == [0] * (4 - len(positions))
    unchanged = [i for i in range(7) if i not in positions]
    assert list(out["input_ids"][r, unchanged]) == [HAND_IDS[i] for i in unchanged]
    if len(positions) == 3:
      entity_rows += 1
      replaced = out["input_ids"][r, 2:5]
      # one 80/10/10 draw for the unit: all [MASK], all kept, or all random (none [MASK])
      assert (replaced == MASK).all() or (MASK not in replaced)
  assert abs(entity_rows / n - 1 / 3) < 0.06  # three units, equal odds: the entity first in a third of rows


@pytest.mark.parametrize("entity_weight, expected", [(2.0, 0.5), (6.0, 0.75)])
def test_level_weights_are_the_odds_of_a_unit(entity_weight, expected):
  """Weighted draw without replacement: the entity comes first with odds w / (w + 1 + 1)."""
  n = 2000
  out = _mask([HAND_IDS] * n, [HAND_TAGS] * n, _config((1.0, 1.0, entity_weight), rate=0.6, max_predictions=4))
  share = np.mean([out["masked_lm_weights"][r].sum() == 3 for r in range(n)])
  assert abs(share - expected) < 0.035


def test_a_zero_weight_level_is_masked_as_words():
  n = 400
  out = _mask([HAND_IDS] * n, [HAND_TAGS] * n, _config((1.0, 1.0, 0.0), rate=0.6, max_predictions=4))
  sets = {tuple(_predicted(out, r)[0]) for r in range(n)}
  assert all(len(s) == 3 for s in sets) and len(sets) == 10  # any 3 of the 5 words


def _tagged_rows(n, length=128, seed=0):
  """Random rows of words (a piece plus 0-2 continuation pieces), with phrase spans of 2-3 words and entity
  spans of 2-4 words laid over some of them; returns ids, tags and each row's units as (start, end, level)."""
  rng = np.random.default_rng(seed)
  cdf = np.cumsum([0.7, 0.1, 0.2])
  cdf /= cdf[-1]
  ids, tags, units = [], [], []
  for _ in range(n):
    row_ids, row_tags, row_units = [CLS], [0], []
    while len(row_ids) < length - 1:
      # rng.choice([0, 1, 2], p=[0.7, 0.1, 0.2]) as numpy computes it (the same draw), at a 50th of its cost
      level = int(cdf.searchsorted(rng.random(), side="right"))
      words = 1 if level == 0 else int(rng.integers(2, 4 if level == 1 else 5))
      start, span_ids = len(row_ids), []
      for _ in range(words):
        span_ids += [int(rng.integers(5, 600))] + [int(x) for x in rng.integers(600, VOCAB, rng.integers(0, 3))]
      span_ids = span_ids[:length - 1 - len(row_ids)]
      row_ids += span_ids
      row_tags += [0] * len(span_ids) if level == 0 else [2 * level - 1] + [2 * level] * (len(span_ids) - 1)
      row_units.append((start, len(row_ids), int(level)))
    ids.append(row_ids + [SEP])
    tags.append(row_tags + [0])
    units.append(row_units)
  return np.array(ids), np.array(tags), units


def test_unit_statistics():
  """~15% of the real tokens, every unit whole, 80/10/10 per unit, and the units' sizes and levels."""
  n = 800
  ids, tags, units = _tagged_rows(n)
  out = _mask(ids, tags, _config())
  predicted_share, sizes, levels, branches, all_units = [], [], [], [], []
  for r in range(n):
    positions = set(_predicted(out, r)[0].tolist())
    predicted_share.append(len(positions) / (ids.shape[1] - 2))
    taken = set()
    for start, end, level in units[r]:
      chosen = set(range(start, end)) & positions
      all_units.append((end - start, level))
      if chosen:
        assert chosen == set(range(start, end)), (r, start, end, positions)  # a unit is chosen whole
        taken |= chosen
        sizes.append(end - start)
        levels.append(level)
        masked = out["input_ids"][r, start:end] == MASK
        assert masked.all() or not masked.any()  # its tokens share one draw
        branches.append("mask" if masked.all() else
                        "keep" if (out["input_ids"][r, start:end] == ids[r, start:end]).all() else "random")
    assert taken == positions
  assert abs(np.mean(predicted_share) - 0.15) < 0.005
  branches = np.array(branches)
  assert abs(np.mean(branches == "mask") - 0.8) < 0.03 and abs(np.mean(branches == "keep") - 0.1) < 0.02
  # Equal odds per unit: the levels' shares of the chosen units are their shares of the units, a little
  # lower for the long entity units, which overrun what is left of the budget more often.
  sizes, levels = np.array(sizes), np.array(levels)
  unit_sizes, unit_levels = np.array([s for s, _ in all_units]), np.array([lv for _, lv in all_units])
  for level in (1, 2):
    assert 0.6 * np.mean(unit_levels == level) < np.mean(levels == level) <= 1.05 * np.mean(unit_levels == level)
    assert abs(sizes[levels == level].mean() - unit_sizes[unit_levels == level].mean()) < 0.6
  assert 4.5 < sizes[levels == 2].mean() < 7.5 and 1.5 < sizes[levels == 0].mean() < 2.5


def test_rows_without_spans_are_masked_as_whole_words():
  ids, _, _ = _tagged_rows(200, seed=1)
  knowledge_out = _mask(ids, np.zeros_like(ids), _config())
  whole_word = MaskingConfig("whole_word", 0.15, 40, MASK, SPECIAL, CONTINUATION)
  for r in range(200):
    positions = set(_predicted(knowledge_out, r)[0].tolist())
    for p in positions:  # a chosen piece brings its whole word
      if CONTINUATION[ids[r, p]]:
        assert p - 1 in positions
      if p + 1 < ids.shape[1] and CONTINUATION[ids[r, p + 1]]:
        assert p + 1 in positions
  lengths = np.full(200, ids.shape[1], np.int32)
  keys = row_keys((7,), np.zeros(200), np.arange(200))
  ww = mask_batch(ids.astype(np.int32), lengths, keys, whole_word)
  assert abs(knowledge_out["masked_lm_weights"].sum() - ww["masked_lm_weights"].numpy().sum()) < 0.02 * 200 * 19


def test_capitalised_runs():
  text = ("The Free Software Foundation, says Richard Stallman's friend in New York City, sold The Lord of the Rings "
          "to Bank of America and J. K. Rowling.")
  spans = [text[s:e] for s, e, _ in knowledge.capitalised_runs(text)]
  assert spans == ["Free Software Foundation", "Richard Stallman", "New York City", "The Lord of the Rings",
                   "Bank of America", "J. K. Rowling"]
  assert knowledge.capitalised_runs("Paris is big. it is what it is.") == []


def test_tagged_ids_keep_the_tokenization(tmp_path):
  vocab = tmp_path / "vocab.txt"
  vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "free", "software", "found",
                              "##ation", "was", "here", "."]))
  from bert_jax.data_pipelines.tokenizers import load_tokenizer
  tokenizer = load_tokenizer(str(vocab))
  encoder = knowledge.TaggedEncoder(tokenizer, knowledge.CapitalisedAnnotator())
  text = "The Free Software Foundation was here."
  [[tagged]] = encoder.documents([[text]])
  ids, tags = knowledge.split_ids(tagged)
  assert ids == tokenizer.encode(text)
  assert tags == [0, E1, E1 + 1, E1 + 1, E1 + 1, 0, 0, 0]


def test_phrase_list_is_case_insensitive(tmp_path):
  path = tmp_path / "phrases.txt"
  path.write_text("free software\nphrase\tmachine learning\n")
  annotator = knowledge.make_annotator(phrases=str(path))
  text = "Free SOFTWARE and machine Learning, not free."
  assert [(text[s:e], level) for s, e, level in annotator([text])[0]] == [
      ("Free SOFTWARE", knowledge.ENTITY), ("machine Learning", knowledge.PHRASE)]


def test_spacy_pipeline_entities_and_noun_chunks(tmp_path):
  spacy = pytest.importorskip("spacy")
  nlp = spacy.blank("en")
  ruler = nlp.add_pipe("entity_ruler")
  ruler.add_patterns([{"label": "ORG", "pattern": "Free Software Foundation"},
                      {"label": "PERSON", "pattern": [{"LOWER": "richard"}, {"LOWER": "stallman"}]}])
  nlp.to_disk(tmp_path / "pipeline")
  annotator = knowledge.make_annotator(spacy_model=str(tmp_path / "pipeline"))
  text = "richard stallman started the Free Software Foundation."
  assert [(text[s:e], level) for s, e, level in annotator([text])[0]] == [
      ("richard stallman", knowledge.ENTITY), ("Free Software Foundation", knowledge.ENTITY)]

  class Parsed:  # noun chunks come from a parser: a doc that has one, as spaCy's own pipelines give
    def __init__(self, doc):
      self.ents, self.noun_chunks = doc.ents, [doc[3:5]]  # "the Free": overlaps an entity, dropped
      self.has_annotation = lambda name: True
  doc = nlp(text)
  assert annotator._spans(Parsed(doc)) == [(0, 16, 2), (29, 53, 2)]
  doc2 = nlp("the red car stopped")
  parsed = Parsed(doc2)
  parsed.noun_chunks = [doc2[0:3]]
  assert annotator._spans(parsed) == [(0, 11, knowledge.PHRASE)]


def _run(argv, overrides=()):
  parser = argparse.ArgumentParser()
  cli.register(parser.add_subparsers(dest="command"))
  args = parser.parse_args(argv)
  args.config_overrides = list(overrides)
  return args.handler(args)


def test_a_missing_annotator_is_one_line_exit_2(tmp_path, capsys):
  from bert_jax import cli as main_cli
  with pytest.raises(DataError, match="cannot be loaded"):
    knowledge.make_annotator(spacy_model="xx_no_such_pipeline")
  with pytest.raises(DataError, match="cannot be read"):
    knowledge.make_annotator(phrases=str(tmp_path / "missing.txt"))
  corpus = tmp_path / "c.txt"
  corpus.write_text("One Two three.\nFour five.\n")
  code = main_cli.main(["data", "preview", "--config", "configs/bert.py:demo", "--output", str(tmp_path / "p.npz"),
                        "--config.data.masking=knowledge", f"--config.data.corpus={corpus}",
                        f"--config.data.knowledge.phrases={tmp_path}/missing.txt"])
  err = capsys.readouterr().err
  assert code == 2 and len(err.strip().splitlines()) == 1 and "data.knowledge.phrases" in err


# Documents as an encyclopedia writes them, where multi-word names recur (the hidden check's kind of corpus).
DOCUMENTS = [
    ["Richard Stallman launched the GNU Project in 1983 to write a free operating system.",
     "Two years later Richard Stallman founded the Free Software Foundation in Boston.",
     "The Free Software Foundation employs programmers and publishes the GNU General Public License.",
     "Many companies, including Red Hat, build products under the GNU General Public License.",
     "In interviews Richard Stallman often explains why the Free Software Foundation avoids the term open source."],
    ["Linus Torvalds wrote the first version of the Linux kernel while he studied at the University of Helsinki.",
     "He announced the project on a newsgroup, and volunteers from around the world sent patches.",
     "Today Linus Torvalds still approves the changes that enter the main tree.",
     "The Linux Foundation pays Linus Torvalds so that he can work on the kernel full time.",
     "Companies such as Red Hat and Google contribute thousands of changes every year.",
     "The University of Helsinki later gave Linus Torvalds an honorary doctorate."],
    ["The United Nations was founded in 1945 after the Second World War.",
     "Its headquarters stand in New York City, on land bought with money from John D. Rockefeller.",
     "Every autumn the General Assembly of the United Nations meets for a general debate.",
     "Delegates travel to New York City from almost every country in the world.",
     "The Security Council can authorise the use of force, while the General Assembly cannot.",
     "Critics say the Security Council reflects the world as it was at the end of the Second World War."],
    ["Harry Potter is a series of fantasy novels written by the British author J. K. Rowling.",
     "The novels follow Harry Potter and his friends Hermione Granger and Ron Weasley at Hogwarts School.",
     "The first novel was published in London by Bloomsbury Publishing in 1997.",
     "Warner Bros turned the books into eight films, which made Daniel Radcliffe famous.",
     "Readers still argue about whether Severus Snape was a hero or a villain.",
     "By 2018 the books about Harry Potter had sold more than five hundred million copies."],
    ["Marie Curie was born in Warsaw and moved to Paris to study physics.",
     "At the University of Paris she met Pierre Curie, and the two worked together on radioactivity.",
     "Marie Curie and Pierre Curie shared the Nobel Prize in Physics with Henri Becquerel in 1903.",
     "After the death of Pierre Curie, she took over his teaching post at the University of Paris.",
     "In 1911 Marie Curie received a second Nobel Prize, this time in chemistry.",
     "The Curie Institute in Paris still carries on the research that Marie Curie began."],
    ["The Golden Gate Bridge opened in 1937 and crosses the strait between San Francisco and Marin County.",
     "Engineers had doubted that a bridge could span the Golden Gate because of fog and strong currents.",
     "Joseph Strauss led the project, though Charles Ellis did much of the structural design.",
     "For decades the Golden Gate Bridge was the longest suspension bridge in the world.",
     "Visitors to San Francisco walk across it to see the city and the Pacific Ocean.",
     "The colour of the Golden Gate Bridge is called international orange."],
    ["Ada Lovelace wrote notes on the Analytical Engine designed by Charles Babbage.",
     "Her notes describe an algorithm that the Analytical Engine could run to compute Bernoulli numbers.",
     "Charles Babbage never finished building the Analytical Engine, for lack of money.",
     "Historians call Ada Lovelace the first computer programmer because of those notes.",
     "The British Library keeps letters between Ada Lovelace and Charles Babbage.",
     "A programming language used by the United States Department of Defense is named after Ada Lovelace."],
    ["The Amazon River flows through Peru, Colombia and Brazil before it reaches the Atlantic Ocean.",
     "The Amazon River carries more water than any other river on Earth.",
     "The rainforest around the Amazon River is home to millions of species.",
     "Scientists from the University of Sao Paulo study how the forest affects the climate.",
     "Every year fires burn large areas of forest near the Amazon River.",
     "The government of Brazil has promised to slow the clearing of the forest."],
]
NAMES = ["Richard Stallman", "Free Software Foundation", "GNU General Public License", "Red Hat", "Linus Torvalds",
         "University of Helsinki", "Linux Foundation", "United Nations", "Second World War", "New York City",
         "General Assembly", "Security Council", "Harry Potter", "Hermione Granger", "Ron Weasley", "Marie Curie",
         "Pierre Curie", "University of Paris", "Nobel Prize", "Golden Gate Bridge", "San Francisco",
         "Charles Babbage", "Ada Lovelace", "Analytical Engine", "Amazon River", "Atlantic Ocean", "Pacific Ocean"]


def _write_corpus(path):
  path.write_text("\n\n".join("\n".join(doc) for doc in DOCUMENTS) + "\n")
  return str(path)


def _occurrences(row, name_ids):
  """The starts of `name_ids` in `row` (NumPy's windows: a Python loop over slices took ~20 s a test)."""
  if len(name_ids) > len(row):
    return []
  windows = np.lib.stride_tricks.sliding_window_view(row, len(name_ids))
  return np.flatnonzero((windows == np.asarray(name_ids)).all(axis=1)).tolist()


def _name_statistics(saved, tokenizer):
  """(share of names with a token predicted that have all of them predicted, share of real tokens predicted)."""
  ids = saved["input_ids"].reshape(-1, saved["input_ids"].shape[-1]).copy()
  positions = saved["masked_lm_positions"].reshape(len(ids), -1)
  labels = saved["masked_lm_ids"].reshape(len(ids), -1)
  weights = saved["masked_lm_weights"].reshape(len(ids), -1) > 0
  names = [tokenizer.encode(name) for name in NAMES]
  touched = whole = predicted = 0
  for r in range(len(ids)):
    ids[r, positions[r][weights[r]]] = labels[r][weights[r]]  # the original row
    chosen = set(positions[r][weights[r]].tolist())
    predicted += len(chosen)
    for name_ids in names:
      for start in _occurrences(ids[r], name_ids):
        hit = chosen & set(range(start, start + len(name_ids)))
        touched += bool(hit)
        whole += len(hit) == len(name_ids)
  return whole / touched, predicted / saved["input_mask"].sum()


@pytest.mark.parametrize("masking", ["knowledge", "whole_word"])
def test_preview_masks_recurring_names_whole(tmp_path, capsys, masking):
  from bert_jax.data_pipelines.tokenizers import load_tokenizer
  from data_fixtures import embedded_paths
  corpus = _write_corpus(tmp_path / "names.txt")
  out = str(tmp_path / "preview.npz")
  _run(["data", "preview", "--config", "configs/bert.py:demo", "--num-batches", "20", "--output", out],
                 [f"--config.data.masking={masking}", f"--config.data.corpus={corpus}", "--config.data.num_shards=1",
                  "--config.data.eval_fraction=0.0", "--config.train.batch_size=32",
                  "--config.data.max_seq_length=128", "--config.data.max_predictions_per_seq=20"])
  printed = capsys.readouterr().out
  saved = np.load(out)
  whole, rate = _name_statistics(saved, load_tokenizer(embedded_paths()[1]))
  assert 0.13 < rate < 0.16
  if masking == "knowledge":
    assert whole >= 0.95 and "{E:" in printed and "knowledge_units" in saved
  else:
    assert whole < 0.2


def test_prepared_documents_keep_the_spans(tmp_path):
  from data_fixtures import embedded_paths
  corpus = _write_corpus(tmp_path / "names.txt")
  metadata = prepare.prepare(corpus, str(tmp_path / "records"), embedded_paths()[1], num_workers=1,
                             knowledge_annotator={})
  assert metadata["knowledge"] == "capitalised"
  cfg = lambda **kw: common.data_config(masking="knowledge", vocab=embedded_paths()[1], num_shards=1,  # noqa: E731
                                        eval_fraction=0.0, shuffle_buffer=20, max_seq_length=64, **kw)
  batches = [make_pretrain_input(c, global_batch_size=8, process_index=0, process_count=1)
             for c in (cfg(corpus=corpus), cfg(prepared=str(tmp_path / "records" / "*.tfrecord")))]
  for _ in range(2):
    raw, prepared = next(batches[0]), next(batches[1])
    for k in raw:
      assert np.array_equal(raw[k], prepared[k]), k
  assert raw["knowledge_units"].any()
  prepare.prepare(corpus, str(tmp_path / "plain"), embedded_paths()[1], num_workers=1)
  with pytest.raises(DataError, match="keep no phrase or entity spans"):
    make_pretrain_input(cfg(prepared=str(tmp_path / "plain" / "*.tfrecord")), global_batch_size=8,
                        process_index=0, process_count=1)


@slow  # worker processes start TensorFlow (BERT_JAX_SLOW_TESTS=1)
def test_worker_processes_give_the_same_batches():
  """The tagged ids travel through worker processes (their config rebuilt from data.knowledge) unchanged."""
  from data_fixtures import embedded_paths
  corpus, vocab = embedded_paths()
  batches = []
  for workers in (0, 2):
    cfg = common.data_config(corpus=corpus, vocab=vocab, masking="knowledge", num_workers=workers,
                             shuffle_buffer=200)
    data = make_pretrain_input(cfg, global_batch_size=32, process_index=0, process_count=1)
    batches.append([next(data) for _ in range(3)])
    data.close()
  for a, b in zip(*batches):
    for k in a:
      assert np.array_equal(a[k], b[k]), k
  assert batches[0][0]["knowledge_units"].any()


def test_preview_shows_a_row_with_spans_on_the_embedded_corpus(tmp_path, capsys):
  """The embedded corpus holds few capitalised runs: its first row has no span, so preview prints the first row
  that has one, its entity marked (a row without any printed no mark at all)."""
  out = str(tmp_path / "preview.npz")
  _run(["data", "preview", "--config", "configs/bert.py:demo", "--num-batches", "1", "--output", out],
       ["--config.data.masking=knowledge", "--config.data.shuffle_buffer=50", "--config.train.batch_size=8"])
  printed = capsys.readouterr().out
  units = np.load(out)["knowledge_units"][0]
  shown = int(np.flatnonzero(units.any(axis=1))[0])
  assert shown > 0 and printed.startswith(f"batch 0, row {shown}: the first with a knowledge span"), printed
  row = printed.splitlines()[-1]
  assert row.count("{E:") + row.count("{P:") == (units[shown] % 2).sum() > 0
