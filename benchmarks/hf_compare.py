"""Train-step throughput: bert_jax vs Hugging Face FlaxBertForPreTraining vs BertForPreTraining (PyTorch SDPA).

  /work/venv/bin/python benchmarks/hf_compare.py --size mini --batch-size 16 --seq-length 128 \\
      --rounds 7 --steps 3 --hf-flax-python /work/venv-hf/bin/python

The same model size, batch, objective and optimizer for all three: MLM with 20 predictions at seq 128
(80 at 512) + NSP, AdamW (b1 0.9, b2 0.999, eps 1e-6, weight decay 0.01 except biases and LayerNorm,
global-norm clipping at 1.0, linear warmup), dropout as the config sets it (hidden and attention 0.1),
fp32 unless --dtype bfloat16. Each step is a real optimizer step: forward, backward, AdamW update;
jitted (both JAX frameworks, state donated) or eager (PyTorch; `--torch-compile` wraps the model in
torch.compile). Each framework runs in its own worker process, built and warmed up once; the driver
then asks them in turn (A, B, C, A, B, C, ...) for `--steps` timed steps, so the three see about the
same machine load, and reports the median tokens/s and the ratios (median of per-round ratios).
PyTorch's worker runs with OMP_WAIT_POLICY=PASSIVE (unless set): its OpenMP threads otherwise spin
after each step, into the next worker's turn (2026-11-28: bert_jax 0.53-0.69 s per step beside the
spinning torch worker, 0.46-0.51 s beside the passive one, 0.53-0.57 s alone; torch itself 1.20-1.41 s
against 0.96-1.06 s).

The Hugging Face models compute MLM logits at every position (their implementation); the loss is
then taken at the masked positions only, for all three.

HF Flax needs transformers<5 (v5 removed the Flax classes) in a separate venv:

  python -m venv /work/venv-hf && /work/venv-hf/bin/pip install "transformers>=4.46,<5" \\
      "jax==0.4.38" "jaxlib==0.4.38" "flax==0.10.2" "optax==0.2.4" numpy

(resolved here to transformers 4.57.6). bert_jax and PyTorch run in the project venv
(`pip install -e .[bench]`: torch==2.13.0). On a GPU machine pass `--device gpu` (torch on cuda; JAX
uses whatever accelerator its jaxlib sees, so install jax[cuda] in both venvs).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

FRAMEWORKS = ("bert_jax", "hf_flax", "torch", "kerashub")  # kerashub: benchmarks/kerashub_compare.py
JAX_FRAMEWORKS = ("bert_jax", "hf_flax", "kerashub")
NO_DECAY = ("bias", "scale", "LayerNorm.weight", "LayerNorm.bias")


def _sizes(size: str) -> dict:
  from bert_jax.configs import bert  # pylint: disable=import-outside-toplevel
  layers, hidden, heads, intermediate = bert.SIZES[size]
  return dict(vocab_size=30522, num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
              intermediate_size=intermediate, max_position_embeddings=512, type_vocab_size=2)


def _hf_config(args, transformers):
  return transformers.BertConfig(**args.model, hidden_dropout_prob=args.hidden_dropout,
                                 attention_probs_dropout_prob=args.attention_dropout,
                                 hidden_act="gelu", layer_norm_eps=1e-12)


# ---- workers: each returns (step(), description); step() runs one optimizer step and blocks ----

def bert_jax_worker(args, batch):
  from bert_jax.config_utils import load_config  # pylint: disable=import-outside-toplevel
  from bert_jax.training.benchmark import TimedStep  # pylint: disable=import-outside-toplevel
  overrides = [f"--config.model.hidden_dropout={args.hidden_dropout}",
               f"--config.model.attention_dropout={args.attention_dropout}",
               f"--config.model.dtype={args.dtype}", "--config.optimizer.name=adamw", *args.jax_override]
  timed = TimedStep(load_config(f"configs/bert.py:{args.size}", overrides), args.batch_size, args.seq_length)
  import jax  # pylint: disable=import-outside-toplevel
  return (lambda: timed.run(1)), {"jax": jax.__version__, "device": jax.devices()[0].device_kind}


def hf_flax_worker(args, batch):
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import optax  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  model = transformers.FlaxBertForPreTraining(_hf_config(args, transformers), seed=0,
                                              dtype=jnp.dtype(args.dtype))
  decay = lambda p: jax.tree_util.tree_map_with_path(  # noqa: E731
      lambda path, _: path[-1].key not in NO_DECAY, p)
  schedule = optax.join_schedules([optax.linear_schedule(0.0, 1e-4, 10_000),
                                   optax.linear_schedule(1e-4, 0.0, 990_000)], [10_000])
  tx = optax.chain(optax.clip_by_global_norm(1.0),
                   optax.adamw(schedule, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01, mask=decay))
  data = {k: jnp.asarray(v) for k, v in batch.items()}
  vocab = args.model["vocab_size"]

  def loss_fn(params, rng):
    out = model(data["input_ids"], data["input_mask"], data["segment_ids"], params=params,
                dropout_rng=rng, train=True)
    logits = jnp.take_along_axis(out.prediction_logits, data["masked_lm_positions"][..., None], axis=1)
    labels = jax.nn.one_hot(data["masked_lm_ids"], vocab)
    w = data["masked_lm_weights"]
    mlm = -(jax.nn.log_softmax(logits.astype(jnp.float32)) * labels).sum(-1)
    mlm = (mlm * w).sum() / jnp.maximum(w.sum(), 1.0)
    nsp = optax.softmax_cross_entropy_with_integer_labels(
        out.seq_relationship_logits.astype(jnp.float32), data["next_sentence_labels"]).mean()
    return mlm + nsp

  def train_step(params, opt_state, step, rng):
    loss, grads = jax.value_and_grad(loss_fn)(params, jax.random.fold_in(rng, step))
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, step + 1, loss

  train_step = jax.jit(train_step, donate_argnums=(0, 1))
  state = [model.params, tx.init(model.params), jnp.zeros((), jnp.int32), jax.random.PRNGKey(1)]

  def step():
    state[0], state[1], state[2], loss = train_step(*state)
    jax.block_until_ready(loss)

  return step, {"jax": jax.__version__, "flax": __import__("flax").__version__,
                "transformers": transformers.__version__, "device": jax.devices()[0].device_kind}


def torch_worker(args, batch):
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  torch.manual_seed(0)
  device = "cuda" if args.device == "gpu" else "cpu"
  config = _hf_config(args, transformers)
  config._attn_implementation = "sdpa"  # pylint: disable=protected-access
  model = transformers.BertForPreTraining(config).to(device).train()
  groups = [{"params": [p for n, p in model.named_parameters() if not n.endswith(NO_DECAY)],
             "weight_decay": 0.01},
            {"params": [p for n, p in model.named_parameters() if n.endswith(NO_DECAY)],
             "weight_decay": 0.0}]
  opt = torch.optim.AdamW(groups, lr=1e-4, betas=(0.9, 0.999), eps=1e-6, fused=True)
  sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min((s + 1) / 10_000, 1.0))
  forward = torch.compile(model) if args.torch_compile else model
  data = {k: torch.from_numpy(v).to(device) for k, v in batch.items()}
  data = {k: v.long() if v.dtype == torch.int32 else v for k, v in data.items()}
  labels = torch.nn.functional.one_hot(data["masked_lm_ids"], args.model["vocab_size"]).float()
  autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=args.dtype == "bfloat16")

  def step():
    with autocast:
      out = forward(input_ids=data["input_ids"], attention_mask=data["input_mask"],
                    token_type_ids=data["segment_ids"])
    positions = data["masked_lm_positions"][..., None].expand(-1, -1, out.prediction_logits.shape[-1])
    logits = out.prediction_logits.float().gather(1, positions)
    w = data["masked_lm_weights"]
    mlm = (-(torch.log_softmax(logits, -1) * labels).sum(-1) * w).sum() / w.sum().clamp(min=1.0)
    nsp = torch.nn.functional.cross_entropy(out.seq_relationship_logits.float(), data["next_sentence_labels"])
    loss = mlm + nsp
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    if device == "cuda":
      torch.cuda.synchronize()
    float(loss.detach())

  return step, {"torch": torch.__version__, "transformers": transformers.__version__,
                "threads": torch.get_num_threads(), "attention": config._attn_implementation,
                "compiled": args.torch_compile, "device": device,
                "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "")}


def kerashub_worker(args, batch):
  """KerasHub's BertMaskedLM (the JAX backend: KERAS_BACKEND=jax, set by the driver) of the same size, batch and
  masked positions, compiled with jit_compile=True; one `train_on_batch` a step. Its model has no NSP head, so
  kerashub_compare.py runs bert_jax without one too."""
  import jax  # pylint: disable=import-outside-toplevel
  import keras  # pylint: disable=import-outside-toplevel
  import keras_hub  # pylint: disable=import-outside-toplevel
  keras.utils.set_random_seed(0)
  if args.dtype == "bfloat16":
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
  m = args.model
  backbone = keras_hub.models.BertBackbone(
      vocabulary_size=m["vocab_size"], num_layers=m["num_hidden_layers"], num_heads=m["num_attention_heads"],
      hidden_dim=m["hidden_size"], intermediate_dim=m["intermediate_size"], dropout=args.hidden_dropout,
      max_sequence_length=m["max_position_embeddings"], num_segments=m["type_vocab_size"])
  model = keras_hub.models.BertMaskedLM(backbone)
  optimizer = keras.optimizers.AdamW(learning_rate=1e-4, weight_decay=0.01, beta_1=0.9, beta_2=0.999, epsilon=1e-6,
                                     global_clipnorm=1.0)
  optimizer.exclude_from_weight_decay(var_names=["bias", "gamma", "beta"])
  model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                weighted_metrics=[], jit_compile=True)
  x = {"token_ids": batch["input_ids"], "segment_ids": batch["segment_ids"],
       "padding_mask": batch["input_mask"].astype(bool), "mask_positions": batch["masked_lm_positions"]}
  x = {k: jax.numpy.asarray(v) for k, v in x.items()}
  y, weights = jax.numpy.asarray(batch["masked_lm_ids"]), jax.numpy.asarray(batch["masked_lm_weights"])

  def step():
    model.train_on_batch(x, y, sample_weight=weights)  # returns the loss as a Python float: the step is done

  return step, {"keras": keras.__version__, "keras_hub": keras_hub.__version__, "backend": keras.backend.backend(),
                "jax": jax.__version__, "device": jax.devices()[0].device_kind}


def serve(args) -> None:
  """Worker loop: build, warm up, print `ready`; then answer each `N` on stdin with N steps' seconds."""
  batch = dict(np.load(args.batch_file))
  step, info = {"bert_jax": bert_jax_worker, "hf_flax": hf_flax_worker, "torch": torch_worker,
                "kerashub": kerashub_worker}[args.worker](
      args, batch)
  for _ in range(args.warmup):
    step()
  print("ready " + json.dumps(info), flush=True)
  for line in sys.stdin:
    n = int(line)
    start = time.perf_counter()
    for _ in range(n):
      step()
    print(json.dumps({"seconds": time.perf_counter() - start}), flush=True)


