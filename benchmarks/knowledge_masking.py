"""Knowledge masking (ERNIE 1.0) on the embedded corpus: its units' statistics, and its text-pipeline speed
against whole-word masking, in one run.

  PYTHONPATH=. python benchmarks/knowledge_masking.py --batches 50 --rounds 12 [--spacy-pipeline PATH]

Statistics (offline annotator: runs of capitalised words) over --stat-batches batches: every unit of the
rows (a tagged phrase or entity span, else a whole word) and the units the masking chose, with their mean
length in tokens and the share of entity and phrase units. Speed: real tokens per wall second and per CPU
second (steadier on a shared machine) of the text pipeline's work (rows of every shard, tokenized and
annotated, then masked; on one thread), whole-word and knowledge masking in chunks of --batches batches
that alternate, --rounds chunks each, after 3 warm-up batches; rates over all chunks and their ratio. And
`data prepare`'s documents per second without spans, with the offline annotator and with a spaCy pipeline.
"""
import argparse
import json
import os
import statistics
import tempfile
import time

import numpy as np

from bert_jax.configs import common
from bert_jax.data_pipelines import embedded, prepare
from bert_jax.data_pipelines.features import Featurizer
from bert_jax.data_pipelines.pipeline import make_pretrain_input
from bert_jax.data_pipelines.shards import make_context, shard_batches


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


def _stream(masking: str, batch_size: int, seq: int):
  """The text pipeline's work for one config, on this thread: rows of its shards, masked (pipeline.py's
  stages without their threads, so the CPU time of a chunk is that chunk's work alone)."""
  cfg = _cfg(masking, seq)
  ctx = make_context(cfg, "train", None, None)
  featurize = Featurizer(ctx.masking, ctx.seeds, ctx.spec, ctx.max_seq_length)
  shards = range(cfg.num_shards)
  for _, rows, _ in shard_batches(ctx, shards, {s: None for s in shards}, batch_size // cfg.num_shards):
    yield int(featurize(rows)["input_mask"].sum())


def speeds(batches: int, batch_size: int, seq: int, rounds: int) -> dict:
  """Real tokens per wall and per CPU second of whole-word and knowledge masking, in chunks of `batches`
  batches that alternate between the two streams (both warm), `rounds` chunks each."""
  streams = {m: _stream(m, batch_size, seq) for m in ("whole_word", "knowledge")}
  for stream in streams.values():
    for _ in range(3):
      next(stream)
  runs = {m: [] for m in streams}  # (tokens, wall seconds, CPU seconds) per chunk
  for _ in range(rounds):
    for masking, stream in streams.items():
      wall, cpu = time.perf_counter(), time.process_time()
      tokens = sum(next(stream) for _ in range(batches))
      runs[masking].append((tokens, time.perf_counter() - wall, time.process_time() - cpu))
  result = {}
  for i, unit in ((1, "real_tokens_per_sec"), (2, "real_tokens_per_cpu_sec")):
    # all chunks together: each stream reads a new block of documents (tokenizing and annotating it) in some
    # chunks and not others, so a chunk's rate swings; the totals hold the same work for both
    totals = {m: sum(x[0] for x in v) / sum(x[i] for x in v) for m, v in runs.items()}
    result[unit] = {m: {"all_chunks": round(totals[m]), "median_chunk": round(statistics.median(x[0] / x[i] for x in v))}
                    for m, v in runs.items()}
    result[unit]["knowledge_over_whole_word"] = totals["knowledge"] / totals["whole_word"]
  return result


def prepare_speed(spacy_pipeline: str) -> dict:
  """Documents per second of `bert-jax data prepare` (one process) on the embedded corpus: without spans,
  with the offline annotator, and with the spaCy pipeline at `spacy_pipeline` ("": left out)."""
  annotators = {"none": None, "capitalised": {}}
  if spacy_pipeline:
    annotators["spacy"] = {"spacy_model": spacy_pipeline}
  result = {}
  with tempfile.TemporaryDirectory() as out:
    prepare.prepare("", os.path.join(out, "warm-up"), num_workers=1)  # TensorFlow, the corpus, the vocabulary
    for name, annotator in annotators.items():
      wall = time.perf_counter()
      metadata = prepare.prepare("", os.path.join(out, name), num_workers=1, knowledge_annotator=annotator)
      result[name] = round(metadata["documents"] / (time.perf_counter() - wall))
  return {"prepare_documents_per_sec": result}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batches", type=int, default=200)
  parser.add_argument("--stat-batches", type=int, default=50)
  parser.add_argument("--batch-size", type=int, default=64)
  parser.add_argument("--seq", type=int, default=128)
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--spacy-pipeline", default="", help="a spaCy pipeline (name or folder) to time in "
                      "`data prepare --knowledge-spacy`; --prepare-only skips the rest")
  parser.add_argument("--prepare-only", action="store_true")
  args = parser.parse_args()
  result = prepare_speed(args.spacy_pipeline)
  if not args.prepare_only:
    result["statistics"] = unit_statistics(args.stat_batches, args.batch_size, args.seq)
    result.update(speeds(args.batches, args.batch_size, args.seq, args.rounds))
  print(json.dumps(result, indent=1))


if __name__ == "__main__":
  main()
