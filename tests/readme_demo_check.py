"""Checks a finished README demo run (`bert-jax pretrain --config configs/bert.py:demo`) against what
README.md says of it, and, given a second workdir, the fine-tuning section's run on it; `.ci/run` calls it
after README's first command and the fine-tuning command.

  python3 tests/readme_demo_check.py runs/demo [runs/demo-ft]

Checked: the corpus's size and its vocabulary's (on the Python version README names), the learning
criteria (CRITERIA: README's "the demo learns" states them), every figure of
README's sample output block (each loss within LOSS_TOLERANCE of this run's, relative, each accuracy
within ACCURACY_TOLERANCE, absolute: XLA's order of float operations moves with the CPU and the code, so
a run on another machine or commit may differ in the last digits), and the fine-tuning's dev accuracy
against README's figure (within FINETUNE_TOLERANCE). A figure that drifts further fails here, with the
lines to put in README.
"""
import json
import os
import re
import sys

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")

# README.md, "the demo learns": keep the two in step (tests/test_readme_commands.py checks README lists them).
CRITERIA = {
    "first train loss (steps 1-50) at least": 8.5,
    "last train loss (steps 1151-1200) at most": 6.3,
    "last train mlm_accuracy at least": 0.13,
    "final eval mlm_accuracy at least": 0.12,
}
LOSS_TOLERANCE = 0.02  # relative
ACCURACY_TOLERANCE = 0.02  # absolute
FINETUNE_TOLERANCE = 0.04  # absolute: 20 of the 500 dev sentences
_FIGURE = re.compile(r"(\w+) (-?[0-9.]+)$")
_FINETUNE_FIGURE = re.compile(r"gives dev accuracy\s+\*\*([0-9.]+)\*\*")
_CHANCE_FIGURE = re.compile(r"chance[^*]*\*\*([0-9.]+)\*\*")


def readme_sample() -> list[tuple[int, bool, dict[str, float]]]:
  """(step, eval, {name: figure}) of each line of README's sample output block (the fenced block whose
  lines are `step N/TOTAL | ...` and `eval at step N | ...`); its loss and accuracy figures only."""
  blocks = re.split(r"^```.*\n", open(README, encoding="utf-8").read(), flags=re.M)[1::2]  # inside the fences
  block = next(b for b in blocks if b.startswith("step "))
  rows = []
  for line in block.splitlines():
    head, *fields = line.split(" | ")
    step = re.match(r"(?:step (\d+)/\d+|eval at step (\d+))$", head)
    figures = {m.group(1): float(m.group(2)) for m in map(_FIGURE.match, fields)
               if m and m.group(1).endswith(("loss", "accuracy"))}
    rows.append((int(step.group(1) or step.group(2)), head.startswith("eval"), figures))
  return rows


def readme_finetune_figures() -> tuple[float, float]:
  """The dev accuracy README's "Fine-tuning" section gives for its command on the demo run, and chance."""
  text = open(README, encoding="utf-8").read()
  section = text[text.index("\n## Fine-tuning\n"):]
  return float(_FINETUNE_FIGURE.search(section).group(1)), float(_CHANCE_FIGURE.search(section).group(1))


def chance() -> float:
  """The embedded task's larger class's share of its dev sentences (bert_jax must be importable)."""
  from bert_jax.finetune import embedded  # pylint: disable=import-outside-toplevel
  from bert_jax.configs import glue  # pylint: disable=import-outside-toplevel
  task = glue.get_config("embedded").task
  labels = [label for *_, label in embedded.make_rows(embedded.corpus_sentences(task.num_dev), seed=1)]
  return max(labels.count(name) for name in set(labels)) / len(labels)


def check_corpus(workdir: str) -> list[str]:
  """README's corpus size (~N.N MB) and its vocabulary's, on the Python version README names (the corpus
  is that version's documentation)."""
  from bert_jax.data_pipelines import embedded  # pylint: disable=import-outside-toplevel
  text = open(README, encoding="utf-8").read()
  megabytes = float(re.search(r"~([0-9.]+) MB\)", text).group(1))
  entries, python = re.search(r"\(([0-9,]+) with Python ([0-9.]+)'s documentation\)", text).groups()
  if ".".join(map(str, sys.version_info[:2])) != python:
    print(f"skip the corpus and vocabulary sizes: README gives them for Python {python}")
    return []
  size = os.path.getsize(embedded.ensure_embedded()[0]) / 1e6
  with open(os.path.join(workdir, "vocab.txt"), encoding="utf-8") as f:
    seen = sum(1 for _ in f)
  failed = [] if round(size, 1) == megabytes else ["corpus size"]
  print(f"{'FAIL' if failed else 'ok  '} the corpus, {size:.2f} MB: README ~{megabytes} MB")
  ok = seen == int(entries.replace(",", ""))
  print(f"{'ok  ' if ok else 'FAIL'} the vocabulary, {seen} entries: README {entries} with Python {python}")
  return failed + ([] if ok else ["vocabulary size"])


