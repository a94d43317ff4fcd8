"""Retrieval evaluation on a BEIR-format folder (Thakur et al. 2021), scored as the `beir` package scores a run.

  FOLDER/corpus.jsonl     {"_id", "title", "text"} per line; a document is title + " " + text, stripped
  FOLDER/queries.jsonl    {"_id", "text"} per line
  FOLDER/qrels/SPLIT.tsv  query-id<TAB>corpus-id<TAB>score, a header line first; score an integer grade

Only the queries with judgements in the split are run. Each is ranked against the whole corpus by cosine
(a document whose id is the query's own is left out, as beir's EvaluateRetrieval does by default), and:

  ndcg@k    trec_eval's ndcg_cut (pytrec_eval): gain = the grade, discount log2(rank + 1), over the ideal
            order of the query's judged grades; ties in score rank the larger document id first
  recall@k  trec_eval's recall: the share of the query's documents graded >= 1 found in the top k
  mrr@k     beir's MRR@k: 1 / the rank of the first document graded > 0 in the top k (0 if none), over
            all the split's queries (ties: corpus order)

each the mean over queries, as beir reports them (tests/test_sbert_beir.py checks them against beir and
pytrec_eval). `write_embedded` builds a small such folder from the embedded corpus (sbert/embedded.py).
"""
from __future__ import annotations

import dataclasses
import json
import math
from typing import Callable, Sequence

import numpy as np
from etils import epath

from bert_jax.errors import UserError
from bert_jax.sbert import embedded
from bert_jax.sbert.evaluate import cosine_scores

Embed = Callable[[Sequence[str]], np.ndarray]


@dataclasses.dataclass
class Folder:
  doc_ids: list[str]
  docs: list[str]
  query_ids: list[str]  # the judged queries only, in queries.jsonl's order
  queries: list[str]
  qrels: dict[str, dict[str, int]]


def _jsonl(path: epath.Path, fields: tuple[str, ...]) -> list[dict]:
  if not path.is_file():
    raise UserError(f"{path}: no such file (a BEIR folder holds corpus.jsonl, queries.jsonl and qrels/SPLIT.tsv)")
  rows = []
  try:
    lines = path.read_text(encoding="utf-8").splitlines()
  except UnicodeDecodeError as e:
    raise UserError(f"{path}: not UTF-8 text ({e})") from None
  for n, line in enumerate(lines, 1):
    if not line.strip():
      continue
    try:
      row = json.loads(line)
    except json.JSONDecodeError as e:
      raise UserError(f"{path}, line {n}: not a JSON object ({e.msg})") from None
    if not isinstance(row, dict) or any(not isinstance(row.get(f, ""), str) for f in fields) or "_id" not in row:
      raise UserError(f"{path}, line {n}: expected an object with string fields {list(fields)}")
    rows.append(row)
  if not rows:
    raise UserError(f"{path}: no lines")
  return rows


def read_qrels(path: epath.Path) -> dict[str, dict[str, int]]:
  if not path.is_file():
    raise UserError(f"{path}: no such qrels file")
  try:
    lines = path.read_text(encoding="utf-8").splitlines()
  except (UnicodeDecodeError, OSError) as e:
    raise UserError(f"{path}: unreadable qrels ({e})") from None
  qrels: dict[str, dict[str, int]] = {}
  for n, line in enumerate(lines, 1):
    fields = line.rstrip("\r").split("\t")
    if n == 1 and len(fields) == 3 and not fields[2].strip().lstrip("-").isdigit():
      continue  # the header
    if fields == [""]:
      continue
    if len(fields) != 3 or not fields[2].strip().lstrip("-").isdigit():
      raise UserError(f"{path}, line {n}: expected query-id<TAB>corpus-id<TAB>integer score")
    qrels.setdefault(fields[0], {})[fields[1]] = int(fields[2])
  if not qrels:
    raise UserError(f"{path}: no judgements")
  return qrels


def read(folder: str, split: str = "test") -> Folder:
  """The folder's corpus, its judged queries and their qrels; UserError on a missing or malformed file."""
  root = epath.Path(folder)
  if not root.is_dir():
    raise UserError(f"--beir {folder}: no such folder")
  qrels = read_qrels(root / "qrels" / f"{split}.tsv")
  corpus = _jsonl(root / "corpus.jsonl", ("_id", "title", "text"))
  queries = {str(q["_id"]): q["text"] for q in _jsonl(root / "queries.jsonl", ("_id", "text"))}
  missing = sorted(set(qrels) - set(queries))
  if missing:
    raise UserError(f"{root / 'qrels' / f'{split}.tsv'}: query {missing[0]!r} is not in queries.jsonl")
  judged = [q for q in queries if q in qrels]
  return Folder([str(d["_id"]) for d in corpus], [(d.get("title", "") + " " + d.get("text", "")).strip()
                                                  for d in corpus],
                judged, [queries[q] for q in judged], qrels)


