"""`bert-jax config show`: the resolved config (file, preset and overrides), without running anything."""
from __future__ import annotations

import json


def _show(args) -> int:
  from bert_jax.config_utils import load_config  # pylint: disable=import-outside-toplevel
  config = load_config(args.config, args.config_overrides)
  print(json.dumps(config.to_dict(), indent=2, sort_keys=True, default=str))
  return 0


def register(subparsers) -> None:
  p = subparsers.add_parser("config", help="look at configs")
  sub = p.add_subparsers(dest="config_command", required=True)
  show = sub.add_parser("show", help="print the resolved config as JSON (what config.json of a run would hold)")
  show.add_argument("--config", required=True, help="config file and preset, e.g. configs/bert.py:base; "
                                                     "override fields with --config.train.batch_size=64")
  show.set_defaults(handler=_show)