def _close(name: str, documented: float, seen: float) -> bool:
  if name.endswith("accuracy"):
    return abs(seen - documented) <= ACCURACY_TOLERANCE
  return abs(seen - documented) <= LOSS_TOLERANCE * abs(documented)


def check_sample(rows: list[dict], sample) -> list[str]:
  """The sample block's figures that this run's metrics.jsonl rows do not reproduce (empty: all do)."""
  by_step = {(r["step"], bool(r.get("eval"))): r for r in rows}
  failed = []
  for step, is_eval, figures in sample:
    row = by_step.get((step, is_eval))
    for name, documented in figures.items():
      seen = None if row is None else row.get(name)
      if seen is None or not _close(name, documented, seen):
        failed.append(f"{'eval at ' if is_eval else ''}step {step} {name}: README {documented}, this run {seen}")
  return failed


def _sample_lines(rows: list[dict], sample) -> str:
  """This run's rows at the sample block's steps, in the block's layout (the lines to put in README)."""
  by_step = {(r["step"], bool(r.get("eval"))): r for r in rows}
  out = []
  for step, is_eval, _ in sample:
    row = by_step.get((step, is_eval), {})
    fields = " | ".join(f"{k} {v:.4g}" for k, v in row.items() if k.endswith(("loss", "accuracy")))
    out.append(f"eval at step {step} | {fields}" if is_eval else f"step {step}/1200 | {fields} | ...")
  return "\n".join(out)


def check_pretraining(workdir: str) -> list[str]:
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    rows = [json.loads(line) for line in f if line.strip()]
  train = [r for r in rows if not r.get("eval")]
  evals = [r for r in rows if r.get("eval")]
  seen = {
      "first train loss (steps 1-50) at least": train[0]["loss"],
      "last train loss (steps 1151-1200) at most": train[-1]["loss"],
      "last train mlm_accuracy at least": train[-1]["mlm_accuracy"],
      "final eval mlm_accuracy at least": evals[-1]["mlm_accuracy"],
  }
  failed = []
  for name, bound in CRITERIA.items():
    ok = seen[name] <= bound if name.endswith("at most") else seen[name] >= bound
    print(f"{'ok  ' if ok else 'FAIL'} {name} {bound}: {seen[name]:.4f}")
    failed += [] if ok else [name]
  if train[-1]["step"] != 1200:
    print(f"FAIL the run ended at step {train[-1]['step']}, not 1200")
    failed.append("steps")
  sample = readme_sample()
  drifted = check_sample(rows, sample)
  for line in drifted:
    print(f"FAIL README's sample output, {line}")
  if drifted:
    print("This run's lines at those steps (the speed fields elided):\n" + _sample_lines(rows, sample))
  else:
    print(f"ok   README's sample output block ({sum(len(f) for *_, f in sample)} figures)")
  return failed + drifted


def check_finetuning(workdir: str) -> list[str]:
  with open(os.path.join(workdir, "eval_results.json"), encoding="utf-8") as f:
    seen = json.load(f)["accuracy"]
  documented, documented_chance = readme_finetune_figures()
  ok = abs(seen - documented) <= FINETUNE_TOLERANCE
  print(f"{'ok  ' if ok else 'FAIL'} fine-tuning dev accuracy {seen:.4f}: README {documented} "
        f"(within {FINETUNE_TOLERANCE})")
  level = chance()
  chance_ok = round(level, 3) == documented_chance
  print(f"{'ok  ' if chance_ok else 'FAIL'} the dev set's chance level {level:.4f}: README {documented_chance}")
  return ([] if ok else ["fine-tuning"]) + ([] if chance_ok else ["chance"])


def main(pretraining: str, finetuning: str | None = None) -> int:
  failed = check_pretraining(pretraining) + check_corpus(pretraining)
  if finetuning:
    failed += check_finetuning(finetuning)
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main(*sys.argv[1:3]))
