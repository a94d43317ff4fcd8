"""Dev-set prediction time of fine-tuning workdirs (float or `bert-jax quantize`'s int8), for the
compression table's speedup column (BENCHMARKS.md "Compression").

  python benchmarks/compress_speed.py runs/demo-ft runs/demo-general-ft runs/demo-general-int8

Each model predicts the task's first dev set through `bert-jax predict`'s Predictor (as `quantize`
times it) after a warm-up call that compiles; the models take turns for --rounds rounds, so all see
about the same machine load. Printed: the median seconds per pass and the speedup against the first.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import ml_collections

import bert_jax
from bert_jax import params_checkpoint, workdir as workdir_lib
from bert_jax.finetune import predict
from bert_jax.finetune.task_registry import build_task


def _predictor(model: str, batch_size: int):
  config = workdir_lib.read_config(model)
  params, _ = params_checkpoint.load_params(model)
  tokenizer = bert_jax.load_tokenizer(model)
  runner = predict.Predictor.build(config, jax.device_get(params), tokenizer, batch_size, model)
  features = build_task(ml_collections.ConfigDict(config), tokenizer, need_train=False).evals[0].features
  runner.run({k: v[:1] for k, v in features.items()})  # compiles
  return runner, features


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("models", nargs="+")
  parser.add_argument("--rounds", type=int, default=7)
  parser.add_argument("--batch-size", type=int, default=0, help="0: the run's eval batch")
  args = parser.parse_args()
  print(json.dumps(measure(args.models, args.rounds, args.batch_size), indent=1))


def measure(models: list[str], rounds: int = 7, batch_size: int = 0) -> dict:
  """{model: {"seconds": median seconds per dev pass, "speedup": against the first model}}."""
  runners = [_predictor(m, batch_size) for m in models]
  seconds: list[list[float]] = [[] for _ in runners]
  for r in range(rounds):
    order = range(len(runners)) if r % 2 == 0 else reversed(range(len(runners)))
    for i in order:
      runner, features = runners[i]
      start = time.perf_counter()
      runner.run(features)
      seconds[i].append(time.perf_counter() - start)
  medians = [statistics.median(s) for s in seconds]
  return {m: {"seconds": round(t, 4), "speedup": round(medians[0] / t, 2)} for m, t in zip(models, medians)}


if __name__ == "__main__":
  main()
