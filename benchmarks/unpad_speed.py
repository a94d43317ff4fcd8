"""Unpadding (bert_jax/models/unpad.py) against padded batches: real tokens per second of fine-tuning's evaluation
and predict pass (finetune/batching.run_model, what both run) and of `embed` (bert_jax.Embedder, which packs
sentences its own way), measured on CPU, and compiled for one TPU chip and estimated (tpu/estimate.py).

  python benchmarks/unpad_speed.py --rounds 5 --json            # CPU, measured
  python benchmarks/unpad_speed.py --tpu v5e-1 --json           # compiled for one v5e chip, estimated
  python benchmarks/unpad_speed.py --train --rounds 3 --json    # fine-tuning's train step (also with --tpu)

Length distributions (max_seq_length 128): the embedded task's dev set (configs/glue.py:embedded: short
sentence pairs) and a real one, the Python standard library's docstring paragraphs
(benchmarks/embed_throughput.py: a mix of short and long lines, as real text has), both tokenized with the
embedded WordPiece vocabulary. Models with random weights (speed only): ModernBERT at Ettin-17m's shape
(7 layers, 256 wide, local window 128) and BERT at MiniLM-L6's (6 layers, 384 wide). Padded and unpadded
alternate, each warmed up (compiled) first; the medians of --rounds. On TPU: the forward over a padded
batch [64, 128] and over its packed rows [R, 128] (R: the rows `unpad.pack` needs for the distribution's
batches, on average, rounded up as it rounds), compiled for one chip; real tokens per estimated second.
With --train: fine-tuning's training step instead (the loss's gradient with dropout on, and an AdamW update),
on batches of 32 rows, padded against packed (finetune/batching.train_packer's one-pass packing).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from bert_jax.config_utils import load_config
from bert_jax.data_pipelines import embedded
from bert_jax.data_pipelines.tokenizers import load_tokenizer
from bert_jax.finetune import batching, features, heads
from bert_jax.finetune.objective import FinetuneObjective
from bert_jax.finetune.task_registry import build_task
from bert_jax.models import ModelConfig, unpad
from bert_jax.models.modernbert import ModernBertConfig
from bert_jax.training import partitioning

LENGTH, BATCH = 128, 64


def models(vocab: int) -> dict:
  return {
      "modernbert (ettin-17m shape)": ModernBertConfig(vocab_size=vocab, hidden_size=256, num_layers=7, num_heads=4,
                                                       intermediate_size=384, global_every=3, local_window=128),
      "bert (minilm-l6 shape)": ModelConfig(vocab_size=vocab, hidden_size=384, num_layers=6, num_heads=12,
                                            intermediate_size=1536, max_position_embeddings=512),
  }


def sentences(name: str, tokenizer, count: int) -> list[str]:
  if name == "embedded-task":
    config = load_config("configs/glue.py:embedded", [])
    task = build_task(config, tokenizer, need_train=False)
    ids = task.evals[0].features["input_ids"]
    special = tokenizer.special_mask()
    return [" ".join(tokenizer.decode_tokens([i for i in row if not special[i]])).replace(" ##", "")
            for row in ids[:count]]
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  import embed_throughput  # pylint: disable=import-outside-toplevel
  return embed_throughput.stdlib_paragraphs(count)


def rows(tokenizer, texts: list[str]) -> dict[str, np.ndarray]:
  encoded = [features.encode_pair(tokenizer, tokenizer.encode(t), None, LENGTH) for t in texts]
  return {k: np.stack([e[k] for e in encoded]) for k in features.MODEL_INPUTS}


def _median_pair(run_a, run_b, rounds: int) -> tuple[float, float]:
  run_a(), run_b()  # compile
  a, b = [], []
  for _ in range(rounds):
    for fn, out in ((run_a, a), (run_b, b)):
      start = time.perf_counter()
      fn()
      out.append(time.perf_counter() - start)
  return statistics.median(a), statistics.median(b)


def finetune_eval(config, feats: dict, rounds: int) -> dict:
  model = heads.FinetuneModel(heads.encoder_config(config, "classification", "pooled"), "classification", 2)
  dummy = jnp.zeros((1, LENGTH), jnp.int32)
  params = model.init(jax.random.key(0), dummy, dummy + 1, dummy)["params"]
  apply = jax.jit(FinetuneObjective(model).apply)
  mesh = partitioning.make_mesh(ml_collections.ConfigDict({"data": -1, "fsdp": 1, "tensor": 1}),
                                jax.local_devices())
  run = lambda packing: jax.block_until_ready(  # noqa: E731
      batching.run_model(apply, params, mesh, feats, BATCH, (), packing))
  padded, packed = _median_pair(lambda: run(None), lambda: run(config), rounds)
  real = int(feats["attention_mask"].sum())
  return {"real_tokens": real, "padded_tokens_per_s": real / padded, "unpadded_tokens_per_s": real / packed,
          "speedup": padded / packed}


TRAIN_BATCH = 32


def _train_step(config):
  """(params, jitted step(params, opt_state, batch) -> (params, opt_state, loss), opt_state) of a
  classification head's fine-tuning step with dropout on."""
  import optax  # pylint: disable=import-outside-toplevel
  model = heads.FinetuneModel(heads.encoder_config(config, "classification", "pooled"), "classification", 2)
  objective = FinetuneObjective(model)
  dummy = jnp.zeros((1, LENGTH), jnp.int32)
  params = nn.meta.unbox(model.init(jax.random.key(0), dummy, dummy + 1, dummy)["params"])
  tx = optax.adamw(1e-4)

  def step(params, opt_state, batch):
    def loss(p):
      sums = objective.sums(p, batch, jax.random.key(1), deterministic=False)
      return sums["loss"] / objective.counts(batch)["labels"]
    value, grads = jax.value_and_grad(loss)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, value
  return params, step, tx.init(params)


