"""`bert-jax distill` and `bert-jax quantize`: thin wrappers over bert_jax.compress."""
from __future__ import annotations

import json

from bert_jax.cli.pretrain import add_distributed_args


def _distill(args):
  from bert_jax import cli  # pylint: disable=import-outside-toplevel
  return cli.run_job(args, "distill")


def _quantize(args):
  from bert_jax.compress import quantize  # pylint: disable=import-outside-toplevel
  results = quantize.quantize(args.model, args.output, args.activations, args.batch_size)
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
      "quantize", help="post-training int8: per-channel int8 weights (about 4x smaller), dev set measured",
      description="Writes an int8 copy of a fine-tuning workdir that `bert-jax predict` takes, and its "
                  "dev metrics next to the float model's (eval_results.json). Needs bert_jax[quantize].")
  q.add_argument("--model", required=True, help="a fine-tuning workdir (float)")
  q.add_argument("--output", required=True, help="the int8 workdir to write")
  q.add_argument("--activations", choices=("int8", "float"), default="int8",
                 help="int8: every matmul in int8 with dynamic per-channel activation scales; float: "
                      "int8 storage only")
  q.add_argument("--batch-size", type=int, default=0, help="dev examples per call (0: the run's eval batch)")
  q.set_defaults(handler=_quantize)