def run(embed: Embed, folder: Folder, depth: int) -> dict[str, dict[str, float]]:
  """{query id: {doc id: cosine}} of each query's top `depth` documents (its own id left out)."""
  scores = cosine_scores(embed(folder.queries), embed(folder.docs))
  out = {}
  for qid, row in zip(folder.query_ids, scores):
    top = np.argsort(-row, kind="stable")[:depth + 1]
    hits = {folder.doc_ids[i]: float(row[i]) for i in top if folder.doc_ids[i] != qid}
    out[qid] = dict(list(hits.items())[:depth])
  return out


def _ndcg(ranked: list[str], grades: dict[str, int], k: int) -> float:
  dcg = sum(max(grades.get(d, 0), 0) / math.log2(i + 2) for i, d in enumerate(ranked[:k]))
  ideal = sorted((g for g in grades.values() if g > 0), reverse=True)[:k]
  best = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
  return dcg / best if best > 0 else 0.0


def scores(qrels: dict[str, dict[str, int]], results: dict[str, dict[str, float]], ks: Sequence[int]
           ) -> dict[str, float]:
  """{"ndcg@k", "recall@k", "mrr@k" for each k, "queries"} of a run, as beir's EvaluateRetrieval reports them."""
  judged = [q for q in qrels if q in results]
  out: dict[str, float] = {}
  trec = {q: [d for d, _ in sorted(results[q].items(), key=lambda x: (x[1], x[0]), reverse=True)] for q in judged}
  ranked = {q: [d for d, _ in sorted(results.get(q, {}).items(), key=lambda x: x[1], reverse=True)] for q in qrels}
  for k in ks:
    out[f"ndcg@{k}"] = float(np.mean([_ndcg(trec[q], qrels[q], k) for q in judged]))
    relevant = {q: {d for d, g in qrels[q].items() if g >= 1} for q in judged}
    out[f"recall@{k}"] = float(np.mean([len(relevant[q] & set(trec[q][:k])) / len(relevant[q]) if relevant[q]
                                        else 0.0 for q in judged]))
    first = [next((1.0 / (i + 1) for i, d in enumerate(ranked[q][:k]) if qrels[q].get(d, 0) > 0), 0.0)
             for q in qrels]
    out[f"mrr@{k}"] = float(np.mean(first))
  return {**out, "queries": len(judged)}


def evaluate(embed: Embed, folder: Folder, ks: Sequence[int] = (1, 5, 10)) -> dict[str, float]:
  """nDCG, recall and MRR at each k (and at 10), and the corpus size."""
  ks = tuple(sorted(set(ks) | {10}))
  return {**scores(folder.qrels, run(embed, folder, max(ks)), ks), "corpus": len(folder.docs)}


def write_embedded(folder: str, sentences: int = 300) -> Folder:
  """A BEIR folder from the embedded STS set's dev pairs (sbert/embedded.py: corpus sentences and edited
  copies scored 0..5 by the content they keep): the sentences are the corpus (ids d0, d1, ...), each copy
  scored >= 3 a query (q0, ...) whose source sentence is graded 2 (score >= 4) or 1, and a copy of another
  sentence graded 0 (judged, not relevant)."""
  _, dev = embedded.splits(0, sentences)
  root = epath.Path(folder)
  (root / "qrels").mkdir(parents=True, exist_ok=True)
  docs = [{"_id": f"d{i}", "title": "", "text": s} for i, s in enumerate(dev.columns[0])]
  keep = [i for i, score in enumerate(dev.target) if score >= 3.0]
  queries = [{"_id": f"q{i}", "text": dev.columns[1][i]} for i in keep]
  lines = ["query-id\tcorpus-id\tscore"]
  for n, i in enumerate(keep):
    lines.append(f"q{i}\td{i}\t{2 if dev.target[i] >= 4.0 else 1}")
    lines.append(f"q{i}\td{keep[(n + 1) % len(keep)]}\t0")
  (root / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
  (root / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
  (root / "qrels" / "test.tsv").write_text("\n".join(lines) + "\n")
  return read(folder)
