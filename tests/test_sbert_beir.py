"""Retrieval scores of a BEIR-format folder (bert_jax/sbert/beir.py, `bert-jax embed-eval --beir`) against the
`beir` package's EvaluateRetrieval (pytrec_eval's nDCG and recall, beir's MRR) on the same run, on the
offline folder built from the embedded corpus; bad folders are one line."""
import copy
import json

import numpy as np
import pytest

from bert_jax import cli
from bert_jax.sbert import beir


def _bag_of_words(texts, dim=6):
  """A deterministic embedding: each word a fixed random vector, summed (no model: the scores are the point)."""
  out = np.zeros((len(texts), dim))
  for i, text in enumerate(texts):
    for word in text.lower().split():
      out[i] += np.random.default_rng(abs(hash(word)) % 2 ** 32).normal(size=dim)
  return out


def _reference(qrels, results, ks):
  evaluation = pytest.importorskip("beir.retrieval.evaluation")
  ndcg, _, recall, _ = evaluation.EvaluateRetrieval.evaluate(qrels, copy.deepcopy(results), list(ks))
  mrr = evaluation.EvaluateRetrieval.evaluate_custom(qrels, copy.deepcopy(results), list(ks), "mrr")
  return {**{f"ndcg@{k}": ndcg[f"NDCG@{k}"] for k in ks}, **{f"recall@{k}": recall[f"Recall@{k}"] for k in ks},
          **{f"mrr@{k}": mrr[f"MRR@{k}"] for k in ks}}


def test_scores_equal_beirs_evaluate_retrieval_on_the_embedded_folder(tmp_path):
  """The offline folder (embedded STS dev pairs: graded 2, 1 and judged 0) ranked by a bag-of-words
  embedding: nDCG@k, recall@k and MRR@k equal beir's (which rounds to 5 decimals), and they are not
  trivial (neither 0 nor 1)."""
  folder = beir.write_embedded(str(tmp_path / "set"), 200)
  assert len(folder.query_ids) > 50 and len(folder.docs) > len(folder.query_ids)
  assert {g for grades in folder.qrels.values() for g in grades.values()} == {0, 1, 2}
  ks = (1, 3, 10)
  results = beir.run(_bag_of_words, folder, 10)
  got = beir.scores(folder.qrels, results, ks)
  want = _reference(folder.qrels, results, ks)
  assert got["queries"] == len(folder.query_ids)
  for name, value in want.items():
    assert got[name] == pytest.approx(value, abs=6e-6), name
  assert 0.2 < got["ndcg@10"] < 0.95 and got["recall@1"] < got["recall@10"]


def test_graded_ties_and_own_ids_as_beir_scores_them():
  """A hand-made run: grades 3/1/0, a tie in score, a query whose own id is in the corpus (left out), a query
  with no relevant document found: the same numbers as beir, and nDCG@3 of q1 by hand."""
  qrels = {"q1": {"a": 3, "b": 1, "c": 0}, "q2": {"q2": 2, "d": 1}, "q3": {"e": 1}}
  results = {"q1": {"c": 0.9, "b": 0.8, "a": 0.8, "x": 0.1}, "q2": {"q2": 0.99, "d": 0.5, "a": 0.4},
             "q3": {"a": 0.3, "b": 0.2}}
  ks = (1, 3)
  got = beir.scores(qrels, {q: {d: s for d, s in r.items() if d != q} for q, r in results.items()}, ks)
  want = _reference(qrels, results, ks)
  for name, value in want.items():
    assert got[name] == pytest.approx(value, abs=6e-6), name
  # q1 ranks c (0), then the tie b/a as trec_eval orders it (larger id first: b, a): gains 0, 1, 3
  ideal = 3 + 1 / np.log2(3)
  q1 = (1 / np.log2(3) + 3 / np.log2(4)) / ideal
  assert beir.scores({"q1": qrels["q1"]}, {"q1": results["q1"]}, (3,))["ndcg@3"] == pytest.approx(q1)


def test_embed_eval_takes_a_beir_folder(sst2_finetuned, tmp_path, capsys):
  """`embed-eval --beir FOLDER --model CKPT`: the Embedder's run scored as beir scores it."""
  import bert_jax
  _, model, _ = sst2_finetuned
  folder = beir.write_embedded(str(tmp_path / "set"), 80)
  assert cli.main(["embed-eval", "--model", model, "--beir", str(tmp_path / "set"), "--k", "1,5"]) == 0
  got = json.loads(capsys.readouterr().out)
  embedder = bert_jax.Embedder.load(model)
  want = _reference(folder.qrels, beir.run(embedder, folder, 10), (1, 5, 10))
  assert got["corpus"] == 80 and got["queries"] == len(folder.query_ids)
  for name, value in want.items():
    assert got[name] == pytest.approx(value, abs=2e-5), name


@pytest.mark.parametrize("breaks,named", [
    (lambda root: (root / "qrels" / "test.tsv").write_bytes(b"\xff\xfe\x00bad"), "unreadable qrels"),
    (lambda root: (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\n"),
     "line 2: expected query-id<TAB>corpus-id<TAB>integer score"),
    (lambda root: (root / "qrels" / "test.tsv").unlink(), "no such qrels file"),
    (lambda root: (root / "qrels" / "test.tsv").write_text("q-none\td0\t1\n"), "'q-none' is not in queries.jsonl"),
    (lambda root: (root / "corpus.jsonl").write_text("{not json\n"), "corpus.jsonl, line 1: not a JSON object"),
])
def test_a_bad_beir_folder_is_one_line(breaks, named, tmp_path, capsys):
  beir.write_embedded(str(tmp_path / "set"), 40)
  breaks(tmp_path / "set")
  assert cli.main(["embed-eval", "--model", str(tmp_path / "no-model"), "--beir", str(tmp_path / "set")]) == 2
  err = capsys.readouterr().err
  assert named in err and len(err.strip().splitlines()) == 1, err
