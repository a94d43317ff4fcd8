"""Where text input's CPU goes: per-thread CPU time of the main process and its `data.num_workers` workers
(/proc/PID/task/*/stat, status) over a window of batches, with the whole machine's busy time beside it (other
load on a 2-core VM changes the CPU a token costs; `others` says how much ran beside the window).

  taskset -c 0,1 python benchmarks/data_threads.py --batches 400 [--seq 128 --masking token] [--config.x=y ...]

The embedded corpus, batch 256, data.num_workers=-1 (one worker per core taskset leaves), as data_scaling.py.
Linux only. Columns: user and sys seconds, minor page faults, voluntary and involuntary context switches.
"""
import argparse
import multiprocessing
import os
import time

from bert_jax.config_utils import load_config
from bert_jax.data_pipelines import pipeline

_TICK = os.sysconf("SC_CLK_TCK")
_PREDICTIONS = {128: 20, 512: 80}
_FIELDS = ("user", "sys", "minflt", "vcs", "ncs")


def _threads() -> dict:
  """(process tag, tid) -> comm and counters, for this process and its live children."""
  out = {}
  procs = [("main", os.getpid())] + [(f"w{i}", c.pid) for i, c in
                                     enumerate(sorted(multiprocessing.active_children(), key=lambda c: c.name))]
  for tag, pid in procs:
    for tid in os.listdir(f"/proc/{pid}/task"):
      try:
        with open(f"/proc/{pid}/task/{tid}/stat", encoding="ascii") as f:
          stat = f.read()
        with open(f"/proc/{pid}/task/{tid}/status", encoding="ascii") as f:
          status = dict(line.split(":\t", 1) for line in f.read().splitlines() if ":\t" in line)
      except OSError:
        continue
      fields = stat.rsplit(")", 1)[1].split()
      out[(tag, int(tid))] = {"comm": stat[stat.index("(") + 1:stat.rindex(")")],
                              "user": int(fields[11]) / _TICK, "sys": int(fields[12]) / _TICK,
                              "minflt": int(fields[7]), "vcs": int(status["voluntary_ctxt_switches"]),
                              "ncs": int(status["nonvoluntary_ctxt_switches"])}
  return out


def _busy() -> float:
  """Seconds all CPUs spent busy (user, nice, system, irq, softirq) since boot."""
  with open("/proc/stat", encoding="ascii") as f:
    v = [int(x) for x in f.readline().split()[1:]]
  return (v[0] + v[1] + v[2] + v[5] + v[6]) / _TICK


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batches", type=int, default=400)
  parser.add_argument("--seq", type=int, default=128, choices=sorted(_PREDICTIONS))
  parser.add_argument("--masking", default="token")
  args, overrides = parser.parse_known_args()
  config = load_config("configs/bert.py:demo", [
      f"--config.data.max_seq_length={args.seq}", f"--config.data.max_predictions_per_seq={_PREDICTIONS[args.seq]}",
      "--config.model.max_position_embeddings=512", f"--config.data.masking={args.masking}",
      "--config.train.batch_size=256", "--config.data.num_workers=-1", *overrides])
  data = pipeline.for_config(config, "train", config.train.batch_size)
  try:
    for _ in range(3):
      next(data)
    before, busy, wall = _threads(), _busy(), time.perf_counter()
    tokens = sum(int(next(data)["input_mask"].sum()) for _ in range(args.batches))
    wall, busy, after = time.perf_counter() - wall, _busy() - busy, _threads()
  finally:
    data.close()
  rows = []
  for key, now in after.items():
    then = before.get(key, dict.fromkeys(_FIELDS, 0))
    delta = {f: now[f] - then[f] for f in _FIELDS}
    if delta["user"] + delta["sys"] > 0:
      rows.append((key[0], now["comm"], delta))
  cpu = sum(d["user"] + d["sys"] for _, _, d in rows)
  print(f"cores {len(os.sched_getaffinity(0))}: {args.batches} batches in {wall:.2f} s, {tokens / wall / 1e3:,.0f}k "
        f"real tokens/s, {cpu:.2f} CPU s ({tokens / cpu / 1e3:,.0f}k per CPU s); others busy {busy - cpu:.2f} s")
  for tag, comm, d in sorted(rows, key=lambda r: (r[0], -r[2]["user"] - r[2]["sys"])):
    print(f"  {tag:5s}{comm:16s} user {d['user']:6.2f} sys {d['sys']:5.2f} minflt {d['minflt']:6d} "
          f"vcs {d['vcs']:6d} ncs {d['ncs']:6d}")


if __name__ == "__main__":
  main()
