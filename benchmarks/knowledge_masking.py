"""Knowledge masking (ERNIE 1.0) on the embedded corpus: its units' statistics, and its text-pipeline speed
against whole-word masking, in one run.

  PYTHONPATH=. python benchmarks/knowledge_masking.py --batches 200 --rounds 3

Statistics (offline annotator: runs of capitalised words) over --stat-batches batches: every unit of the
rows (a tagged phrase or entity span, else a whole word) and the units the masking chose, with their mean
length in tokens and the share of entity and phrase units. Speed: real tokens per wall second of the
in-process text pipeline (data.num_workers=0: rows on one thread, masking on another), and per CPU second
of the process (steadier on a shared machine), whole-word and
knowledge masking alternating, --rounds times each, after 3 warm-up batches; medians and their ratio.
"""
import argparse
import json
import statistics
import time

import numpy as np

from bert_jax.configs import common
from bert_jax.data_pipelines import embedded
from bert_jax.data_pipelines.pipeline import make_pretrain_input


def _cfg(masking, seq):
  corpus, vocab = embedded.ensure_embedded()
  return common.data_config(corpus=corpus, vocab=vocab, masking=masking, max_seq_length=seq,
                            max_predictions_per_seq=20 if seq <= 128 else 76)


def _units(ids, tags, length, continuation, special):
  """(start, end, level) of every unit of one row (knowledge.py's tags; whole words elsewhere)."""
  units = []
  for i in range(length):
    if special[ids[i]]:
      continue
    tag, previous = tags[i], tags[i - 1]
    joins = (tag and tag % 2 == 0) or (not tag and not previous and continuation[ids[i]])
    if joins and units and units[-1][1] == i:
      units[-1][1] = i + 1
    else:
      units.append([i, i + 1, (tag + 1) // 2])
  return units


def unit_statistics(batches: int, batch_size: int, seq: int) -> dict:
  data = make_pretrain_input(_cfg("knowledge", seq), global_batch_size=batch_size, process_index=0, process_count=1)
  continuation, special = data.tokenizer.continuation_mask(), data.tokenizer.special_mask()
  every, chosen = [], []
  try:
    for _ in range(batches):
      b = next(data)
      ids = b["input_ids"].copy()
      for r in range(len(ids)):
        w = b["masked_lm_weights"][r] > 0
        ids[r, b["masked_lm_positions"][r][w]] = b["masked_lm_ids"][r][w]
        predicted = set(b["masked_lm_positions"][r][w].tolist())
        for start, end, level in _units(ids[r], b["knowledge_units"][r], int(b["input_mask"][r].sum()),
                                        continuation, special):
          every.append((end - start, level))
          if start in predicted:
            chosen.append((end - start, level))
  finally:
    data.close()

  def summary(units):
    sizes, levels = np.array([s for s, _ in units]), np.array([lv for _, lv in units])
    return {"units": len(units), "mean_tokens": float(sizes.mean()),
            "entity_share": float(np.mean(levels == 2)), "phrase_share": float(np.mean(levels == 1)),
            "mean_tokens_entity": float(sizes[levels == 2].mean()) if (levels == 2).any() else None,
            "mean_tokens_word": float(sizes[levels == 0].mean())}
  return {"all_units": summary(every), "chosen_units": summary(chosen)}


def tokens_per_sec(masking: str, batches: int, batch_size: int, seq: int) -> tuple[float, float]:
  """(real tokens per wall second, per CPU second of this process, all threads)."""
  data = make_pretrain_input(_cfg(masking, seq), global_batch_size=batch_size, process_index=0, process_count=1)
  try:
    for _ in range(3):
      next(data)
    wall, cpu = time.perf_counter(), time.process_time()
    tokens = sum(int(next(data)["input_mask"].sum()) for _ in range(batches))
    return tokens / (time.perf_counter() - wall), tokens / (time.process_time() - cpu)
  finally:
    data.close()


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batches", type=int, default=200)
  parser.add_argument("--stat-batches", type=int, default=50)
  parser.add_argument("--batch-size", type=int, default=64)
  parser.add_argument("--seq", type=int, default=128)
  parser.add_argument("--rounds", type=int, default=3)
  args = parser.parse_args()
  result = {"statistics": unit_statistics(args.stat_batches, args.batch_size, args.seq)}
  speeds = {"whole_word": [], "knowledge": []}
  for _ in range(args.rounds):
    for masking in speeds:
      speeds[masking].append(tokens_per_sec(masking, args.batches, args.batch_size, args.seq))
  for i, unit in enumerate(("real_tokens_per_sec", "real_tokens_per_cpu_sec")):
    medians = {m: statistics.median(x[i] for x in v) for m, v in speeds.items()}
    result[unit] = {m: {"median": round(medians[m]), "runs": [round(x[i]) for x in v]} for m, v in speeds.items()}
    result[unit]["knowledge_over_whole_word"] = medians["knowledge"] / medians["whole_word"]
  print(json.dumps(result, indent=1))


if __name__ == "__main__":
  main()
