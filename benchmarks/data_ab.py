"""Input pipeline A/B: real tokens per CPU second and per wall second of two code trees, alternating processes.

  git worktree add /tmp/old <commit>
  python benchmarks/data_ab.py --tree old=/tmp/old --tree new=. --rounds 3 [--cpus 0 --cpus 0,1]

Each measurement is a fresh process (`taskset -c CPUS` when --cpus is given) that builds the input for
one (source, seq, masking) on the embedded corpus (raw text; `prepared`: tokenized documents of
`bert-jax data prepare`; `rows`: rows of `bert-jax data prepare --format bert_tfrecord`, read by
data.format=bert_tfrecord, for trees that have it; both written by the last --tree), reads 2 warm-up
batches and then --batches batches of --batch-size rows. Medians over the rounds; "n/a" where a tree
cannot read a source.
"""
import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile

_MAX_PREDICTIONS = {128: 20, 512: 76}
# An editable install maps bert_jax's symlinked subpackages (data_pipelines, configs) to its own checkout
# whatever PYTHONPATH says; dropping its finder (and running in the tree: `-c` puts the working directory
# first on sys.path) makes every import come from the tree measured.
_ISOLATE = "import sys; sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f).lower()]\n"
_SNIPPET = _ISOLATE + r"""
import inspect, json, sys, time
from bert_jax.configs import common
from bert_jax.data_pipelines import embedded
from bert_jax.data_pipelines.pipeline import make_pretrain_input
source, seq, masking, records, batches, predictions, batch_size = sys.argv[1:]
corpus, vocab = embedded.ensure_embedded()
cfg = common.data_config(corpus=corpus if source == "raw" else "", vocab=vocab, max_seq_length=int(seq),
                         max_predictions_per_seq=int(predictions), masking=masking,
                         prepared=records + "/docs/*.tfrecord" if source == "prepared" else "")
records = records.rsplit("/", 1)[0]  # rows are shared, written by the last tree
if source == "rows":
  cfg.update(format="bert_tfrecord", corpus=f"{records}/rows{seq}/*.tfrecord")
kw = {"seed": 0} if "seed" in inspect.signature(make_pretrain_input).parameters else {}
data = make_pretrain_input(cfg, global_batch_size=int(batch_size), process_index=0, process_count=1, **kw)
for _ in range(2):
  next(data)
wall, cpu = time.perf_counter(), time.process_time()
tokens = sum(int(next(data)["input_mask"].sum()) for _ in range(int(batches)))
wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
data.close()
print(json.dumps({"tokens_per_sec": tokens / wall, "tokens_per_cpu_sec": tokens / cpu}))
"""


def _run(tree, cpus, args):
  env = dict(os.environ, PYTHONPATH=os.path.abspath(tree), TF_CPP_MIN_LOG_LEVEL="3")
  command = (["taskset", "-c", cpus] if cpus else []) + [sys.executable, "-c", _SNIPPET, *args]
  out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900, cwd=os.path.abspath(tree))
  if out.returncode and args[0] == "rows":
    return None  # a tree without data.format=bert_tfrecord
  if out.returncode:
    raise RuntimeError(f"{tree} {args}: {out.stderr.strip()[-2000:]}")
  return json.loads(out.stdout.strip().splitlines()[-1])


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--tree", action="append", required=True, help="NAME=PATH of a bert_jax checkout")
  parser.add_argument("--cpus", action="append", default=[], help="taskset CPU list; repeat to compare")
  parser.add_argument("--sources", default="raw,prepared")
  parser.add_argument("--seq", default="128,512")
  parser.add_argument("--masking", default="token,span")
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--batches", type=int, default=30)
  parser.add_argument("--batch-size", type=int, default=64)
  args = parser.parse_args()
  trees = dict(t.split("=", 1) for t in args.tree)
  with tempfile.TemporaryDirectory() as records:
    last = os.path.abspath(list(trees.values())[-1])
    env = dict(os.environ, PYTHONPATH=last, TF_CPP_MIN_LOG_LEVEL="3")
    cli = [sys.executable, "-c", _ISOLATE + "from bert_jax.cli import main; sys.exit(main(sys.argv[1:]))",
           "data", "prepare", "--workers", "1"]
    for name, tree in trees.items():  # each tree's own documents: its embedded vocabulary may differ
      tree = os.path.abspath(tree)
      subprocess.run(cli + ["--output", f"{records}/{name}/docs"], env=dict(env, PYTHONPATH=tree), check=True,
                     capture_output=True, cwd=tree)
    if "rows" in args.sources:
      for seq in map(int, args.seq.split(",")):
        subprocess.run(cli + ["--format", "bert_tfrecord", "--config", "configs/bert.py:demo", "--output",
                              f"{records}/rows{seq}", f"--config.data.max_seq_length={seq}",
                              f"--config.data.max_predictions_per_seq={_MAX_PREDICTIONS[seq]}",
                              "--config.model.max_position_embeddings=512"],
                       env=env, check=True, capture_output=True, cwd=last)
    print("source    seq  masking  tree  cpus   real tokens/s (wall)  real tokens/s per CPU s")
    for source, seq, masking in itertools.product(args.sources.split(","), map(int, args.seq.split(",")),
                                                  args.masking.split(",")):
      runs = {(name, cpus): [] for name in trees for cpus in (args.cpus or [""])}
      for _ in range(args.rounds):
        for name, cpus in runs:
          runs[(name, cpus)].append(_run(trees[name], cpus, [source, str(seq), masking, f"{records}/{name}",
                                                             str(args.batches), str(_MAX_PREDICTIONS[seq]),
                                                             str(args.batch_size)]))
      for (name, cpus), results in runs.items():
        if None in results:
          print(f"{source:9s} {seq:4d} {masking:8s} {name:5s} {cpus or 'all':6s} {'n/a':>20s} {'n/a':>24s}", flush=True)
          continue
        wall = statistics.median(r["tokens_per_sec"] for r in results)
        per_cpu = statistics.median(r["tokens_per_cpu_sec"] for r in results)
        print(f"{source:9s} {seq:4d} {masking:8s} {name:5s} {cpus or 'all':6s} {wall:20,.0f} {per_cpu:24,.0f}",
              flush=True)


if __name__ == "__main__":
  main()