def _train_batches(config, feats: dict) -> tuple[list[dict], list[dict]]:
  batches = [{**{k: v[s:s + TRAIN_BATCH] for k, v in feats.items()}, "label": np.zeros(TRAIN_BATCH, np.int32)}
             for s in range(0, len(feats["input_ids"]) - TRAIN_BATCH + 1, TRAIN_BATCH)]
  return batches, [{**b, **unpad.pack(b, config)} for b in batches]


def finetune_train(config, feats: dict, rounds: int) -> dict:
  params, step, opt_state = _train_step(config)
  step = jax.jit(step)
  padded, packed = _train_batches(config, feats)
  run = lambda batches: [jax.block_until_ready(step(params, opt_state, b)) for b in batches]  # noqa: E731
  a, b = _median_pair(lambda: run(padded), lambda: run(packed), rounds)
  real = int(sum(x["attention_mask"].sum() for x in padded))
  return {"real_tokens": real, "packed_rows": [len(x["input_ids"]) for x in packed],
          "padded_tokens_per_s": real / a, "unpadded_tokens_per_s": real / b, "speedup": a / b}


def tpu_train_estimate(config, feats: dict, topology: str) -> dict:
  from bert_jax.tpu import estimate, slices  # pylint: disable=import-outside-toplevel
  tpu = slices.parse(topology)
  one = jax.sharding.SingleDeviceSharding(slices.compile_only_devices(tpu)[0])
  params, step, opt_state = _train_step(config)
  place = lambda tree: jax.tree.map(  # noqa: E731
      lambda x: jax.ShapeDtypeStruct(np.shape(x), jnp.asarray(x).dtype, sharding=one), tree)
  padded, packed = _train_batches(config, feats)
  rows_needed = unpad.row_count(int(np.ceil(np.mean([len(b["input_ids"]) for b in packed]))), TRAIN_BATCH,
                                unpad.default_unit(TRAIN_BATCH))
  real = float(np.mean([b["attention_mask"].sum() for b in padded]))

  def seconds(batch):
    compiled = jax.jit(step).lower(place(params), place(opt_state), place(batch)).compile()
    return estimate.step_time(compiled.as_text(), tpu.chip, 1).seconds
  a = seconds(padded[0])
  b = seconds({**padded[0], **unpad.pack(padded[0], config, rows=rows_needed)})
  return {"topology": topology, "packed_rows": rows_needed, "padded_tokens_per_s": real / a,
          "unpadded_tokens_per_s": real / b, "speedup": a / b, "attention": getattr(config, "attention", "dot")}


def embed(tokenizer_dir: str, config, texts: list[str], rounds: int, tmp: str) -> dict:
  """Embedder over a tiny random BERT folder: pack=False (rows padded to length buckets) against pack=True."""
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  import bert_jax  # pylint: disable=import-outside-toplevel
  folder = os.path.join(tmp, "bert")
  torch.manual_seed(0)
  transformers.BertModel(transformers.BertConfig(
      vocab_size=config.vocab_size, hidden_size=config.hidden_size, num_hidden_layers=config.num_layers,
      num_attention_heads=config.num_heads, intermediate_size=config.intermediate_size,
      max_position_embeddings=512)).save_pretrained(folder)
  for name in ("vocab.txt",):
    with open(os.path.join(tokenizer_dir, name), encoding="utf-8") as f, \
        open(os.path.join(folder, name), "w", encoding="utf-8") as g:
      g.write(f.read())
  padded = bert_jax.Embedder.load(folder, batch_size=BATCH, pack=False, note=lambda line: None)
  packed = bert_jax.Embedder.load(folder, batch_size=BATCH, pack=True, note=lambda line: None)
  real = sum(min(len(padded.tokenize(t)), LENGTH) for t in texts)
  a, b = _median_pair(lambda: padded(texts), lambda: packed(texts), rounds)
  return {"real_tokens": real, "padded_tokens_per_s": real / a, "packed_tokens_per_s": real / b, "speedup": a / b}


