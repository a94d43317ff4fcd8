"""`bert-jax finetune` and `bert-jax sweep`: thin wrappers over bert_jax.finetune."""
from __future__ import annotations

import json


def _finetune(args):
  from bert_jax.config_utils import load_config  # pylint: disable=import-outside-toplevel
  from bert_jax.finetune import trainer  # pylint: disable=import-outside-toplevel
  results = trainer.finetune(load_config(args.config, args.config_overrides), args.workdir)
  print(json.dumps(results, indent=1, sort_keys=True))


def _sweep(args):
  from bert_jax.config_utils import load_config  # pylint: disable=import-outside-toplevel
  from bert_jax.finetune import sweep  # pylint: disable=import-outside-toplevel
  print(sweep.sweep(load_config(args.config, args.config_overrides), args.workdir))


def register(subparsers) -> None:
  p = subparsers.add_parser("finetune", help="fine-tune on GLUE, SQuAD, NER or the embedded task")
  p.add_argument("--config", required=True, help="e.g. configs/glue.py:rte, configs/squad.py:v2")
  p.add_argument("--workdir", required=True)
  p.set_defaults(handler=_finetune)

  p = subparsers.add_parser("sweep", help="grid over lr x batch x epochs x seeds with successive halving")
  p.add_argument("--config", required=True, help="the task's fine-tuning config; grid in config.sweep")
  p.add_argument("--workdir", required=True, help="one sub-directory per run, plus sweep_results.json")
  p.set_defaults(handler=_sweep)
