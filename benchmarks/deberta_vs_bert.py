"""DeBERTa-v3's train step against BERT's of the same size on this machine's CPU (BENCHMARKS.md "DeBERTa-v3").

Both models: `--layers` layers, hidden `--hidden` (64-wide heads, FFN 4H), an 8,192-entry vocabulary, rows of `--seq`
tokens, batch `--batch`, BERT's MLM objective (15% of the tokens predicted, no NSP; BERT runs its last layer at the
masked positions only, as its pretraining step does). DeBERTa has v3's attention: c2p and p2c terms over 256
log buckets, shared keys, LayerNorm'd relative embeddings, no absolute positions. Also timed: DeBERTa's own
pretraining step (deberta_rtd: a generator of half the depth, RTD over every token, GDES), for reference.

Each round builds nothing: the compiled steps are built once, then every round times `--steps` steps of each model in
turn on one synthetic batch, alternating, so that a change of the machine's load falls on all of them. Prints one
JSON object: per model its seconds per step in each round and their median, and the median of the per-round ratios
to BERT's.

  python benchmarks/deberta_vs_bert.py --rounds 5 --steps 5
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time


def _setup(preset: str, overrides: list[str]):
  import jax  # pylint: disable=import-outside-toplevel
  from bert_jax.training import benchmark, partitioning, trainer  # pylint: disable=import-outside-toplevel
  from bert_jax.training.step import build_train_setup  # pylint: disable=import-outside-toplevel
  config = trainer.load_run_config(preset, overrides)
  setup = build_train_setup(config)
  state = setup.init_state(jax.random.key(0))
  batch = partitioning.global_batch(benchmark.synthetic_batch(
      config.train.batch_size, config.data.max_seq_length, config.data.max_predictions_per_seq,
      config.model.vocab_size), setup.mesh)
  return setup.train_step, state, batch


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--steps", type=int, default=5)
  parser.add_argument("--layers", type=int, default=4)
  parser.add_argument("--hidden", type=int, default=256)
  parser.add_argument("--seq", type=int, default=128)
  parser.add_argument("--batch", type=int, default=16)
  args = parser.parse_args()
  root = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir)
  os.chdir(root)  # configs/ are relative
  sys.path.insert(0, os.path.abspath(root))  # this checkout's bert_jax, not an installed one
  import jax  # pylint: disable=import-outside-toplevel
  size = [f"--config.model.num_layers={args.layers}", f"--config.model.hidden_size={args.hidden}",
          f"--config.model.num_heads={args.hidden // 64}", f"--config.model.intermediate_size={4 * args.hidden}",
          "--config.model.vocab_size=8192", f"--config.train.batch_size={args.batch}",
          f"--config.data.max_seq_length={args.seq}", f"--config.data.max_predictions_per_seq={int(0.15 * args.seq)}",
          "--config.train.num_steps=1000"]
  deberta = [*size, "--config.model.position_buckets=256", "--config.model.max_position_embeddings=512"]
  models = {
      "bert": ("configs/bert.py:tiny", [*size, "--config.model.sentence_head=none", "--config.model.use_pooler=false",
                                        "--config.model.hidden_dropout=0.1"]),
      # The plain network against BERT's: MLM without the enhanced mask decoder (Hugging Face's layout).
      "deberta": ("configs/deberta.py:tiny", [*deberta, "--config.objective=bert", "--config.model.mlm_head=true",
                                              "--config.model.rtd_head=false", "--config.model.emd_steps=0"]),
      "deberta_rtd": ("configs/deberta.py:tiny", deberta),
  }
  steps = {}
  for name, (preset, overrides) in models.items():
    step, state, batch = _setup(preset, overrides)
    state, metrics = step(state, batch, jax.random.key(1))  # compile
    jax.block_until_ready(metrics)
    steps[name] = [step, state, batch]
    print(f"compiled {name}", file=sys.stderr, flush=True)
  seconds: dict[str, list[float]] = {name: [] for name in models}
  for r in range(args.rounds):
    for name, held in steps.items():
      step, state, batch = held
      start = time.perf_counter()
      for _ in range(args.steps):
        state, metrics = step(state, batch, jax.random.key(1))
      jax.block_until_ready(metrics)
      held[1] = state
      seconds[name].append((time.perf_counter() - start) / args.steps)
      print(f"round {r + 1}: {name} {seconds[name][-1]:.3f} s/step", file=sys.stderr, flush=True)
  base = seconds["bert"]
  report = {name: {"seconds_per_step": [round(x, 4) for x in xs], "median": round(statistics.median(xs), 4),
                   "ratio_to_bert": round(statistics.median(x / b for x, b in zip(xs, base)), 3)}
            for name, xs in seconds.items()}
  report["settings"] = vars(args)
  report["load_average"] = os.getloadavg()[0]
  print(json.dumps(report, indent=1))


if __name__ == "__main__":
  main()
