"""What a fresh `pip install -e .` must be enough for (issue: the README's first command failed on a
new machine because `tokenizers` was only a test extra).

- Every module the runtime imports (bert_jax/, configs/, data_pipelines/; any function, any depth) is
  the standard library's, the project's own, or provided by a distribution in `install_requires`.
  Optional packages are loaded through `bert_jax.errors.require`, which names the extra to install.
- The embedded corpus, vocabulary and a short pretraining run work with the test-only packages
  (torch, transformers, scikit-learn) made unimportable (`tokenizers` is a runtime package now: it reads
  tokenizer.json files).
"""
import ast
import importlib.metadata
import os
import pathlib
import re
import subprocess
import sys
import textwrap
import threading
import time

from core_helpers import slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNTIME_DIRS = ("bert_jax", "configs", "data_pipelines")
TEST_ONLY = ("torch", "transformers", "sklearn")
# Files the runtime copies into exports and never imports: they run under transformers, elsewhere.
SHIPPED_NOT_IMPORTED = {os.path.join("bert_jax", "conversion", "hf_adapter_modeling.py")}


def _install_requires() -> set[str]:
  setup = open(os.path.join(ROOT, "setup.py"), encoding="utf-8").read()
  block = setup[setup.index("install_requires=["):]
  block = block[:block.index("],")]
  names = re.findall(r'"([A-Za-z0-9_.\-]+)', block)
  return {re.sub(r"[-_.]+", "-", n).lower() for n in names}


def _parse(path):
  """ast.parse, retried: CPython 3.11's AST constructor keeps its recursion depth in state that another
  thread compiling at the same moment can disturb ("AST constructor recursion depth mismatch",
  cpython#106905); background threads of earlier tests in this worker (gcsfs retries, TF) do compile."""
  source = open(path, encoding="utf-8").read()
  for attempt in range(3):
    try:
      return ast.parse(source)
    except SystemError:
      if attempt == 2:
        raise
  raise AssertionError("unreachable")


def _imported_modules():
  for directory in RUNTIME_DIRS:
    for dirpath, _, names in os.walk(os.path.join(ROOT, directory)):
      for name in names:
        if not name.endswith(".py"):
          continue
        path = os.path.join(dirpath, name)
        if os.path.relpath(path, ROOT) in SHIPPED_NOT_IMPORTED:
          continue
        for node in ast.walk(_parse(path)):
          if isinstance(node, ast.Import):
            for alias in node.names:
              yield path, alias.name
          elif isinstance(node, ast.ImportFrom) and node.module:
            yield path, ("bert_jax." if node.level else "") + node.module  # relative: the project's own


def test_every_runtime_import_is_installed_by_install_requires():
  required = _install_requires()
  providers = importlib.metadata.packages_distributions()
  problems = []
  imported = list(_imported_modules())  # parsing every runtime file is most of this test's time: once
  for path, name in imported:
    module = name.split(".")[0]
    if module in sys.stdlib_module_names or module in ("bert_jax", "__future__"):
      continue
    dists = {re.sub(r"[-_.]+", "-", d).lower() for d in providers.get(module, [])}
    if not dists & required:
      problems.append(f"{os.path.relpath(path, ROOT)} imports {module} (from {sorted(dists) or '?'})")
  assert not problems, "not in install_requires:\n" + "\n".join(sorted(set(problems)))
  shipped = {os.path.splitext(os.path.basename(p))[0] for p in SHIPPED_NOT_IMPORTED}
  importers = [p for p, name in imported if set(name.split(".")) & shipped]
  assert not importers, f"{importers} import a file that only exports ship"


@slow  # an end-to-end chain; its parts are tested in the suite (BERT_JAX_SLOW_TESTS=1)
def test_the_demo_path_runs_without_test_only_packages(tmp_path):
  """The embedded corpus and vocabulary are built from scratch and a few demo steps run, with the
  test extras blocked at import time (as on a machine that ran only `pip install -e .`)."""
  script = textwrap.dedent(f"""
      import sys
      class Block:
        def find_spec(self, name, path=None, target=None):
          if name.split(".")[0] in {TEST_ONLY!r}:
            raise ImportError("blocked for this test: " + name)
      sys.meta_path.insert(0, Block())
      from bert_jax.cli import main
      sys.exit(main(["pretrain", "--config", "configs/bert.py:demo", "--workdir", {str(tmp_path / "run")!r},
                     "--config.train.num_steps=4", "--config.train.log_every_steps=2",
                     "--config.train.eval_every_steps=4", "--config.train.eval_steps=1",
                     "--config.checkpoint.every_steps=4"]))
      """)
  env = {**os.environ, "BERT_JAX_CACHE": str(tmp_path / "cache"), "HOME": str(tmp_path / "home")}
  result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "step 4/4" in result.stdout and "eval at step 4" in result.stdout, result.stdout
  assert os.listdir(tmp_path / "cache")  # the embedded corpus and vocabulary were built here


@slow  # two cold builds of the corpus and vocabulary, a few minutes on 2 cores
def test_embedded_vocabulary_is_byte_identical_across_processes(tmp_path):
  """Two fresh builds in separate processes (different hash seeds) write the same vocab.txt bytes."""
  built = []
  for seed in ("1", "2"):
    cache = tmp_path / f"cache{seed}"
    code = "from bert_jax.data_pipelines import embedded; print(embedded.ensure_embedded()[1])"
    result = subprocess.run([sys.executable, "-c", code], env={**os.environ, "BERT_JAX_CACHE": str(cache),
                                                               "PYTHONHASHSEED": seed},
                            capture_output=True, text=True, timeout=600, check=True)
    built.append(open(result.stdout.strip().splitlines()[-1], "rb").read())
  assert built[0] == built[1]
  assert built[0].startswith(b"[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n")
  assert 5000 < built[0].count(b"\n") <= 8192


def test_concurrent_builders_build_a_cached_file_or_folder_once(tmp_path):
  """embedded.build_once: of two builders started together, one builds and the other waits for its copy (two
  test workers did build the embedded corpus and vocabulary twice, ~30 s each); a builder's staging folder goes."""
  from bert_jax.data_pipelines import embedded  # pylint: disable=import-outside-toplevel
  calls, results = [], []

  def build(staging):  # a folder of one file, slow enough for the second builder to arrive while it runs
    calls.append(staging)
    time.sleep(0.5)
    (pathlib.Path(staging) / "vocab.txt").write_text("[PAD]\n")

  def build_file(staging):
    calls.append(staging)
    (pathlib.Path(staging) / "spm.model").write_bytes(b"model")
    return os.path.join(staging, "spm.model")

  threads = [threading.Thread(target=lambda: results.append(embedded.build_once(str(tmp_path / "v"), build)))
             for _ in range(2)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert results == [str(tmp_path / "v")] * 2 and len(calls) == 1
  assert (tmp_path / "v" / "vocab.txt").read_text() == "[PAD]\n"
  assert embedded.build_once(str(tmp_path / "m.model"), build_file, "learning") == str(tmp_path / "m.model")
  assert (tmp_path / "m.model").read_bytes() == b"model" and len(calls) == 2
  assert embedded.build_once(str(tmp_path / "m.model"), build_file) == str(tmp_path / "m.model") and len(calls) == 2
  assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")) == ["m.model", "v"]
