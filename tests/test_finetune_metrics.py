"""Fine-tuning metrics against scipy/sklearn on random predictions and against hand-computed cases."""
import numpy as np
import pytest
from scipy import stats
from sklearn import metrics as skm

from bert_jax.finetune import metrics as M


@pytest.mark.parametrize("seed", range(4))
def test_classification_metrics_match_sklearn(seed):
  rng = np.random.default_rng(seed)
  labels, predictions = rng.integers(0, 2, 200), rng.integers(0, 2, 200)
  assert M.accuracy(labels, predictions) == pytest.approx(skm.accuracy_score(labels, predictions))
  assert M.binary_f1(labels, predictions) == pytest.approx(skm.f1_score(labels, predictions))
  assert M.matthews_corrcoef(labels, predictions) == pytest.approx(skm.matthews_corrcoef(labels, predictions))
  three_labels, three_predictions = rng.integers(0, 3, 200), rng.integers(0, 3, 200)
  assert M.matthews_corrcoef(three_labels, three_predictions) == pytest.approx(
      skm.matthews_corrcoef(three_labels, three_predictions))


def test_mcc_degenerate_is_zero():
  assert M.matthews_corrcoef([1, 0, 1], [1, 1, 1]) == skm.matthews_corrcoef([1, 0, 1], [1, 1, 1]) == 0.0


@pytest.mark.parametrize("seed", range(3))
def test_correlations_match_scipy(seed):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=100)
  y = x + rng.normal(size=100)
  ties = np.round(rng.uniform(0, 5, 100))  # STS-B gold scores repeat
  assert M.pearson(x, y) == pytest.approx(stats.pearsonr(x, y)[0])
  assert M.spearman(x, y) == pytest.approx(stats.spearmanr(x, y)[0])
  assert M.spearman(ties, y) == pytest.approx(stats.spearmanr(ties, y)[0])


def test_squad_normalisation_and_scores_by_hand():
  assert M.normalize_answer("The  Denver Broncos!") == "denver broncos"
  assert M.squad_exact("the Denver Broncos", "Denver Broncos.") == 1.0
  # prediction "denver broncos win", gold "broncos" -> P = 1/3, R = 1, F1 = 0.5
  assert M.squad_f1("Denver Broncos win", "Broncos") == pytest.approx(0.5)
  scores = M.squad_scores({"q1": "Denver Broncos win", "q2": "", "q3": "an answer"},
                          {"q1": ["Broncos", "Denver Broncos win"], "q2": [], "q3": []})
  # q1: EM 1 (second gold), q2: unanswerable predicted "" -> 1, q3: unanswerable answered -> 0
  assert scores == {"exact_match": pytest.approx(200 / 3), "f1": pytest.approx(200 / 3)}


def test_squad_f1_takes_best_gold():
  # gold "a cat sat" normalises to "cat sat": P = 1/2, R = 1/2 against "cat ran"
  scores = M.squad_scores({"q": "cat ran"}, {"q": ["a cat sat", "dog"]})
  assert scores["f1"] == pytest.approx(50.0) and scores["exact_match"] == 0.0


def test_entities_iob2_and_iob1_like_seqeval():
  # IOB2: B starts, I continues; an I of another type starts a new entity (seqeval's default).
  assert M.entities([["B-PER", "I-PER", "O", "B-LOC", "I-ORG"]]) == {
      (0, "PER", 0, 1), (0, "LOC", 3, 3), (0, "ORG", 4, 4)}
  # IOB1: entities start with I; B only splits two adjacent entities of one type.
  assert M.entities([["I-PER", "I-PER", "B-PER", "O", "I-LOC"]]) == {
      (0, "PER", 0, 1), (0, "PER", 2, 2), (0, "LOC", 4, 4)}


def test_entity_f1_by_hand():
  gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"]]
  predicted = [["B-PER", "I-PER", "O", "B-ORG"], ["B-ORG", "B-MISC"]]
  # gold: PER(0-1), LOC(3), ORG; predicted: PER(0-1), ORG(3), ORG, MISC -> 2 hits, P = 2/4, R = 2/3
  result = M.entity_f1(gold, predicted)
  assert result["precision"] == pytest.approx(0.5) and result["recall"] == pytest.approx(2 / 3)
  assert result["f1"] == pytest.approx(2 * 0.5 * (2 / 3) / (0.5 + 2 / 3))
