"""Inference speed of a head-pruned model against the unpruned one (Michel et al. 2019's speed-up).

  python benchmarks/prune_speed.py --config configs/bert.py:base --fractions 0.3 0.5 --batch-size 8 \\
      --seq-length 128 --rounds 5

Random weights (speed does not depend on them); the same share of heads pruned in every layer, as
`bert-jax prune --fraction` would on average. Every variant is an unrolled encoder (pruned ones must be),
jitted once; the rounds alternate the variants so all see the same machine load. Reported: median
seconds per forward pass and the speed-up against the unpruned model.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.config_utils import load_config
from bert_jax.models.bert import BertModel
from bert_jax.models.config import ModelConfig
from bert_jax.training import prune


def variant(config: ModelConfig, params, fraction: float, batch):
  heads = int(round(fraction * config.num_heads))
  if heads:
    params, config = prune.prune_params(params, config, {i: list(range(heads)) for i in range(config.num_layers)})
  forward = jax.jit(lambda p, ids: BertModel(config).apply({"params": p}, ids).last_hidden_state)
  forward(params, batch).block_until_ready()
  return lambda: forward(params, batch).block_until_ready()


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--config", default="configs/bert.py:base")
  p.add_argument("--fractions", type=float, nargs="+", default=[0.3, 0.5])
  p.add_argument("--batch-size", type=int, default=8)
  p.add_argument("--seq-length", type=int, default=128)
  p.add_argument("--rounds", type=int, default=5)
  p.add_argument("--steps", type=int, default=3)
  args = p.parse_args()
  config = ModelConfig.from_dict(load_config(args.config).model.to_dict()).replace(
      scan_layers=False, mlm_head=False, sentence_head="none", use_pooler=False)
  batch = jnp.ones((args.batch_size, args.seq_length), jnp.int32)
  params = nn.meta.unbox(jax.jit(BertModel(config).init)(jax.random.key(0), batch)["params"])
  runs = {f: variant(config, params, f, batch) for f in [0.0, *args.fractions]}
  times = {f: [] for f in runs}
  for r in range(args.rounds):
    for f in (list(runs) if r % 2 == 0 else list(runs)[::-1]):
      start = time.perf_counter()
      for _ in range(args.steps):
        runs[f]()
      times[f].append((time.perf_counter() - start) / args.steps)
  base = statistics.median(times[0.0])
  print(json.dumps({str(f): {"seconds": statistics.median(t), "speedup": base / statistics.median(t)}
                    for f, t in times.items()}))


if __name__ == "__main__":
  main()
