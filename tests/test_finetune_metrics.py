"""Fine-tuning metrics against scipy/sklearn on random predictions and against hand-computed cases."""
import collections
import random
import re
import string

import numpy as np
import pytest
import torch
from scipy import stats
from sklearn import metrics as skm

from bert_jax.errors import UserError
from bert_jax.finetune import metrics


@pytest.mark.parametrize("seed", range(4))
def test_classification_metrics_match_sklearn(seed):
  rng = np.random.default_rng(seed)
  labels, predictions = rng.integers(0, 2, 200), rng.integers(0, 2, 200)
  assert metrics.accuracy(labels, predictions) == pytest.approx(skm.accuracy_score(labels, predictions))
  assert metrics.binary_f1(labels, predictions) == pytest.approx(skm.f1_score(labels, predictions))
  assert metrics.matthews_corrcoef(labels, predictions) == pytest.approx(skm.matthews_corrcoef(labels, predictions))
  three_labels, three_predictions = rng.integers(0, 3, 200), rng.integers(0, 3, 200)
  assert metrics.matthews_corrcoef(three_labels, three_predictions) == pytest.approx(
      skm.matthews_corrcoef(three_labels, three_predictions))


def test_mcc_degenerate_is_zero():
  assert metrics.matthews_corrcoef([1, 0, 1], [1, 1, 1]) == skm.matthews_corrcoef([1, 0, 1], [1, 1, 1]) == 0.0


@pytest.mark.parametrize("seed", range(3))
def test_correlations_match_scipy(seed):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=100)
  y = x + rng.normal(size=100)
  ties = np.round(rng.uniform(0, 5, 100))  # STS-B gold scores repeat
  assert metrics.pearson(x, y) == pytest.approx(stats.pearsonr(x, y)[0])
  assert metrics.spearman(x, y) == pytest.approx(stats.spearmanr(x, y)[0])
  assert metrics.spearman(ties, y) == pytest.approx(stats.spearmanr(ties, y)[0])


def test_constant_predictions_read_zero_with_a_note():
  labels, constant = [0.5, 1.0, 3.0, 4.5], [2.0, 2.0, 2.0, 2.0]
  assert np.isnan(stats.pearsonr(labels, constant)[0]) and np.isnan(stats.spearmanr(labels, constant)[0])
  assert metrics.pearson(labels, constant) == metrics.spearman(labels, constant) == 0.0
  assert "constant predictions" in metrics.correlation_note(labels, constant)
  assert "constant labels" in metrics.correlation_note(constant, labels)
  assert metrics.correlation_note(labels, [1.0, 2.0, 2.0, 5.0]) is None


def test_dev_losses_match_torch():
  rng = np.random.default_rng(0)
  logits, labels = rng.normal(size=(50, 3)) * 4, rng.integers(0, 3, 50)
  expected = torch.nn.functional.cross_entropy(torch.tensor(logits), torch.tensor(labels)).item()
  assert metrics.cross_entropy(labels, logits) == pytest.approx(expected, rel=1e-9)
  x, y = rng.normal(size=20), rng.normal(size=20)
  assert metrics.squared_error(x, y) == pytest.approx(torch.nn.functional.mse_loss(torch.tensor(y), torch.tensor(x)).item())


def test_squad_normalisation_and_scores_by_hand():
  assert metrics.normalize_answer("The  Denver Broncos!") == "denver broncos"
  assert metrics.squad_exact("the Denver Broncos", "Denver Broncos.") == 1.0
  # prediction "denver broncos win", gold "broncos" -> P = 1/3, R = 1, F1 = 0.5
  assert metrics.squad_f1("Denver Broncos win", "Broncos") == pytest.approx(0.5)
  scores = metrics.squad_scores({"q1": "Denver Broncos win", "q2": "", "q3": "an answer"},
                          {"q1": ["Broncos", "Denver Broncos win"], "q2": [], "q3": []}, "v2.0")
  # q1: EM 1 (second gold), q2: unanswerable predicted "" -> 1, q3: unanswerable answered -> 0
  assert scores == {"exact_match": pytest.approx(200 / 3), "f1": pytest.approx(200 / 3)}