# ---- driver ----

def _start(framework, args, batch_file):
  python = {"bert_jax": args.jax_python, "hf_flax": args.hf_flax_python, "torch": args.torch_python,
            "kerashub": args.jax_python}[framework]
  cmd = [python, os.path.abspath(__file__), "--worker", framework, "--batch-file", batch_file]
  cmd += [f"--{k.replace('_', '-')}={json.dumps(v) if k == 'model' else v}" for k, v in vars(args).items()
          if k in ("size", "batch_size", "seq_length", "dtype", "hidden_dropout", "attention_dropout",
                   "device", "warmup", "model")]
  cmd += [f"--jax-override={o}" for o in args.jax_override]
  cmd += ["--torch-compile"] if args.torch_compile else []
  env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  if framework == "torch":  # idle OpenMP threads sleep rather than spin into the next worker's turn
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
  if framework == "kerashub":
    env["KERAS_BACKEND"] = "jax"
  if args.dump_hlo and framework in JAX_FRAMEWORKS:  # compile-time only: the compiled code is the same
    env["XLA_FLAGS"] = (f"{env.get('XLA_FLAGS', '')} --xla_dump_to={os.path.join(args.dump_hlo, framework)}"
                        " --xla_dump_hlo_as_text").strip()
  return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
                          cwd=env["PYTHONPATH"])


