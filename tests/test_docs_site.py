"""The documentation site (mkdocs.yml, docs/): its nav and pages agree, the API page covers `bert_jax.__all__`
with objects that exist, the troubleshooting page's catalog holds every UserError of the source, the pages'
snippet includes name sections that exist, README stays a front page whose two commands CI runs, and (weekly,
or wherever mkdocs is installed and BERT_JAX_SLOW_TESTS is set) `mkdocs build --strict` passes.
The commands the pages show are checked by tests/test_readme_commands.py."""
import glob
import importlib
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

import docs_site_check
import error_catalog
from core_helpers import slow

import bert_jax

ROOT = docs_site_check.ROOT
DOCS = os.path.join(ROOT, "docs")


def _read(path: str) -> str:
  with open(os.path.join(ROOT, path), encoding="utf-8") as f:
    return f.read()


def test_the_nav_and_the_pages_agree():
  nav = docs_site_check.nav_pages()
  assert len(nav) >= 12 and len(nav) == len(set(nav))
  missing = [page for page in nav if not os.path.exists(os.path.join(DOCS, page))]
  assert not missing, f"mkdocs.yml's nav names pages that do not exist: {missing}"
  pages = sorted(os.path.relpath(p, DOCS) for p in glob.glob(os.path.join(DOCS, "**", "*.md"), recursive=True))
  left_out = [page for page in pages if page not in nav]
  assert not left_out, f"pages missing from mkdocs.yml's nav (add them there): {left_out}"


def test_the_api_page_documents_every_public_name():
  """One `## name` heading and one `::: module.name` directive per member of __all__, each naming an object
  that exists; a class there is the very object `bert_jax.NAME` gives."""
  assert docs_site_check.public_api() == bert_jax.__all__
  assert {"load_pretrained", "load_tokenizer", "Predictor", "Embedder"} <= set(bert_jax.__all__)
  page = _read("docs/reference/api.md")
  directives = dict((target.rsplit(".", 1)[1], target) for target in re.findall(r"^::: ([\w.]+)$", page, re.M))
  headings = re.findall(r"^## (\w+)$", page, re.M)
  assert headings == bert_jax.__all__ and sorted(directives) == sorted(bert_jax.__all__)
  for name, target in directives.items():
    module, attr = target.rsplit(".", 1)
    documented = getattr(importlib.import_module(module), attr)
    assert documented.__doc__ and len(documented.__doc__.split()) >= 8, f"{target} has too short a docstring"
    if isinstance(documented, type):
      assert getattr(bert_jax, name) is documented, target
    else:
      assert callable(getattr(bert_jax, name)), name


def test_the_troubleshooting_page_lists_every_user_error():
  page = _read("docs/troubleshooting.md")
  assert error_catalog.with_catalog(page) == page, \
      "docs/troubleshooting.md is out of date: python3 tests/error_catalog.py docs/troubleshooting.md"
  found = error_catalog.catalog()
  assert sum(map(len, found.values())) >= 400 and "bert_jax/config_utils.py" in found
  # the line a misspelled --config key gives, as the page shows it
  assert "- `unknown config key {key}{_did_you_mean(config, key)}; known keys here: {known}`" in page


def test_the_catalog_reads_messages_as_written(tmp_path):
  """f-strings keep their fields, concatenations join, a returned UserError counts like a raised one."""
  source = tmp_path / "m.py"
  source.write_text('from bert_jax.errors import UserError\n'
                    'def f(path, n):\n'
                    '  if n:\n'
                    '    raise UserError(f"{path}: {n} rows, "\n'
                    '                    "need more")\n'
                    '  return UserError("plain " + f"and {path!r}")\n')
  assert error_catalog.messages(str(source)) == ["{path}: {n} rows, need more", "plain and {path}"]


def test_snippet_includes_name_sections_that_exist():
  includes = []
  for path in glob.glob(os.path.join(DOCS, "**", "*.md"), recursive=True):
    includes += re.findall(r'^--8<-- "([^"]+)"$', open(path, encoding="utf-8").read(), re.M)
  assert {"README.md:commands", "README.md:demo", "README.md:finetune", "BENCHMARKS.md"} <= set(includes)
  for include in includes:
    file, _, section = include.partition(":")
    text = _read(file)
    if section:
      assert text.count(f"--8<-- [start:{section}]") == 1 and text.count(f"--8<-- [end:{section}]") == 1, include


