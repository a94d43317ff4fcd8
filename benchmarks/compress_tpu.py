"""The compression table's TPU column for the later rows (BENCHMARKS.md, "The other compression methods on
the same row"): each row's fine-tuned classifier forward compiled here by libtpu for one TPU chip (no TPU
needed, the [tpu] extra; compiled, never run), batch 128 x seq 128, float32 parameters as fine-tuning
writes them, and its time against the MiniLM-L6 teacher's by two estimates:

- FLOP roofline (as benchmarks/int8_tpu.py, the first table's column): the forward's matmul FLOPs,
  counted analytically, at the chip's bf16 peak. BERT shapes are counted by training/benchmark.py (as
  tpu/aot.compile_forward does); MobileBERT and the BiLSTM by the counts below, which
  tests/test_compress_tpu.py checks against the matmuls in the traced forward.
- compiled estimate (tpu/estimate.py, as `bert-jax compile` reports): per op of the compiled module,
  max(FLOPs / bf16 peak, HBM bytes / HBM bandwidth), from XLA's cost analysis, loops multiplied out.
  A floor too: it has no per-op or per-loop-iteration latency, no MXU padding of narrow matmuls.

A BiLSTM runs 128 dependent steps per direction, each a small matmul: a FLOP roofline is not an honest
time for it, so its row uses the compiled estimate. The transformer rows use the FLOP roofline, like the
first table. Q-BERT's rows are not compiled: `predict` loads them dequantized to float32
(compress/qbert.py: quantization.activations="float"), so they compute as the teacher does.

  python benchmarks/compress_tpu.py                      # v5e, all rows
  python benchmarks/compress_tpu.py --topology v6e-1 --json tpu_rows.json
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time
from typing import Any, Callable

NUM_LABELS = 2  # SST-2
VOCAB = 30522  # the released MiniLM's WordPiece vocabulary, every row's


def bert_forward_flops(cfg, batch: int, seq: int) -> float:
  """The classifier's forward as tpu/aot.compile_forward counts it (the first table's figures)."""
  from bert_jax.training import benchmark  # pylint: disable=import-outside-toplevel
  encoder = cfg.replace(mlm_head=False, sentence_head="none")
  return benchmark.train_flops_per_step(encoder, batch, seq, 0) / 3 + batch * 2 * cfg.hidden_size * NUM_LABELS


def mobilebert_forward_flops(cfg, batch: int, seq: int) -> float:
  """MobileBERT's classifier forward (models/mobilebert.py), matmuls only, 2 FLOPs per multiply-add.
  Per token: the trigram embedding's 3E -> H map; per layer the bottlenecks H -> I in (the body's, and the
  queries' and keys' when shared), q and k (and v, read from the bottleneck's I or the block's H), the
  scores and weighted sum (2 x 2 x T x I), the attention output I -> I, the stacked FFNs (I -> F -> I
  each) and the bottleneck out I -> H. Per row: the pooler H -> H (with classifier_activation) and the
  classifier."""
  h, i, f, e = cfg.hidden_size, cfg.true_hidden_size, cfg.intermediate_size, cfg.embedding_size
  if cfg.use_bottleneck:
    attention_inputs = ((i, i, i) if cfg.use_bottleneck_attention else
                        (i, i, h) if cfg.key_query_shared_bottleneck else (h, h, h))
    bottlenecks = (1 + (cfg.key_query_shared_bottleneck and not cfg.use_bottleneck_attention)) * h * i + i * h
  else:
    attention_inputs, bottlenecks = (h, h, h), 0
  layer = 2 * (bottlenecks + sum(width * i for width in attention_inputs) + i * i
               + cfg.num_feedforward_networks * 2 * i * f) + 2 * 2 * seq * i
  embedding = 2 * (3 * e if cfg.trigram_input else e) * h if cfg.trigram_input or e != h else 0
  pooler = 2 * h * h if cfg.use_pooler and cfg.classifier_activation else 0
  return float(batch * seq * (cfg.num_layers * layer + embedding) + batch * (pooler + 2 * h * NUM_LABELS))


def bilstm_forward_flops(cfg, batch: int, seq: int) -> float:
  """The BiLSTM's classifier forward (models/bilstm.py): per token, direction and layer the four gates'
  input and recurrent maps (2 x 4U x (in + U)); per row the ReLU layer 2U -> hidden and the classifier."""
  u = cfg.lstm_size
  layers = sum(2 * 2 * 4 * u * ((cfg.embedding_size if k == 0 else 2 * u) + u) for k in range(cfg.num_layers))
  pooler = 2 * 2 * u * cfg.hidden_size if cfg.use_pooler else 0
  return float(batch * seq * layers + batch * (pooler + 2 * cfg.hidden_size * NUM_LABELS))


@dataclasses.dataclass(frozen=True)
class Shape:
  """One compiled model: how its config is built, how its FLOPs are counted, and which estimate its
  table row uses ("roofline" or "compiled")."""
  build: Callable[[], Any]
  flops: Callable[[Any, int, int], float]
  estimate: str = "roofline"
  source: str = ""


def _minilm(layers: int):
  """MiniLM-L6's shape (benchmarks/int8_tpu.py's), as its fine-tuning workdir holds it (no MLM or NSP head)."""
  from bert_jax.finetune import heads  # pylint: disable=import-outside-toplevel
  from bert_jax.models.config import ModelConfig  # pylint: disable=import-outside-toplevel
  cfg = ModelConfig(num_layers=layers, hidden_size=384, num_heads=12, intermediate_size=1536, vocab_size=VOCAB)
  return heads.encoder_config(cfg, "classification", "pooled")


def _preset_model(spec: str, *overrides: str):
  """The model section of a distillation preset, as its fine-tuning workdir holds it (heads.encoder_config)."""
  from bert_jax import config_utils  # pylint: disable=import-outside-toplevel
  from bert_jax.finetune import heads  # pylint: disable=import-outside-toplevel
  from bert_jax.models import families  # pylint: disable=import-outside-toplevel
  config = config_utils.load_config(spec, overrides)
  return heads.encoder_config(families.model_config(config.model.to_dict()), "classification", "pooled")


SHAPES = {
    "teacher": Shape(lambda: _minilm(6), bert_forward_flops, source="MiniLM-L6: 6 x 384, 12 heads, FFN 1536"),
    "student3": Shape(lambda: _minilm(3), bert_forward_flops, source="the teacher's shape with 3 layers"),
    "bilstm": Shape(lambda: _preset_model("configs/distill.py:bilstm", f"--config.model.vocab_size={VOCAB}"),
                    bilstm_forward_flops, "compiled", "configs/distill.py:bilstm: 300-wide embeddings, 150 units "
                    "each way, ReLU 400"),
    "mobilebert": Shape(lambda: _preset_model("configs/distill.py:mobilebert"), mobilebert_forward_flops,
                        source="configs/distill.py:mobilebert: configs/mobilebert.py:tiny's sizes, 30,522 word pieces"),
}
# The later tables' rows (BENCHMARKS.md), each by the shape its predict runs; None: not compiled (float compute
# of the teacher's shape, or no model of its own).
ROWS = {
    "BERT-of-Theseus (3 layers)": "student3",
    "PD (3 layers)": "student3",
    "BiLSTM": "bilstm",
    "Q-BERT 4 bits / 3 bits / 3 bits everywhere / mixed 2/4/8": None,
    "TinyBERT's losses on augmented data (3 layers)": "student3",
    "MobileBERT-tiny (4 layers)": "mobilebert",
}


def compile_shape(name: str, topology: str, batch: int, seq: int) -> dict[str, Any]:
  """`name`'s classifier forward (what `predict` runs) compiled for one chip of `topology`: compile seconds,
  matmul element types, analytic FLOPs and both time estimates."""
  import flax.linen as nn  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from bert_jax.finetune import features, heads  # pylint: disable=import-outside-toplevel
  from bert_jax.tpu import estimate, hlo, slices  # pylint: disable=import-outside-toplevel
  shape = SHAPES[name]
  cfg = shape.build()
  tpu = slices.parse(topology)
  device = slices.compile_only_devices(tpu)[0]
  one = jax.sharding.SingleDeviceSharding(device)
  model = heads.FinetuneModel(cfg, "classification", NUM_LABELS, "pooled", 0.0)
  dummy = jnp.zeros((1, seq), jnp.int32)
  params = nn.meta.unbox(jax.eval_shape(lambda: model.init(jax.random.key(0), dummy, dummy + 1, dummy)["params"]))
  count = sum(x.size for x in jax.tree.leaves(params))
  params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=one), params)
  inputs = [jax.ShapeDtypeStruct((batch, seq), jnp.int32, sharding=one)] * len(features.MODEL_INPUTS)
  start = time.perf_counter()
  compiled = jax.jit(lambda p, *x: model.apply({"params": p}, *x)).lower(params, *inputs).compile()
  seconds = time.perf_counter() - start
  text = compiled.as_text()
  timed = estimate.step_time(text, tpu.chip, 1)
  flops = shape.flops(cfg, batch, seq)
  return {"shape": name, "source": shape.source, "topology": tpu.name, "device_kind": device.device_kind,
          "params": count, "compile_seconds": seconds, "matmuls": dict(hlo.matmul_types(text)),
          "flops": flops, "roofline_seconds": flops / tpu.chip.peak_bf16_flops,
          "compiled_seconds": timed.seconds, "compiled_flops": timed.flops, "compiled_hbm_bytes": timed.hbm_bytes,
          "compiled_compute_bound_seconds": timed.compute_bound, "compiled_memory_bound_seconds": timed.memory_bound,
          "row_estimate": shape.estimate}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--topology", default="v5litepod-1", help="one chip: v5litepod-1 (v5e) or v6e-1")
  parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES),
                      help="what to compile; the teacher is always compiled first (every speedup is against it)")
  parser.add_argument("--batch", type=int, default=128)
  parser.add_argument("--seq", type=int, default=128)
  parser.add_argument("--json", help="also write the results here")
  args = parser.parse_args()
  import jax  # pylint: disable=import-outside-toplevel
  jax.config.update("jax_platforms", "cpu")  # compiling for the TPU needs no accelerator here
  names = ["teacher"] + [n for n in args.shapes if n != "teacher"]
  results = {}
  for name in names:
    r = compile_shape(name, args.topology, args.batch, args.seq)
    base = results.get("teacher", r)
    r["roofline_speedup"] = base["roofline_seconds"] / r["roofline_seconds"]
    r["compiled_speedup"] = base["compiled_seconds"] / r["compiled_seconds"]
    results[name] = r
    print(json.dumps(r), flush=True)
  print(f"\n| shape | params | compiled matmuls | GFLOPs (analytic) | roofline ms | speedup | compiled estimate: "
        f"GFLOPs, GB of HBM | ms | speedup | the row uses |\n|{'---|' * 10}")
  for r in results.values():
    kinds = ", ".join(f"{n} x {k}" for k, n in sorted(r["matmuls"].items()))
    print(f"| {r['shape']} | {r['params']:,} | {kinds} | {r['flops'] / 1e9:.2f} | {r['roofline_seconds'] * 1e3:.4f} | "
          f"{r['roofline_speedup']:.2f}x | {r['compiled_flops'] / 1e9:.2f}, {r['compiled_hbm_bytes'] / 1e9:.3f} | "
          f"{r['compiled_seconds'] * 1e3:.4f} | {r['compiled_speedup']:.2f}x | {r['row_estimate']} |")
  print(f"\n| row | shape | speedup (TPU, {results['teacher']['device_kind']}) |\n|---|---|---|")
  for row, name in ROWS.items():
    r = results.get(name)
    cell = ("1x (float compute: dequantized to float32, the teacher's forward)" if name is None else
            "not compiled" if r is None else f"{r[r['row_estimate'] + '_speedup']:.1f}x ({r['row_estimate']})")
    print(f"| {row} | {name or 'teacher'} | {cell} |")
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"topology": args.topology, "batch": args.batch, "seq": args.seq, "shapes": results,
                 "rows": ROWS}, f, indent=1)


if __name__ == "__main__":
  main()
