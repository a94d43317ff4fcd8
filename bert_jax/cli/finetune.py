"""`bert-jax finetune` and `bert-jax sweep`: thin wrappers over bert_jax.finetune."""
from __future__ import annotations


def _finetune(args):
  from bert_jax.config_utils import load_config  # pylint: disable=import-outside-toplevel
  from bert_jax.finetune import trainer  # pylint: disable=import-outside-toplevel
  config = load_config(args.config, args.config_overrides)
  result = trainer.finetune(config, args.workdir)
  print(summary(config, args.workdir.rstrip("/"), result), flush=True)
  return stop_code(result)


def stop_code(result: dict) -> int:
  """The exit status of a job: 143 after SIGTERM, 130 after Ctrl-C (its checkpoint saved), else 0."""
  return {"SIGTERM": 143, "Ctrl-C": 130}.get(result.get("stopped_by"), 0)


def summary(config, workdir: str, result: dict) -> str:
  """The lines a fine-tuning (or task distillation) run ends with: its final dev metrics, where its
  outputs are and the next command; or where it stopped and how to resume; or that it had finished."""
  if result["stopped_by"]:
    return (f"stopped at step {result['step']}/{result['num_steps']} by {result['stopped_by']} | train state in "
            f"{workdir}/state | next: the same command resumes")
  lines = []
  best = (f"best dev {result['score']} {result['best_score']:.4g} at step {result['best_step']}"
          if result.get("best_score") is not None else "no evaluation during training")
  if result["finished_before"]:
    lines.append(f"{workdir}: this run finished at step {result['step']} of {result['num_steps']} ({best}); "
                 "nothing to train. To train it again from the start: the same command with "
                 f"--config.train.restart=true (this run's files move to {workdir}/previous-<n>/)")
  shown = [f"dev {k} {v:.4g}" for k, v in result["dev"].items()]
  if result.get("stopped_early"):
    shown.insert(0, f"stopped early at step {result['step']} of {result['num_steps']} ({best})")
  if config.eval_only:
    if config.predict_split:
      shown.append(f"predictions in {workdir}/predictions")
    lines.append(f"done: {' | '.join(shown)} | next: bert-jax predict --model {config.init_from} --input FILE")
    return "\n".join(lines)
  shown.append(f"params in {workdir} ({'the best evaluation' if config.train.keep_best else 'the last step'})")
  if config.predict_split:
    shown.append(f"predictions in {workdir}/predictions")
  lines.append(f"done: {' | '.join(shown)} | next: bert-jax predict --model {workdir} --input FILE")
  return "\n".join(lines)


def _sweep(args):
  from bert_jax.config_utils import load_config  # pylint: disable=import-outside-toplevel
  from bert_jax.finetune import sweep  # pylint: disable=import-outside-toplevel
  result = sweep.sweep(load_config(args.config, args.config_overrides), args.workdir)
  if result["stopped_by"]:
    print(f"stopped by {result['stopped_by']} | the interrupted run's state is saved | next: the same command "
          "continues the sweep", flush=True)
    return stop_code(result)
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