def test_the_readme_is_a_front_page_whose_commands_ci_runs():
  readme = _read("README.md")
  assert len(readme.splitlines()) <= 250
  first_block = re.search(r"^```bash\n(.*?)^```", readme, re.M | re.S).group(1)
  commands = [line for line in first_block.splitlines() if line.strip() and not line.startswith("#")]
  assert len(commands) == 2 and commands[0].endswith("bert-jax pretrain --config configs/bert.py:demo --workdir runs/demo")
  section = readme[readme.index("\n## Fine-tuning\n"):]
  assert re.search(r"^bert-jax finetune .*--config.init_from=runs/demo --workdir runs/demo-ft$", section, re.M)
  for page in re.findall(r"\]\((docs/[^)#]+\.md)", readme):  # the feature table's links into the site
    assert os.path.exists(os.path.join(ROOT, page)), page


def test_benchmarks_has_one_table_per_subject_with_commands_and_dates():
  """Each subject's section gives its figures with a command and a date: in the house layout a table whose
  last two columns are `command | date`, each row filled in (sections appended in another layout must still
  name a command in backticks and a date)."""
  text = _read("BENCHMARKS.md")
  sections = re.split(r"^## ", text, flags=re.M)[1:]
  assert len(sections) >= 12
  tables = 0
  for section in sections:
    title = section.splitlines()[0]
    assert re.search(r"\d{4}-\d\d-\d\d", section) and re.search(r"`(bert-jax|python3?|BERT_JAX\w*=|XLA_FLAGS=)[^`]*`",
                                                                 section), title
    rows = [r for r in re.findall(r"^\|(.+)\|$", section, re.M) if not set(r) <= set("-| ")]
    if rows and rows[0].split("|")[-2:] == [" command ", " date "]:
      tables += 1
      for row in rows[1:]:
        command, date = row.split("|")[-2:]
        assert command.strip() and re.match(r" (\d{4}-\d\d-\d\d|-)", date), (title, row)
  assert tables >= 12


@slow
@pytest.mark.skipif(shutil.which("mkdocs") is None, reason="needs the docs extra: pip install -e '.[docs]'")
def test_the_site_builds_strict(tmp_path):
  site = tmp_path / "site"
  subprocess.run(["mkdocs", "build", "--strict", "--site-dir", str(site)], cwd=ROOT, check=True,
                 capture_output=True, timeout=600)
  assert docs_site_check.problems(str(site)) == []


def test_the_documented_outputs_of_cheap_commands(capsys):
  """The configuration page's figures are what the commands print: `bert-jax info` for BERT-large on an
  fsdp=8 mesh (parameters, and bytes per device of parameters and AdamW state), and `bert-jax presets`'
  layers and hidden sizes for the presets table."""
  from bert_jax import cli  # pylint: disable=import-outside-toplevel
  page = " ".join(_read("docs/reference/configuration.md").split())
  assert "`bert-jax info --config configs/bert.py:large --config.mesh.fsdp=8`" in page
  millions = int(re.search(r"(\d+)M for BERT-large", page).group(1))
  params_mib, adam_mib = map(int, re.search(r"(\d+) MiB of parameters and (\d+) MiB of AdamW state", page).groups())
  assert cli.main(["info", "--json", "--config", "configs/bert.py:large", "--config.mesh.fsdp=8"]) == 0
  info = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert (round(info["num_params"] / 1e6), round(info["param_bytes_per_device"] / 2**20),
          round(info["optimizer_bytes_per_device"] / 2**20)) == (millions, params_mib, adam_mib)
  assert cli.main(["presets", "bert", "--json"]) == 0
  presets = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
  documented = dict((name, (int(layers), int(hidden))) for name, layers, hidden in
                    re.findall(r"`(\w+)` \(L(\d+)/H(\d+)\)", page))
  assert len(documented) >= 6
  assert documented == {p["preset"]: (p["layers"], p["hidden"]) for p in presets if p["preset"] in documented}
