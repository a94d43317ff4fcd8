"""`bert-jax pretrain`, `bert-jax info`, `bert-jax benchmark`."""
from __future__ import annotations

import json

from bert_jax.errors import UserError


def _add_config(parser, default=None):
  parser.add_argument("--config", required=default is None, default=default,
                      help="config file and preset, e.g. configs/bert.py:base; override fields with "
                           "--config.train.batch_size=64")


def add_distributed_args(parser) -> None:
  parser.add_argument("--coordinator-address", help="host:port of process 0 (GPU/CPU clusters)")
  parser.add_argument("--num-processes", type=int)
  parser.add_argument("--process-id", type=int)


def register(subparsers) -> None:
  p = subparsers.add_parser("pretrain", help="pretrain (or resume) a model in a workdir")
  _add_config(p)
  p.add_argument("--workdir", required=True, help="checkpoints, metrics.jsonl, config.json")
  add_distributed_args(p)
  p.set_defaults(handler=_pretrain)

  p = subparsers.add_parser("info", help="parameter count and per-device memory, nothing allocated")
  _add_config(p)
  p.add_argument("--devices", type=int, default=0,
                 help="devices to size config.mesh for (a pod's, on any machine; 0: this machine's when the "
                      "mesh fits them, else the fewest it takes)")
  p.add_argument("--json", action="store_true")
  p.set_defaults(handler=_info)

  p = subparsers.add_parser("benchmark", help="time the compiled train step on synthetic batches")
  _add_config(p, default="configs/bert.py:base")
  p.add_argument("--batch-size", type=int, default=32)
  p.add_argument("--seq-length", type=int, default=128)
  p.add_argument("--steps", type=int, default=10)
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--json", action="store_true")
  p.set_defaults(handler=_benchmark)


def _pretrain(args) -> int:
  from bert_jax import cli  # pylint: disable=import-outside-toplevel
  return cli.run_job(args, "pretrain")


def _info(args) -> int:
  from bert_jax import jobs  # pylint: disable=import-outside-toplevel
  from bert_jax.config_utils import load_config  # pylint: disable=import-outside-toplevel
  from bert_jax.training import info  # pylint: disable=import-outside-toplevel
  config = load_config(args.config, args.config_overrides)
  job = jobs.with_step(config, args.config, "info")
  result = info.model_info(*job.step(config, info.sizing_mesh(config.mesh, args.devices)))
  print(json.dumps(result) if args.json else info.format_info(result))
  return 0


def _benchmark(args) -> int:
  for flag in ("batch_size", "seq_length", "steps", "repeats"):
    if getattr(args, flag) < 1:
      raise UserError(f"--{flag.replace('_', '-')}={getattr(args, flag)} must be >= 1")
  from bert_jax.config_utils import load_config  # pylint: disable=import-outside-toplevel
  from bert_jax.training import benchmark  # pylint: disable=import-outside-toplevel
  config = load_config(args.config, args.config_overrides)
  r = benchmark.run_benchmark(config, args.batch_size, args.seq_length, args.steps, repeats=args.repeats)
  if args.json:
    print(json.dumps(r))
  else:
    print(f"{r['device']} x{r['devices']} {r['dtype']} batch {r['batch_size']} seq {r['seq_length']}: "
          f"{r['tokens_per_sec']:,.0f} tokens/s, step {r['step_time_s'] * 1e3:.1f} ms, "
          f"{r['model_tflops_per_sec']:.3f} TFLOP/s, mfu {r['mfu']:.1%} of {r['peak_tflops_per_sec']:.3f} "
          f"TFLOP/s ({r['peak_source']})")
  return 0
