"""`bert-jax distill` and `bert-jax quantize`: thin wrappers over bert_jax.compress."""
from __future__ import annotations

import json

from bert_jax.cli.pretrain import add_distributed_args
from bert_jax.errors import UserError


def _distill(args):
  from bert_jax import cli  # pylint: disable=import-outside-toplevel
  return cli.run_job(args, "distill")


def _quantize(args):
  from bert_jax.compress import qbert, quantize  # pylint: disable=import-outside-toplevel
  if args.mode == "hessian":
    if args.activations not in (None, "float"):
      raise UserError("--mode hessian keeps activations float (no sub-8-bit kernels): drop --activations")
    results = qbert.quantize(args.model, args.output, budget_bytes=args.budget_bytes,
                             bits_per_layer=args.bits_per_layer, groups=args.groups, batches=args.hessian_batches,
                             iterations=args.power_iterations, batch_size=args.batch_size)
    print(f"bits per layer {results['bits_per_layer']} (average {results['average_bits']:.2f}); "
          f"{results['bytes']['quantized']} bytes vs {results['bytes']['float']} float", flush=True)
  else:
    if args.budget_bytes is not None or args.bits_per_layer is not None:
      raise UserError("--budget-bytes and --bits-per-layer go with --mode hessian")
    results = quantize.quantize(args.model, args.output, args.activations or "int8", args.batch_size)
  print(json.dumps(results, indent=1, sort_keys=True))


def register(subparsers) -> None:
  p = subparsers.add_parser("distill", help="distill a teacher into a smaller student: on a task "
                                    "(a fine-tuned teacher) or on the pretraining corpus (general-*)")
  p.add_argument("--config", required=True, help="e.g. configs/distill.py:embedded, configs/distill.py:sst2, "
                                                  "configs/distill.py:general-tiny")
  p.add_argument("--workdir", required=True, help="the student's workdir (fine-tuning; pretraining for general-*)")
  add_distributed_args(p)
  p.set_defaults(handler=_distill)
  q = subparsers.add_parser(
      "quantize", help="post-training quantization: int8 per channel, or Q-BERT's 2-8 bits per layer; dev set measured",
      description="Writes a quantized copy of a fine-tuning workdir that `bert-jax predict` takes, and its "
                  "dev metrics next to the float model's (eval_results.json). Needs bert_jax[quantize].")
  q.add_argument("--model", required=True, help="a fine-tuning workdir (float)")
  q.add_argument("--output", required=True, help="the int8 workdir to write")
  q.add_argument("--mode", choices=("int8", "hessian"), default="int8",
                 help="int8: Q8BERT-style, every weight int8 per channel; hessian: Q-BERT, 2/3/4/8 bits per "
                      "encoder layer by its Hessian's top eigenvalue, group-wise scales, packed storage")
  q.add_argument("--activations", choices=("int8", "float"), default=None,
                 help="--mode int8: int8 (default): every matmul in int8 with dynamic per-channel activation "
                      "scales; float: int8 storage only. --mode hessian: float only")
  q.add_argument("--budget-bytes", type=int, default=None,
                 help="--mode hessian: the quantized params' array bytes at most (eval_results.json: "
                      "bytes.quantized); bits go to the sensitive layers")
  q.add_argument("--bits-per-layer", default=None,
                 help="--mode hessian: the widths instead of a budget, a JSON list (lowest layer first) or "
                      "one number, from 2, 3, 4, 8")
  q.add_argument("--groups", type=int, default=128,
                 help="--mode hessian: scales per weight matrix at most (groups of output units; attention "
                      "projections grouped by heads first)")
  q.add_argument("--hessian-batches", type=int, default=4,
                 help="--mode hessian: training batches, one top eigenvalue each (their mean and std)")
  q.add_argument("--power-iterations", type=int, default=100,
                 help="--mode hessian: at most this many Hessian-vector products per eigenvalue")
  q.add_argument("--batch-size", type=int, default=0, help="dev examples per call (0: the run's eval batch)")
  q.set_defaults(handler=_quantize)
