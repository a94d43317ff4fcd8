"""ARCHITECTURE.md stays one page and true where a test can read it: the registries table's modules and names
exist, the family hooks it lists are the record's fields, and the run driver is the only place the loop and the
metrics logger are built."""
import dataclasses
import importlib
import os
import re

from bert_jax.models import families

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "bert_jax")


def _text() -> str:
  with open(os.path.join(ROOT, "ARCHITECTURE.md"), encoding="utf-8") as f:
    return f.read()


def test_it_is_one_page():
  assert len(_text().splitlines()) <= 70


def test_the_registries_table_names_modules_and_names_that_exist():
  rows = [line.split("|")[2] for line in _text().splitlines() if line.startswith("| ") and ".py" in line]
  places = [m for row in rows for m in re.findall(r"`([\w/]+\.py)(?::(\w+))?`", row)]
  assert len(rows) >= 8 and len(places) >= 12
  for path, name in places:
    assert os.path.isfile(os.path.join(PACKAGE, path)), path
    if name:
      module = importlib.import_module("bert_jax." + path[:-3].replace("/", "."))
      assert hasattr(module, name), f"{path}:{name}"


def test_the_family_hooks_it_lists_are_the_records_fields():
  text = " ".join(_text().split())
  sentence = re.search(r"capabilities as hooks: (.*?) and its tokenizer kind", text).group(1)
  hooks = re.findall(r"`(\w+)`", sentence)
  fields = {f.name for f in dataclasses.fields(families.Family)}
  assert len(hooks) >= 8 and set(hooks) <= fields, set(hooks) - fields


def test_the_driver_alone_builds_the_loop_and_the_metrics_logger():
  built = {"Loop(": [], "MetricsLogger(": []}
  for folder, _, files in os.walk(PACKAGE):
    for name in (f for f in files if f.endswith(".py")):
      path = os.path.join(folder, name)
      with open(path, encoding="utf-8") as f:
        for line in f:
          for call in built:
            if re.search(rf"(?<![\w]){re.escape(call)}", line) and not line.lstrip().startswith(("class ", "#")):
              built[call].append(os.path.relpath(path, PACKAGE))
  assert built == {"Loop(": ["training/driver.py"], "MetricsLogger(": ["training/driver.py"]}, built
