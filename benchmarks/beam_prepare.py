"""`bert-jax data prepare`: the in-process path against Apache Beam's DirectRunner (1 and 2 workers), alternating.

  python benchmarks/beam_prepare.py --copies 4 --rounds 3

The corpus is the embedded one written `--copies` times under different file names (so both paths
have that many files to spread; the copies share their words, so the tokenizer's word cache makes
copies after the first cheaper than new text would be). Each case is the whole command in a fresh
process (start-up included, as a user runs it); wall time, and CPU time (user + system of the command
and every process it waited for: the in-process path's pool, DirectRunner's workers). Documents and
real tokens (the records' token ids) are counted once from the output, the same bytes in every case
(checked).
Prints one JSON line per case with medians over the rounds, then the machine's load average.
"""
import argparse
import glob
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASES = {"in-process, 1 process": ["--workers", "1"], "in-process, 2 processes": ["--workers", "2"],
         "DirectRunner, 1 worker": ["--runner", "DirectRunner", "--workers", "1"],
         "DirectRunner, 2 workers": ["--runner", "DirectRunner", "--workers", "2"]}


def _run(corpus: str, out: str, extra: list[str]) -> tuple[float, float]:
  """(wall seconds, CPU seconds) of one `bert-jax data prepare` into `out`."""
  before = resource.getrusage(resource.RUSAGE_CHILDREN)
  start = time.perf_counter()
  subprocess.run([sys.executable, "-m", "bert_jax.cli", "data", "prepare", "--corpus", corpus, "--output", out,
                  *extra], check=True, capture_output=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})
  wall = time.perf_counter() - start
  after = resource.getrusage(resource.RUSAGE_CHILDREN)
  return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _count(out: str) -> tuple[int, int, bytes]:
  """(documents, real tokens, all the output's bytes) of a prepared folder."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  files = sorted(glob.glob(os.path.join(out, "*.tfrecord")))
  records = [tf.train.Example.FromString(r.numpy()) for f in files for r in tf.data.TFRecordDataset(f)]
  tokens = sum(len(r.features.feature["ids"].int64_list.value) for r in records)
  return len(records), tokens, b"".join(open(p, "rb").read() for p in files + [os.path.join(out, "metadata.json")])


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--copies", type=int, default=4)
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--cases", default=";".join(CASES), help="; separated, among " + "; ".join(CASES))
  args = parser.parse_args()
  cases = {name: CASES[name] for name in args.cases.split(";")}
  sys.path.insert(0, ROOT)
  from bert_jax.data_pipelines import embedded  # pylint: disable=import-outside-toplevel
  source = embedded.ensure_embedded()[0]
  times = {name: [] for name in cases}
  with tempfile.TemporaryDirectory() as tmp:
    for i in range(args.copies):
      shutil.copy(source, os.path.join(tmp, f"corpus-{i}.txt"))
    corpus, reference = os.path.join(tmp, "corpus-*.txt"), None
    for r in range(args.rounds):
      names = list(cases) if r % 2 == 0 else list(reversed(cases))  # alternate the order between rounds
      for name in names:
        out = os.path.join(tmp, f"out-{r}-{len(times[name])}-{name.split(',')[0].replace(' ', '')}")
        times[name].append(_run(corpus, out, cases[name]))
        counted = _count(out)
        reference = reference or counted
        assert counted == reference, f"{name}: not the same output"
        shutil.rmtree(out)
  documents, tokens, _ = reference
  for name, runs in times.items():
    wall, cpu = statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs)
    print(json.dumps({"case": name, "documents": documents, "real_tokens": tokens, "wall_s": round(wall, 2),
                      "cpu_s": round(cpu, 2), "documents_per_s": round(documents / wall),
                      "real_tokens_per_s": round(tokens / wall), "real_tokens_per_cpu_s": round(tokens / cpu),
                      "walls": [round(w, 1) for w, _ in runs]}), flush=True)
  print(json.dumps({"load_average": os.getloadavg(), "cpus": os.cpu_count()}))


if __name__ == "__main__":
  main()