def test_squad_f1_takes_best_gold():
  # gold "a cat sat" normalises to "cat sat": P = 1/2, R = 1/2 against "cat ran"
  for version in ("v1.1", "v2.0"):
    scores = metrics.squad_scores({"q": "cat ran"}, {"q": ["a cat sat", "dog"]}, version)
    assert scores["f1"] == pytest.approx(50.0) and scores["exact_match"] == 0.0


def test_entities_iob2_and_iob1_like_seqeval():
  # IOB2: B starts, I continues; an I of another type starts a new entity (seqeval's default).
  assert metrics.entities([["B-PER", "I-PER", "O", "B-LOC", "I-ORG"]]) == {
      (0, "PER", 0, 1), (0, "LOC", 3, 3), (0, "ORG", 4, 4)}
  # IOB1: entities start with I; B only splits two adjacent entities of one type.
  assert metrics.entities([["I-PER", "I-PER", "B-PER", "O", "I-LOC"]]) == {
      (0, "PER", 0, 1), (0, "PER", 2, 2), (0, "LOC", 4, 4)}


def test_entity_f1_by_hand():
  gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"]]
  predicted = [["B-PER", "I-PER", "O", "B-ORG"], ["B-ORG", "B-MISC"]]
  # gold: PER(0-1), LOC(3), ORG; predicted: PER(0-1), ORG(3), ORG, MISC -> 2 hits, P = 2/4, R = 2/3
  result = metrics.entity_f1(gold, predicted)
  assert result["precision"] == pytest.approx(0.5) and result["recall"] == pytest.approx(2 / 3)
  assert result["f1"] == pytest.approx(2 * 0.5 * (2 / 3) / (0.5 + 2 / 3))


# --- the official SQuAD evaluation scripts (evaluate-v1.1.py, evaluate-v2.0.py), re-implemented --------

def _official_normalize(s):
  s = "".join(ch for ch in s.lower() if ch not in set(string.punctuation))
  return " ".join(re.sub(r"\b(a|an|the)\b", " ", s).split())


def _v1_f1(prediction, ground_truth):
  prediction_tokens, ground_truth_tokens = _official_normalize(prediction).split(), _official_normalize(ground_truth).split()
  num_same = sum((collections.Counter(prediction_tokens) & collections.Counter(ground_truth_tokens)).values())
  if num_same == 0:
    return 0
  precision, recall = num_same / len(prediction_tokens), num_same / len(ground_truth_tokens)
  return 2 * precision * recall / (precision + recall)


def official_v1(dataset, predictions):
  f1 = exact_match = total = 0
  for article in dataset:
    for paragraph in article["paragraphs"]:
      for qa in paragraph["qas"]:
        total += 1
        if qa["id"] not in predictions:
          continue
        ground_truths = [a["text"] for a in qa["answers"]]
        prediction = predictions[qa["id"]]
        exact_match += max(_official_normalize(prediction) == _official_normalize(g) for g in ground_truths)
        f1 += max(_v1_f1(prediction, g) for g in ground_truths)
  return {"exact_match": 100.0 * exact_match / total, "f1": 100.0 * f1 / total}


def _v2_tokens(s):
  return _official_normalize(s).split() if s else []


def _v2_f1(a_gold, a_pred):
  gold_toks, pred_toks = _v2_tokens(a_gold), _v2_tokens(a_pred)
  num_same = sum((collections.Counter(gold_toks) & collections.Counter(pred_toks)).values())
  if len(gold_toks) == 0 or len(pred_toks) == 0:
    return int(gold_toks == pred_toks)
  if num_same == 0:
    return 0
  precision, recall = num_same / len(pred_toks), num_same / len(gold_toks)
  return 2 * precision * recall / (precision + recall)


