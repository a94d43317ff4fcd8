"""`bert-jax prune`: remove attention heads from a checkpoint (Michel et al. 2019), into a params checkpoint."""
from __future__ import annotations

import json

from bert_jax.errors import UserError


def _prune(args) -> int:
  from bert_jax.training import prune  # pylint: disable=import-outside-toplevel
  if (args.heads is None) == (args.fraction is None):
    raise UserError("say which heads: --heads JSON, or --fraction F with --importance FILE")
  if args.fraction is not None and not args.importance:
    raise UserError("--fraction needs --importance FILE (heads.json from `bert-jax analyze heads`)")
  heads = prune.parse_heads(args.heads) if args.heads is not None else None
  print(json.dumps(prune.prune(args.source, args.destination, heads=heads, fraction=args.fraction or 0.0,
                               importance_path=args.importance)))
  return 0


def register(subparsers) -> None:
  p = subparsers.add_parser("prune", help="remove attention heads (q/k/v/out kernels shrink); the result "
                                          "fine-tunes, converts and loads like any checkpoint")
  p.add_argument("--from", dest="source", required=True,
                 help="a workdir (pretraining or fine-tuning) or a params checkpoint")
  p.add_argument("--to", dest="destination", required=True, help="directory for the params checkpoint")
  p.add_argument("--heads", help='HF prune_heads dict as JSON, e.g. \'{"0": [0, 5], "2": [1]}\'')
  p.add_argument("--fraction", type=float, help="prune this share of the heads, the least important first")
  p.add_argument("--importance", default="", help="heads.json of `bert-jax analyze heads` (or an [L, N] table)")
  p.set_defaults(handler=_prune)
