"""`bert-jax config show`: the resolved config (file, preset and overrides), checked against its job's schema
(bert_jax/config_schema.py), without running anything; `--fields`: each field with what it allows and means."""
from __future__ import annotations

import json

from bert_jax.errors import UserError


def _show(args) -> int:
  from bert_jax import config_schema  # pylint: disable=import-outside-toplevel
  from bert_jax.config_utils import load_config  # pylint: disable=import-outside-toplevel
  config = load_config(args.config, args.config_overrides)
  schema = config_schema.SCHEMAS.get(config.get("job"))
  if schema is not None:
    schema.check(config)  # a bad value: one line, as the job would stop with
  if args.fields:
    if schema is None:
      raise UserError(f"{args.config}: job={config.get('job')!r} is not one of {tuple(config_schema.SCHEMAS)}; "
                      "--fields reads the schema of the config's job")
    print("\n".join(schema.described(config)))
  else:
    print(json.dumps(config.to_dict(), indent=2, sort_keys=True, default=str))
  return 0


def register(subparsers) -> None:
  p = subparsers.add_parser("config", help="look at configs")
  sub = p.add_subparsers(dest="config_command", required=True)
  show = sub.add_parser("show", help="print the resolved config as JSON (what config.json of a run would hold), "
                                     "checked against its job's schema")
  show.add_argument("--config", required=True, help="config file and preset, e.g. configs/bert.py:base; "
                                                     "override fields with --config.train.batch_size=64")
  show.add_argument("--fields", action="store_true", help="one line per field: its value, what it allows and "
                                                          "what it means for this job")
  show.set_defaults(handler=_show)
