"""`bert-jax presets`: the presets of every config file, with their sizes and what each is for."""
from __future__ import annotations

import json


def _presets(args) -> int:
  from bert_jax import presets  # pylint: disable=import-outside-toplevel
  rows = presets.list_presets(tuple(args.files))
  print("\n".join(json.dumps(r) for r in rows) if args.json else presets.format_presets(rows))
  return 0


def register(subparsers) -> None:
  p = subparsers.add_parser("presets", help="list the configs' presets: family, layers, hidden size, parameters, "
                                            "sequence length, schedule and what each is for")
  p.add_argument("files", nargs="*", help="config files to list: bert, configs/bert.py, or one preset: "
                                           "configs/bert.py:tiny (default: all)")
  p.add_argument("--json", action="store_true", help="one JSON object per preset")
  p.set_defaults(handler=_presets)
