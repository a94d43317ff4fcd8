"""Every `bert-jax` command the READMEs and the docs site's pages (docs/**/*.md) show exists in the CLI as written, so the docs cannot drift from the code.

Commands are read from the fenced and indented code blocks (line continuations joined, comments dropped,
`NAME="..."` assignments substituted into `$NAME`) and from inline code spans (`bert-jax ...` in prose and
tables). For each one: every sub-command is one of `build_parser()`'s (`a|b` alternatives each), every
`--flag` is an option of that sub-command, a code-block command with nothing elided (`...`, `[optional]`)
parses as a whole, and the `--config.KEY=VALUE` overrides of a command that names a config file load
against that config (a misspelled or missing key fails as the locked config fails). The parser is built
at test time, so sub-commands added later are checked the same way.
"""
import argparse
import functools
import glob
import os
import re
import shlex

import pytest

from bert_jax import cli
from bert_jax.config_utils import load_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# docs/log.md is the dated record: its commands are as they were run then, not maintained.
DOCS = ("README.md", "BENCHMARKS.md", os.path.join("data_pipelines", "README.md")) + tuple(sorted(
    os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True)
    if os.path.relpath(p, ROOT) != os.path.join("docs", "log.md")))
_CONFIG_FILE = re.compile(r"^configs/\w+\.py(:[\w.-]+)?$")
_ASSIGNMENT = re.compile(r'^([A-Z_][A-Z0-9_]*)=(".*"|\'.*\'|\S*)$')


def _read(doc: str) -> str:
  """A page's text, less the troubleshooting page's error catalog (error messages, not commands)."""
  text = open(os.path.join(ROOT, doc), encoding="utf-8").read()
  return re.sub(r"<!-- error catalog: start.*?<!-- error catalog: end -->", "", text, flags=re.S)


def _code_blocks(text: str) -> list[list[str]]:
  """The lines of each fenced (```) block and of each indented (4 spaces, after a blank line) block."""
  blocks, lines, i = [], text.splitlines(), 0
  while i < len(lines):
    if lines[i].lstrip().startswith("```"):
      end = next((j for j in range(i + 1, len(lines)) if lines[j].lstrip().startswith("```")), len(lines))
      blocks.append(lines[i + 1:end])
      i = end + 1
    elif lines[i].startswith("    ") and (i == 0 or not lines[i - 1].strip()):
      end = next((j for j in range(i, len(lines)) if lines[j].strip() and not lines[j].startswith("    ")),
                 len(lines))
      blocks.append([line[4:] for line in lines[i:end]])
      i = end
    else:
      i += 1
  return blocks


def _block_commands(block: list[str]) -> list[str]:
  """`bert-jax` command lines of a shell block, continuations joined and $NAME assignments substituted."""
  joined, current = [], ""
  for line in block:
    current += line.rstrip()
    if current.endswith("\\"):
      current = current[:-1] + " "
      continue
    joined.append(current.strip())
    current = ""
  joined.append(current.strip())
  variables, commands = {}, []
  for line in joined:
    assignment = _ASSIGNMENT.match(line)
    if assignment:
      variables[assignment.group(1)] = assignment.group(2).strip("\"'")
    elif line.startswith("bert-jax "):
      commands.append(re.sub(r"\$(\w+)|\$\{(\w+)\}", lambda m: variables.get(m.group(1) or m.group(2), m.group(0)),
                             line))
  return commands


def _inline_commands(text: str) -> list[str]:
  return [span.replace("\\|", "|") for span in re.findall(r"`(bert-jax\s[^`]+)`", text)]


def _examples() -> list[tuple[str, str, bool]]:
  """(where, command, from a code block) for every command the docs show."""
  found = []
  for doc in DOCS:
    text = _read(doc)
    found += [(doc, command, True) for block in _code_blocks(text) for command in _block_commands(block)]
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    found += [(doc, command, False) for command in _inline_commands(prose)]
  return found