def _read_json(proc, prefix=""):
  while True:
    line = proc.stdout.readline()
    if not line:
      raise RuntimeError(f"worker exited with {proc.wait()}")
    if line.startswith(prefix) and line[len(prefix):].lstrip().startswith("{"):
      return json.loads(line[len(prefix):])


def drive(args) -> dict:
  from bert_jax.training.benchmark import predictions_for, synthetic_batch  # pylint: disable=import-outside-toplevel
  frameworks = args.frameworks.split(",")
  with tempfile.TemporaryDirectory() as tmp:
    batch_file = os.path.join(tmp, "batch.npz")
    np.savez(batch_file, **synthetic_batch(args.batch_size, args.seq_length,
                                           predictions_for(args.seq_length), 30522))
    procs, info = {}, {}
    for f in frameworks:  # one at a time: compiling in parallel would slow each one's warm-up
      procs[f] = _start(f, args, batch_file)
      info[f] = _read_json(procs[f], "ready ")
      print(f"{f} ready: {info[f]}", file=sys.stderr, flush=True)
    times = {f: [] for f in frameworks}
    for r in range(args.rounds):
      for f in frameworks:
        procs[f].stdin.write(f"{args.steps}\n")
        procs[f].stdin.flush()
        times[f].append(_read_json(procs[f])["seconds"] / args.steps)
      print(f"round {r}: " + ", ".join(f"{f} {times[f][-1]:.3f} s" for f in frameworks),
            file=sys.stderr, flush=True)
    for p in procs.values():
      p.stdin.close()
      p.wait()
  tokens = args.batch_size * args.seq_length
  result = {"size": args.size, "batch_size": args.batch_size, "seq_length": args.seq_length,
            "dtype": args.dtype, "rounds": args.rounds, "steps_per_round": args.steps, "versions": info,
            "step_times_s": times,
            "tokens_per_sec": {f: tokens / statistics.median(t) for f, t in times.items()}}
  if args.dump_hlo:  # each JAX worker's compiled step: its matmul FLOPs (benchmarks/hlo_dots.py)
    import hlo_dots  # pylint: disable=import-outside-toplevel
    result["matmul_gflop_per_step"] = {
        f: sum(hlo_dots.step_module(os.path.join(args.dump_hlo, f))[1].values()) / 1e9
        for f in frameworks if f in JAX_FRAMEWORKS}
  if "bert_jax" in frameworks:
    for f in frameworks:
      if f != "bert_jax":
        result[f"bert_jax/{f}"] = statistics.median(
            t / b for b, t in zip(times["bert_jax"], times[f]))
  return result


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--size", default="mini")
  p.add_argument("--batch-size", type=int, default=16)
  p.add_argument("--seq-length", type=int, default=128)
  p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
  p.add_argument("--hidden-dropout", type=float, default=0.1)
  p.add_argument("--attention-dropout", type=float, default=0.1)
  p.add_argument("--device", default="cpu", choices=("cpu", "gpu"))
  p.add_argument("--rounds", type=int, default=7)
  p.add_argument("--steps", type=int, default=3, help="timed steps per framework per round")
  p.add_argument("--warmup", type=int, default=2)
  p.add_argument("--frameworks", default="bert_jax,hf_flax,torch")
  p.add_argument("--torch-compile", action="store_true")
  p.add_argument("--jax-override", action="append", default=[],
                 help="a bert_jax config override for its worker, e.g. --jax-override=--config.model.scan_layers=False")
  p.add_argument("--jax-python", default=sys.executable)
  p.add_argument("--torch-python", default=sys.executable)
  p.add_argument("--hf-flax-python", default="/work/venv-hf/bin/python")
  p.add_argument("--dump-hlo", metavar="DIR", help="dump each JAX worker's optimized HLO under DIR/<framework> "
                 "and report its compiled step's matmul GFLOP (benchmarks/hlo_dots.py)")
  p.add_argument("--json", action="store_true")
  p.add_argument("--worker", choices=FRAMEWORKS, help=argparse.SUPPRESS)
  p.add_argument("--batch-file", help=argparse.SUPPRESS)
  p.add_argument("--model", type=json.loads, help=argparse.SUPPRESS)  # the driver's _sizes(), for workers
  args = p.parse_args(argv)
  if args.worker:
    serve(args)
    return
  args.model = _sizes(args.size)
  args.dump_hlo = args.dump_hlo and os.path.abspath(args.dump_hlo)  # the workers run from the repository root
  r = drive(args)
  if args.json:
    print(json.dumps(r))
    return
  print(f"{args.size} batch {args.batch_size} seq {args.seq_length} {args.dtype}, median of {args.rounds} "
        f"alternating rounds x {args.steps} steps:")
  for f, tps in r["tokens_per_sec"].items():
    print(f"  {f:9s} {tps:10,.0f} tokens/s   {r['versions'][f]}")
  for f, gflop in r.get("matmul_gflop_per_step", {}).items():
    print(f"  {f:9s} {gflop:10.2f} matmul GFLOP per step (compiled)")
  for k, v in r.items():
    if k.startswith("bert_jax/"):
      print(f"  {k}: {v:.2f}x")


if __name__ == "__main__":
  main()
