"""`bert-jax grow`: progressive stacking, L -> 2L layers, into a params checkpoint for init_from."""
from __future__ import annotations

import json


def _grow(args) -> int:
  from bert_jax.training import grow  # pylint: disable=import-outside-toplevel
  print(json.dumps(grow.grow(args.source, args.destination)))
  return 0


def register(subparsers) -> None:
  p = subparsers.add_parser("grow", help="double a trained model's depth by stacking its layers "
                                         "(Gong et al. 2019); continue with --config.init_from=DIR")
  p.add_argument("--from", dest="source", required=True,
                 help="a workdir (latest checkpoint), a checkpoint step directory or a params checkpoint")
  p.add_argument("--to", dest="destination", required=True, help="directory for the params checkpoint")
  p.set_defaults(handler=_grow)
