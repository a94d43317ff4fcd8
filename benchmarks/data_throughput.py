"""Input pipeline throughput: examples per CPU-second, from raw text and from prepared records, seq 128 and 512.

  python benchmarks/data_throughput.py --batches 30

Uses the embedded corpus (or --corpus) with the WordPiece vocab; "per core" divides examples by the
process's CPU time (user + system over all its threads), so idle waiting does not count. Real tokens
per CPU second is the fair figure across corpora: short documents give short (padded) rows.
"""
import argparse
import os
import tempfile
import time

from configs import common
from data_pipelines import embedded, prepare
from data_pipelines.pipeline import make_pretrain_input


def measure(data_cfg, batches: int, batch_size: int) -> tuple[float, float, float]:
  """(examples per wall second, examples per CPU second, real tokens per CPU second) after a warm-up batch."""
  data = make_pretrain_input(data_cfg, global_batch_size=batch_size, process_index=0, process_count=1, seed=0)
  next(data)
  wall, cpu = time.perf_counter(), time.process_time()
  tokens = sum(int(next(data)["input_mask"].sum()) for _ in range(batches))
  wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
  return batches * batch_size / wall, batches * batch_size / cpu, tokens / cpu


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--corpus", default="")
  parser.add_argument("--batches", type=int, default=30)
  parser.add_argument("--batch-size", type=int, default=64)
  args = parser.parse_args()
  corpus, vocab = (args.corpus, "") if args.corpus else embedded.ensure_embedded()
  with tempfile.TemporaryDirectory() as records:
    prepare.prepare(corpus, records, vocab)
    print("source    seq  masking  examples/s (wall)  examples/s per CPU core  real tokens/s per core")
    for source in ("raw", "prepared"):
      for seq, predictions in ((128, 20), (512, 76)):
        for masking in ("token", "span"):
          cfg = common.data_config(
              corpus=corpus if source == "raw" else "", vocab=vocab, max_seq_length=seq,
              max_predictions_per_seq=predictions, masking=masking,
              prepared=os.path.join(records, "*.tfrecord") if source == "prepared" else "")
          wall, per_core, tokens = measure(cfg, args.batches, args.batch_size)
          print(f"{source:9s} {seq:4d} {masking:8s} {wall:17.0f} {per_core:24.0f} {tokens:23.0f}", flush=True)


if __name__ == "__main__":
  main()