def tpu_estimate(config, feats: dict, topology: str) -> dict:
  from bert_jax.tpu import estimate, slices  # pylint: disable=import-outside-toplevel
  tpu = slices.parse(topology)
  device = slices.compile_only_devices(tpu)[0]
  one = jax.sharding.SingleDeviceSharding(device)
  model = heads.FinetuneModel(heads.encoder_config(config, "classification", "pooled"), "classification", 2)
  objective = FinetuneObjective(model)
  dummy = jnp.zeros((1, LENGTH), jnp.int32)
  params = jax.eval_shape(lambda: model.init(jax.random.key(0), dummy, dummy + 1, dummy)["params"])
  params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=one), nn.meta.unbox(params))
  batches = [{k: v[s:s + BATCH] for k, v in feats.items()}
             for s in range(0, len(feats["input_ids"]) - BATCH + 1, BATCH)]
  packed_rows = [len(unpad.pack(b, config)["input_ids"]) for b in batches]
  rows_needed = unpad.row_count(int(np.ceil(np.mean(packed_rows))), BATCH, unpad.default_unit(BATCH))
  real = float(np.mean([b["attention_mask"].sum() for b in batches]))

  def seconds(batch_shapes):
    abstract = {k: jax.ShapeDtypeStruct(s, jnp.int32, sharding=one) for k, s in batch_shapes.items()}
    compiled = jax.jit(objective.apply).lower(params, abstract).compile()
    return estimate.step_time(compiled.as_text(), tpu.chip, 1).seconds
  padded = seconds({k: (BATCH, LENGTH) for k in features.MODEL_INPUTS})
  packed = seconds({**{k: (rows_needed, LENGTH) for k in unpad.PACKED}, "attention_mask": (BATCH, LENGTH),
                    unpad.INDEX: (BATCH, LENGTH)})
  return {"topology": topology, "packed_rows": rows_needed, "packed_rows_mean": float(np.mean(packed_rows)),
          "padded_tokens_per_s": real / padded, "unpadded_tokens_per_s": real / packed, "speedup": padded / packed,
          "attention": getattr(config, "attention", "dot")}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--rows", type=int, default=512)
  parser.add_argument("--tpu", default="", help="a Cloud TPU name (v5e-1): compile and estimate instead of run")
  parser.add_argument("--json", action="store_true")
  parser.add_argument("--train", action="store_true", help="fine-tuning's train step instead of eval and embed")
  args = parser.parse_args()
  os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))  # configs/ are relative
  vocab = embedded.ensure_embedded()[1]
  tokenizer = load_tokenizer(vocab, True)
  out = {"date": time.strftime("%Y-%m-%d"), "backend": jax.default_backend(), "rows": args.rows,
         "max_seq_length": LENGTH, "batch": BATCH, "results": []}
  with tempfile.TemporaryDirectory() as tmp:
    for dist in ("embedded-task", "stdlib-docstrings"):
      texts = sentences(dist, tokenizer, args.rows)
      feats = rows(tokenizer, texts)
      mean = float(feats["attention_mask"].sum(1).mean())
      for name, config in models(tokenizer.vocab_size).items():
        if args.tpu:
          if isinstance(config, ModernBertConfig):
            config = config.replace(attention="splash")
          result = (tpu_train_estimate if args.train else tpu_estimate)(config, feats, args.tpu)
        else:
          result = (finetune_train if args.train else finetune_eval)(config, feats, args.rounds)
        _report(out, {"set": dist, "mean_tokens": mean, "model": name,
                      "what": "finetune train step" if args.train else "finetune eval/predict", **result}, args.json)
      if not args.tpu and not args.train:
        bert = models(tokenizer.vocab_size)["bert (minilm-l6 shape)"]
        _report(out, {"set": dist, "mean_tokens": mean, "model": "bert (minilm-l6 shape)", "what": "embed",
                      **embed(os.path.dirname(vocab), bert, texts, args.rounds, tmp)}, args.json)
  if args.json:
    print(json.dumps(out))


def _report(out: dict, r: dict, as_json: bool) -> None:
  """Each result as it comes (a line; all of them as one JSON object at the end with --json)."""
  out["results"].append(r)
  print(json.dumps(r) if as_json else
        f"{r['set']:18s} {r['model']:28s} {r['what']:22s} padded {r['padded_tokens_per_s']:9.0f} tok/s  "
        f"unpadded {r.get('unpadded_tokens_per_s', r.get('packed_tokens_per_s')):9.0f} tok/s  x{r['speedup']:.2f}",
        flush=True)


if __name__ == "__main__":
  main()
