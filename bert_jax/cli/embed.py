"""`bert-jax embed`, `bert-jax embed-eval` and `bert-jax search`: a sentence embedding model on files."""
from __future__ import annotations

import json
import sys


def _embedder(args, note=None):
  from bert_jax.sbert.embed import Embedder  # pylint: disable=import-outside-toplevel
  return Embedder.load(args.model, batch_size=args.batch_size, note=note)


def _embed(args):
  from bert_jax.sbert import embed  # pylint: disable=import-outside-toplevel
  embed.check_output(args.output)
  sentences = embed.read_lines(args.input, "--input")
  notes = []
  embedder = _embedder(args, notes.append)
  dimension = embed.check_dim(args.dim, embedder.dimension)
  embed.check_space(args.output, len(sentences), dimension)
  for note in notes:  # the model's notes once the last check passed: an error stays the only line
    print(note, file=sys.stderr, flush=True)
  embeddings = embedder(sentences, progress=True)[:, :dimension]
  embed.write_npy(args.output, embeddings)
  print(f"{len(sentences)} embeddings of {dimension} floats ({'+'.join(embedder.pooling.modes)} pooling"
        f"{', normalized' if embedder.pooling.normalize else ''}) to {args.output}", file=sys.stderr)


def _evaluate(args):
  from bert_jax.errors import UserError  # pylint: disable=import-outside-toplevel
  from bert_jax.sbert import data, embed, evaluate  # pylint: disable=import-outside-toplevel
  if (sum(x is not None for x in (args.sts, args.queries, args.beir)) != 1
      or (args.queries is None) != (args.corpus is None)):
    raise UserError("say one evaluation: --sts FILE, --queries FILE --corpus FILE, or --beir FOLDER")
  # Every input is read and checked before the model loads: a bad file is the only line printed.
  if args.sts:
    if not args.score_scale > 0:
      raise UserError(f"--score-scale {args.score_scale} must be > 0 (5 for STS-B's 0-5 scores)")
    pairs = evaluate.check_sts_pairs(data.read_scored_pairs(args.sts, args.score_scale), "--sts " + args.sts)
    results = evaluate.sts(_embedder(args), pairs)
  elif args.beir:
    from bert_jax.sbert import beir  # pylint: disable=import-outside-toplevel
    ks = evaluate.parse_ks(args.k)
    folder = beir.read(args.beir, args.split)
    results = beir.evaluate(_embedder(args), folder, ks)
  else:
    ks = evaluate.parse_ks(args.k)
    queries, corpus = embed.read_lines(args.queries, "--queries"), embed.read_lines(args.corpus, "--corpus")
    evaluate.check_retrieval(queries, corpus)
    results = evaluate.retrieval(_embedder(args), queries, corpus, ks)
  print(json.dumps(results, indent=1, sort_keys=True))


def _search(args):
  from bert_jax.sbert import embed, evaluate  # pylint: disable=import-outside-toplevel
  evaluate.check_top_k(args.top_k)
  corpus = embed.read_lines(args.corpus, "--corpus")
  queries = [args.query] if args.query is not None else embed.read_lines(args.queries, "--queries")
  embedder = _embedder(args)
  for query, hits in zip(queries, evaluate.search(embedder, queries, corpus, args.top_k)):
    print(json.dumps({"query": query, "hits": [{"line": i + 1, "score": s, "text": corpus[i]} for i, s in hits]},
                     ensure_ascii=False))


def _common(p) -> None:
  p.add_argument("--model", required=True, help="a bi-encoder workdir, a converted sentence-transformers "
                                                "folder, or any checkpoint (mean pooling where none is recorded)")
  p.add_argument("--batch-size", type=int, default=32, help="sentences per model call"
                 " where sentences are not packed (packed rows: about 512 tokens a call)")


def register(subparsers) -> None:
  p = subparsers.add_parser(
      "embed", help="sentence embeddings: one line of text in, one vector out, as a .npy file",
      description="Writes float32[lines, dim] to OUT.npy, row i for input line i (np.load reads it). Rows are "
                  "cut at the model's max_seq_length and run sorted by length in a few compiled length buckets.")
  _common(p)
  p.add_argument("--input", required=True, help="one sentence per line (UTF-8)")
  p.add_argument("--output", required=True, help="OUT.npy")
  p.add_argument("--dim", type=int, default=0, help="keep the first DIM floats of each embedding (a Matryoshka "
                                                    "model's shorter vectors, sentence-transformers' truncate_dim)")
  p.set_defaults(handler=_embed)

  p = subparsers.add_parser(
      "embed-eval",
      help="evaluate sentence embeddings: STS Spearman, retrieval recall@k and MRR@10, or a BEIR folder's nDCG@10",
      description="--sts FILE: sentence1<TAB>sentence2<TAB>score lines; Spearman (and Pearson) of the cosine "
                  "against the scores. --queries Q --corpus C: query line i's answer is corpus line i (further "
                  "corpus lines are distractors); recall@k and MRR@10 of cosine ranking. --beir FOLDER: a BEIR-format "
                  "folder's judged queries against its corpus; nDCG@k, MRR@k, recall@k. JSON on stdout.")
  _common(p)
  p.add_argument("--sts", help="sentence1<TAB>sentence2<TAB>score per line")
  p.add_argument("--score-scale", type=float, default=1.0, help="divides the scores (5 for STS-B's 0-5)")
  p.add_argument("--queries", help="one query per line")
  p.add_argument("--corpus", help="one document per line; line i answers query i")
  p.add_argument("--beir", help="a BEIR-format folder (corpus.jsonl, queries.jsonl, qrels/SPLIT.tsv): nDCG@k, "
                                 "MRR@k and recall@k as the beir package scores them")
  p.add_argument("--split", default="test", help="--beir's qrels/SPLIT.tsv")
  p.add_argument("--k", default="1,5,10", help="the cut-offs of recall@k (and of --beir's nDCG and MRR; 10 always)")
  p.set_defaults(handler=_evaluate)

  p = subparsers.add_parser("search", help="semantic search: a corpus's nearest lines to a query, by cosine")
  _common(p)
  p.add_argument("--corpus", required=True, help="one document per line")
  query = p.add_mutually_exclusive_group(required=True)
  query.add_argument("--query", help="one query")
  query.add_argument("--queries", help="one query per line")
  p.add_argument("--top-k", type=int, default=5)
  p.set_defaults(handler=_search)
