"""`bert-jax` command line: parse, build the config, call one library function.

Each sub-module registers its sub-commands with `register(subparsers)`; heavy imports happen inside
the handlers so `bert-jax --help` is instant. The training commands (pretrain, finetune, distill) all
go through `run_job`, which asks the job registry (bert_jax/jobs.py) what the config's job is. Bad input raises UserError/DataError and is printed as
one line (exit status 2), never as a traceback.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

import bert_jax
from bert_jax import startup
from bert_jax.errors import UserError
from bert_jax.data_pipelines.errors import DataError

_COMMAND_MODULES = ("presets", "pretrain", "data", "grow", "prune", "finetune", "predict", "embed", "convert",
                    "analyze", "compress", "config", "compile")


class _DefaultsFormatter(argparse.HelpFormatter):
  """Help that ends each option's text with its default, where it has one worth showing."""

  def _get_help_string(self, action):
    text = action.help or ""
    if action.required or action.default in (None, False, argparse.SUPPRESS) or "%(default)" in text:
      return text
    return f"{text} (default: %(default)s)"


def _show_defaults(parser: argparse.ArgumentParser) -> None:
  """Every sub-command's help lists its defaults."""
  for action in parser._actions:  # pylint: disable=protected-access
    if isinstance(action, argparse._SubParsersAction):  # pylint: disable=protected-access
      for sub in action.choices.values():
        sub.formatter_class = _DefaultsFormatter
        for option in sub._actions:  # pylint: disable=protected-access
          if option.help is None and option.default not in (None, False, argparse.SUPPRESS):
            option.help = "default: %(default)s"
        _show_defaults(sub)


_EPILOG = """first steps:
  bert-jax presets                      every config's presets: sizes, sequence length, what each is for
  bert-jax pretrain --config configs/bert.py:demo --workdir runs/demo     (a CPU, a few minutes)
  bert-jax finetune --config configs/glue.py:embedded --config.init_from=runs/demo --workdir runs/demo-ft
  bert-jax config show --config configs/bert.py:base                      (every field of a preset)

A config is FILE:PRESET; change any field with --config.SECTION.KEY=VALUE (docs/reference/configuration.md).
`bert-jax COMMAND --help` describes a command."""


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(prog="bert-jax", description=bert_jax.__doc__.strip(), epilog=_EPILOG,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--version", action="version", version=f"bert-jax {bert_jax.__version__}")
  subparsers = parser.add_subparsers(dest="command", required=True)
  for name in _COMMAND_MODULES:
    importlib.import_module(f"bert_jax.cli.{name}").register(subparsers)
  _show_defaults(parser)
  return parser


def split_config_overrides(argv):
  """Separates `--config.a.b=v` / `--config.a.b v` overrides from the other arguments."""
  rest, overrides = [], []
  i = 0
  while i < len(argv):
    arg = argv[i]
    if arg.startswith("--config."):
      if "=" not in arg:
        if i + 1 >= len(argv):
          raise UserError(f"{arg} needs a value: write {arg}=VALUE")
        arg = f"{arg}={argv[i + 1]}"
        i += 1
      overrides.append(arg)
    else:
      rest.append(arg)
    i += 1
  return rest, overrides


def run_job(args, command: str) -> int:
  """`bert-jax <command> --config C --workdir D`: runs the job C names (bert_jax/jobs.py), which must be
  one that <command> runs, prints the lines it ends with, and returns its exit status (143 after
  SIGTERM, 130 after Ctrl-C, their checkpoint saved). The same for every training job."""
  import jax  # pylint: disable=import-outside-toplevel
  from bert_jax import jobs  # pylint: disable=import-outside-toplevel
  from bert_jax.config_utils import load_config  # pylint: disable=import-outside-toplevel
  from bert_jax.training import distributed, loop  # pylint: disable=import-outside-toplevel
  config = load_config(args.config, args.config_overrides)
  job = jobs.for_command(config, command, args.config)
  if job.multihost:
    distributed.initialize(args.coordinator_address, args.num_processes, args.process_id)
  result = job.run(config, args.workdir)
  if jax.process_index() == 0:
    print(job.summary(config, args.workdir.rstrip("/"), result), flush=True)
  return loop.exit_code(result["stopped_by"])


def main(argv=None) -> int:
  argv = sys.argv[1:] if argv is None else list(argv)
  try:
    rest, overrides = split_config_overrides(argv)
    if rest[:2] == ["vocab", "extend"]:
      rest = ["vocab-extend", *rest[2:]]  # cli/data.py: VOCAB_EXTEND
    args = build_parser().parse_args(rest)
    args.config_overrides = overrides
    startup.configure()  # after parsing: `--help` stays instant
    result = args.handler(args)
    return int(result or 0)
  except (UserError, DataError) as e:
    print(f"bert-jax {argv[0] if argv else ''}: error: {e}", file=sys.stderr)
    return 2
  except KeyboardInterrupt:
    return 130
  except BrokenPipeError:  # `bert-jax ... | head`: the reader left; say nothing more
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 141


if __name__ == "__main__":
  sys.exit(main())