def _tokens(command: str) -> tuple[list[str], bool]:
  """The arguments after `bert-jax`, and whether the example elides anything (`...`, `[optional]`)."""
  elided = False
  out = []
  for token in shlex.split(command, comments=True)[1:]:
    if token in ("...", "[...]"):
      elided = True
      continue
    if token.startswith("[-"):
      token, elided = token[1:], True
    if token.endswith("]") and token.count("]") > token.count("["):
      token, elided = token[:-1], True
    if token.endswith("..."):
      token, elided = token[:-3], True
    if token:
      out.append(token)
  return out, elided


@functools.cache
def _parser() -> argparse.ArgumentParser:
  return cli.build_parser()


def _subparsers(parser: argparse.ArgumentParser):
  return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)  # pylint: disable=protected-access


def _resolve(args: list[str]) -> tuple[argparse.ArgumentParser, list[str], list[str]]:
  """Walks the sub-commands; returns (the innermost parser, the chain, the arguments after it). A token
  `a|b` names several sub-commands: each must exist, and the first is followed."""
  parser, chain, rest = _parser(), [], list(args)
  while (action := _subparsers(parser)) is not None:
    assert rest, f"`bert-jax {' '.join(chain)}` needs a sub-command: one of {sorted(action.choices)}"
    names = rest.pop(0).split("|")
    unknown = [n for n in names if n not in action.choices]
    assert not unknown, f"`bert-jax {' '.join(chain)}` has no sub-command {unknown}; it has {sorted(action.choices)}"
    chain.append(names[0])
    parser = action.choices[names[0]]
  return parser, chain, rest


def _check_config_overrides(args: list[str]) -> None:
  rest, overrides = cli.split_config_overrides(args)
  if "--config" not in rest or not overrides:
    return
  config = rest[rest.index("--config") + 1]
  if not _CONFIG_FILE.match(config):
    return  # a placeholder (C, FILE:ARG): nothing to load
  real = [o for o in overrides if not re.match(r"--config\.[A-Z]", o)]  # --config.SECTION.KEY=VALUE is a pattern
  load_config(config, real)


def _check(command: str, from_block: bool) -> None:
  args, elided = _tokens(command)
  parser, chain, rest = _resolve(args)
  rest_no_overrides, _ = cli.split_config_overrides(rest)
  options = parser._option_string_actions  # pylint: disable=protected-access
  for token in rest_no_overrides:
    if token.startswith("--"):
      flag = token.split("=", 1)[0]
      assert flag in options, f"`bert-jax {' '.join(chain)}` has no option {flag}; it has {sorted(options)}"
  if from_block and not elided:
    try:
      _parser().parse_args(cli.split_config_overrides(args)[0])
    except SystemExit as e:
      raise AssertionError(f"does not parse (exit {e.code})") from None
  _check_config_overrides(rest)


EXAMPLES = _examples()
DOC_TEXT = "\n".join(_read(doc) for doc in DOCS)


def _keys(tree: dict, prefix: str = "") -> set[str]:
  out = set()
  for key, value in tree.items():
    out.add(prefix + key)
    if isinstance(value, dict):
      out |= _keys(value, f"{prefix}{key}.")
  return out


@functools.cache
def _known_keys() -> frozenset:
  """Every key of every config the docs name (FILE:PRESET) and of each config file's default preset."""
  files = {f"configs/{name}" for name in os.listdir(os.path.join(ROOT, "configs")) if name.endswith(".py")
           and "def get_config" in open(os.path.join(ROOT, "configs", name), encoding="utf-8").read()}
  specs = {spec for spec in re.findall(r"configs/\w+\.py:[\w.-]*\w(?![\w<-])", DOC_TEXT)
           if spec.split(":")[0] in files and not spec.split(":")[1].isupper()}  # not general-<size>, glue.py:TASK
  specs |= files
  keys = set()
  for spec in specs:
    keys |= _keys(load_config(spec, []).to_dict())
  return frozenset(keys)


