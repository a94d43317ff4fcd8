"""`bert-jax finetune` and `bert-jax sweep`: thin wrappers over bert_jax.finetune."""
from __future__ import annotations

import json


def _finetune(args):
  from bert_jax.config_utils import load_config  # pylint: disable=import-outside-toplevel
  from bert_jax.finetune import trainer  # pylint: disable=import-outside-toplevel
  config = load_config(args.config, args.config_overrides)
  results = trainer.finetune(config, args.workdir)
  print(json.dumps(results, indent=1, sort_keys=True))
  print(_summary(config, args.config, args.workdir.rstrip("/"), results), flush=True)


def _summary(config, spec: str, workdir: str, results: dict) -> str:
  """The line a run ends with: its final metrics, where its outputs are, the next command."""
  shown = [f"dev {k} {v:.4g}" for k, v in results.items()]
  if not config.eval_only:
    shown.append(f"params in {workdir} ({'the best evaluation' if config.train.keep_best else 'the last step'})")
  if config.predict_split:
    shown.append(f"predictions in {workdir}/predictions")
  return (f"done: {' | '.join(shown)} | next: bert-jax finetune --config {spec} --config.init_from={workdir} "
          f"--config.eval_only=true --config.predict_split=test --workdir {workdir}-test")


def _sweep(args):
  from bert_jax.config_utils import load_config  # pylint: disable=import-outside-toplevel
  from bert_jax.finetune import sweep  # pylint: disable=import-outside-toplevel
  print(sweep.sweep(load_config(args.config, args.config_overrides), args.workdir))
  print(f"done: every run in {args.workdir.rstrip('/')}/<setting>/seed<N>, the table and tests in "
        f"{args.workdir.rstrip('/')}/sweep_results.json", flush=True)


def register(subparsers) -> None:
  p = subparsers.add_parser("finetune", help="fine-tune on GLUE, SQuAD, NER or the embedded task")
  p.add_argument("--config", required=True, help="e.g. configs/glue.py:rte, configs/squad.py:v2")
  p.add_argument("--workdir", required=True)
  p.set_defaults(handler=_finetune)

  p = subparsers.add_parser("sweep", help="grid over lr x batch x epochs x seeds with successive halving")
  p.add_argument("--config", required=True, help="the task's fine-tuning config; grid in config.sweep")
  p.add_argument("--workdir", required=True, help="one sub-directory per run, plus sweep_results.json")
  p.set_defaults(handler=_sweep)
