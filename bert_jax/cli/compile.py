"""`bert-jax compile`: the train and eval steps compiled for a TPU slice on this machine (the [tpu] extra)."""
from __future__ import annotations

import json
import sys


def register(subparsers) -> None:
  p = subparsers.add_parser(
      "compile", help="compile the train and eval steps for a TPU slice, here, without the TPU: HBM per "
                      "chip, fits or not, collectives, estimated step time (exit 1 if it does not fit)")
  p.add_argument("--config", required=True, help="config file and preset, e.g. configs/bert.py:large; "
                                                 "override fields with --config.mesh.fsdp=-1")
  p.add_argument("--topology", required=True,
                 help="Cloud TPU name: v3-8..v3-2048, v4-8..v4-4096, v5litepod-N, v5p-N, v6e-N")
  p.add_argument("--json", action="store_true", help="one JSON object instead of the table")
  p.set_defaults(handler=_compile)


def _compile(args) -> int:
  import jax  # pylint: disable=import-outside-toplevel
  if not jax.config.jax_platforms:  # compiling for the slice needs no accelerator here: never claim one
    jax.config.update("jax_platforms", "cpu")
  from bert_jax import jobs  # pylint: disable=import-outside-toplevel
  from bert_jax.config_utils import load_config  # pylint: disable=import-outside-toplevel
  from bert_jax.tpu import aot  # pylint: disable=import-outside-toplevel
  config = load_config(args.config, args.config_overrides)
  report = aot.compile_for_slice(config, args.topology, jobs.with_step(config, args.config, "compile").step,
                                 say=lambda line: print(line, file=sys.stderr, flush=True))
  print(json.dumps(report) if args.json else aot.format_report(report), flush=True)
  if not report["fits"]:
    print(f"bert-jax compile: {args.topology}: does not fit ({report['hbm_per_chip_bytes'] / 2 ** 30:.1f} GiB per "
          f"chip of {report['hbm_capacity_bytes'] / 2 ** 30:.1f} GiB); fix: {report['fix']}", file=sys.stderr)
    return 1
  return 0