def test_the_docs_show_commands():
  """The extraction itself: enough commands found, from blocks and prose, across the sub-commands."""
  assert sum(from_block for _, _, from_block in EXAMPLES) >= 30 and sum(not b for _, _, b in EXAMPLES) >= 20
  assert len({_resolve(_tokens(c)[0])[1][0] for _, c, _ in EXAMPLES}) >= 12


@pytest.mark.parametrize("where, command, from_block", EXAMPLES,
                         ids=[f"{w}:{c[:60]}" for w, c, _ in EXAMPLES])
def test_command_exists_as_written(where, command, from_block, capsys):
  try:
    _check(command, from_block)
  except (AssertionError, Exception) as e:  # a config that does not load raises UserError/KeyError
    pytest.fail(f"{where}: `{command}`: {e} {capsys.readouterr().err.strip()}")


def test_config_keys_in_prose_exist():
  """`--config.KEY=VALUE` shown outside a command names a key of some config the docs name."""
  mentions = {m for span in re.findall(r"`([^`]*--config\.[^`]*)`", DOC_TEXT)
              for m in re.findall(r"--config\.([\w.]+)", span) if not m[0].isupper()}
  assert len(mentions) >= 8
  unknown = sorted(m for m in mentions if m not in _known_keys())
  assert not unknown, f"no config has {unknown}"


def test_a_drifted_command_is_caught():
  """The checks can fail: an unknown sub-command, flag or config key, and a command missing a required flag."""
  for command, from_block in (("bert-jax pretrian --config C --workdir D", True),
                              ("bert-jax info --config C --jsn", False),
                              ("bert-jax pretrain --config configs/bert.py:demo --workdir D --config.train.num_step=5", True),
                              ("bert-jax pretrain --config configs/bert.py:demo", True)):
    with pytest.raises(Exception):
      _check(command, from_block)


def test_readme_demo_figures_are_what_ci_checks():
  """Every figure README gives for the demo run and its fine-tuning is one that tests/readme_demo_check.py
  (run by .ci/run on the real runs) reads and compares: the sample output block's losses and accuracies at
  the logged steps and both evaluations, the fine-tuning dev accuracy and its chance level; and README's
  learning criteria and fine-tuning recipe are the check's and the config's. Rows built from README's own
  figures pass; one figure moved past the tolerance fails, and so do missing rows."""
  import readme_demo_check as check  # pylint: disable=import-outside-toplevel
  sample = check.readme_sample()
  assert [(step, is_eval) for step, is_eval, _ in sample][-2:] == [(1200, False), (1200, True)]
  assert all(len(figures) >= 5 for *_, figures in sample)
  rows = [{"step": step, **({"eval": True} if is_eval else {}), **figures} for step, is_eval, figures in sample]
  assert check.check_sample(rows, sample) == []
  rows[-1]["mlm_accuracy"] += 1.5 * check.ACCURACY_TOLERANCE
  assert [line.split(":")[0] for line in check.check_sample(rows, sample)] == ["eval at step 1200 mlm_accuracy"]
  del rows[0]
  assert len(check.check_sample(rows, sample)) == 1 + len(sample[0][2])
  accuracy, chance = check.readme_finetune_figures()
  assert 0.5 < chance < accuracy < 1
  prose = " ".join(DOC_TEXT.split())
  for name, bound in check.CRITERIA.items():
    words = {"first train loss (steps 1-50) at least": "first train loss >=",
             "last train loss (steps 1151-1200) at most": "last train loss <=",
             "last train mlm_accuracy at least": "last train MLM accuracy >=",
             "final eval mlm_accuracy at least": "final held-out MLM accuracy >="}[name]
    assert f"{words} {bound:g}" in prose, (words, bound)
  c = load_config("configs/glue.py:embedded", [])
  steps = int(c.task.num_train // c.train.batch_size * c.train.epochs)
  lr = f"{c.optimizer.learning_rate:.0e}".replace("e-0", "e-")
  assert (f"{c.task.num_train:,} training and {c.task.num_dev} dev sentences, length {c.data.max_seq_length}, "
          f"batch {c.train.batch_size}, {c.train.epochs:g} epochs, lr {lr} ({steps} steps)") in prose
