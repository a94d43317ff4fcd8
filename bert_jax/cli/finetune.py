"""`bert-jax finetune` and `bert-jax sweep`: thin wrappers over bert_jax.finetune."""
from __future__ import annotations


def _finetune(args):
  from bert_jax import cli  # pylint: disable=import-outside-toplevel
  return cli.run_job(args, "finetune")


def _sweep(args):
  from bert_jax import jobs  # pylint: disable=import-outside-toplevel
  from bert_jax.config_utils import load_config  # pylint: disable=import-outside-toplevel
  from bert_jax.errors import UserError  # pylint: disable=import-outside-toplevel
  from bert_jax.finetune import sweep  # pylint: disable=import-outside-toplevel
  from bert_jax.training import loop  # pylint: disable=import-outside-toplevel
  config = load_config(args.config, args.config_overrides)
  if jobs.for_command(config, "finetune", args.config).name != "finetune":  # a sweep runs fine-tuning runs
    raise UserError(f"{args.config} is not a fine-tuning config: bert-jax sweep runs configs of job finetune "
                    "(configs/glue.py, squad.py, ner.py)")
  result = sweep.sweep(config, args.workdir)
  if result["stopped_by"]:
    print(f"stopped by {result['stopped_by']} | the interrupted run's state is saved | next: the same command "
          "continues the sweep", flush=True)
    return loop.exit_code(result["stopped_by"])
  print(result["table"])
  print(f"done: every run in {args.workdir.rstrip('/')}/<setting>/seed<N>, the table and tests in "
        f"{args.workdir.rstrip('/')}/sweep_results.json", flush=True)
  return 0


def register(subparsers) -> None:
  p = subparsers.add_parser("finetune", help="fine-tune on GLUE, SQuAD, NER or the embedded task")
  p.add_argument("--config", required=True, help="e.g. configs/glue.py:rte, configs/squad.py:v2")
  p.add_argument("--workdir", required=True)
  p.set_defaults(handler=_finetune)

  p = subparsers.add_parser("sweep", help="grid over lr x batch x epochs x seeds with successive halving")
  p.add_argument("--config", required=True, help="the task's fine-tuning config; grid in config.sweep")
  p.add_argument("--workdir", required=True, help="one sub-directory per run, plus sweep_results.json")
  p.set_defaults(handler=_sweep)
