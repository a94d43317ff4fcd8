"""Input pipeline throughput: examples per second and per CPU-second, from raw text and prepared records.

  python benchmarks/data_throughput.py --batches 30
  python benchmarks/data_throughput.py --batches 200 --workers 0,1,2 --seq 128 --masking token

Uses the embedded corpus (or --corpus) with the WordPiece vocab. CPU time is user + system over all
threads of the main process and of its data workers (`data.num_workers`), so idle waiting does not
count: "per CPU s" is the cost of an example whatever the parallelism, "per worker" is the wall rate
divided by the processes building examples (the main one when there are no workers). Real tokens per
CPU second is the fair figure across corpora: short documents give short (padded) rows.
"""
import argparse
import multiprocessing
import os
import tempfile
import time

import psutil

from bert_jax.configs import common
from bert_jax.data_pipelines import embedded, prepare
from bert_jax.data_pipelines.pipeline import make_pretrain_input

MAX_PREDICTIONS = {128: 20, 512: 76}  # per sequence length, as in the earlier measurements


def _cpu_seconds(processes) -> float:
  return sum(sum(p.cpu_times()[:2]) for p in processes)


def measure(data_cfg, batches: int, batch_size: int) -> tuple[float, float, float]:
  """(examples per wall second, per CPU second, real tokens per CPU second) after a warm-up batch."""
  data = make_pretrain_input(data_cfg, global_batch_size=batch_size, process_index=0, process_count=1)
  try:
    next(data)  # starts the workers, if any
    processes = [psutil.Process()] + [psutil.Process(c.pid) for c in multiprocessing.active_children()]
    wall, cpu = time.perf_counter(), _cpu_seconds(processes)
    tokens = sum(int(next(data)["input_mask"].sum()) for _ in range(batches))
    wall, cpu = time.perf_counter() - wall, _cpu_seconds(processes) - cpu
  finally:
    data.close()
  return batches * batch_size / wall, batches * batch_size / cpu, tokens / cpu


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--corpus", default="")
  parser.add_argument("--batches", type=int, default=30)
  parser.add_argument("--batch-size", type=int, default=64)
  parser.add_argument("--sources", default="raw,prepared")
  parser.add_argument("--seq", default="128,512", help=f"sequence lengths among {sorted(MAX_PREDICTIONS)}")
  parser.add_argument("--masking", default="token,span")
  parser.add_argument("--workers", default="0", help="data.num_workers values, e.g. 0,1,2")
  args = parser.parse_args()
  corpus, vocab = (args.corpus, "") if args.corpus else embedded.ensure_embedded()
  with tempfile.TemporaryDirectory() as records:
    prepare.prepare(corpus, records, vocab)
    print("source    seq  masking  workers  examples/s (wall)  per worker  examples/s per CPU s  "
          "real tokens/s per CPU s")
    for source in args.sources.split(","):
      for seq in map(int, args.seq.split(",")):
        for masking in args.masking.split(","):
          for workers in map(int, args.workers.split(",")):
            cfg = common.data_config(
                corpus=corpus if source == "raw" else "", vocab=vocab, max_seq_length=seq,
                max_predictions_per_seq=MAX_PREDICTIONS[seq], masking=masking, num_workers=workers,
                prepared=os.path.join(records, "*.tfrecord") if source == "prepared" else "")
            wall, per_cpu, tokens = measure(cfg, args.batches, args.batch_size)
            print(f"{source:9s} {seq:4d} {masking:8s} {workers:7d} {wall:18.0f} {wall / max(workers, 1):11.0f} "
                  f"{per_cpu:21.0f} {tokens:24.0f}", flush=True)


if __name__ == "__main__":
  main()