def official_v2(dataset, preds):
  """get_raw_scores + make_eval_dict (no na_prob file: the threshold changes nothing)."""
  exact_scores, f1_scores = {}, {}
  for article in dataset:
    for p in article["paragraphs"]:
      for qa in p["qas"]:
        qid = qa["id"]
        gold_answers = [a["text"] for a in qa["answers"] if _official_normalize(a["text"])] or [""]
        if qid not in preds:
          continue
        exact_scores[qid] = max(int(_official_normalize(a) == _official_normalize(preds[qid])) for a in gold_answers)
        f1_scores[qid] = max(_v2_f1(a, preds[qid]) for a in gold_answers)
  total = len(exact_scores)
  return {"exact_match": 100.0 * sum(exact_scores.values()) / total, "f1": 100.0 * sum(f1_scores.values()) / total}


# Golds that normalise to nothing ("...\n", "the", "!!"), near misses and exact ones.
_TEXTS = ["...\n", "the", "a an the", "", "  ", "!!", "Denver Broncos", "the Denver Broncos!", "Broncos",
          "Santa Clara", "Levi's Stadium", "50", "Super Bowl 50", "the game", "the ...\n.", "Denver", "an"]


def _random_case(rng, version):
  qas, predictions = [], {}
  for q in range(rng.randint(1, 6)):
    answers = [{"text": rng.choice(_TEXTS), "answer_start": 0}
               for _ in range(rng.randint(1 if version == "v1.1" else 0, 3))]
    qas.append({"id": f"q{q}", "question": "?", "answers": answers})
    if rng.random() < 0.75:
      predictions[f"q{q}"] = rng.choice(_TEXTS)
  if not predictions:  # the official v2.0 script divides by zero then
    predictions["q0"] = rng.choice(_TEXTS)
  return [{"title": "t", "paragraphs": [{"context": "c", "qas": qas}]}], predictions


@pytest.mark.parametrize("version", ["v1.1", "v2.0"])
def test_squad_scores_equal_the_official_scripts(version):
  rng, official = random.Random(0), {"v1.1": official_v1, "v2.0": official_v2}[version]
  other_version, differ_from_other_version = {"v1.1": "v2.0", "v2.0": "v1.1"}[version], 0
  for _ in range(3000):
    dataset, predictions = _random_case(rng, version)
    golds = {qa["id"]: [a["text"] for a in qa["answers"]] for qa in dataset[0]["paragraphs"][0]["qas"]}
    expected = official(dataset, predictions)
    assert metrics.squad_scores(predictions, golds, version) == pytest.approx(expected), (golds, predictions)
    differ_from_other_version += metrics.squad_scores(predictions, golds, other_version) != pytest.approx(expected)
  assert differ_from_other_version > 1000  # the cases exercise where the two scripts part ways


def test_squad_empty_normalising_gold_and_missing_predictions_by_hand():
  # the case: gold "...\n" normalises to nothing; v1.1 scores it as an answer (EM on the
  # equal empty normalisation, F1 0 with no tokens), v2.0 as "unanswerable" (F1 1 on an empty answer)
  assert metrics.squad_scores({"q": "the ...\n."}, {"q": ["...\n"]}, "v1.1") == {"exact_match": 100.0, "f1": 0.0}
  assert metrics.squad_scores({"q": "the ...\n."}, {"q": ["...\n"]}, "v2.0") == {"exact_match": 100.0, "f1": 100.0}
  golds = {"q1": ["Broncos"], "q2": ["Santa Clara"], "q3": []}
  # v1.1: the missing q2 and q3 score 0 and count; v2.0: they are left out of the total
  assert metrics.squad_scores({"q1": "Broncos"}, golds, "v1.1")["exact_match"] == pytest.approx(100 / 3)
  assert metrics.squad_scores({"q1": "Broncos"}, golds, "v2.0") == {"exact_match": 100.0, "f1": 100.0}
  with pytest.raises(UserError, match="no prediction for any of the 3"):
    metrics.squad_scores({"other": "x"}, golds, "v2.0")
