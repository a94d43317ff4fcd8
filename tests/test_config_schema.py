"""The one schema of the shared config blocks: every preset of every job satisfies it, a bad value is one
line naming the field and what it allows, a quantity in two units follows one rule in every job, and the
docs site's config reference (docs/reference/configuration.md) is the schema's table."""
import glob
import os
import re

import ml_collections
import pytest

from bert_jax import cli, config_schema, jobs
from bert_jax.config_utils import load_config, load_config_file
from bert_jax.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRESETS = [f"configs/bert.py:{p}" for p in ("tiny", "mini", "small", "medium", "base", "large", "demo")] + [
    f"configs/{f}.py:{p}" for f in ("roberta", "albert", "electra", "spanbert", "structbert", "ernie", "ernie_thu")
    for p in ("tiny", "base")
] + ["configs/stacking.py:stage1", "configs/glue.py:embedded", "configs/glue.py:mnli", "configs/squad.py:v2",
     "configs/ner.py:conll2003", "configs/distill.py:sst2", "configs/distill.py:general-tiny",
     "configs/continue.py:tiny", "configs/continue.py:base", "configs/t5_finetune.py:sst2"]


REFERENCE = os.path.join(ROOT, "docs", "reference", "configuration.md")
DOCS = os.path.join(ROOT, "docs", "**", "*.md")  # the command tables: the site's pages together


def test_the_readme_reference_is_the_schemas_table():
  with open(REFERENCE, encoding="utf-8") as f:
    readme = f.read()
  assert config_schema.with_table(readme) == readme, \
      "the config reference is out of date: python3 -m bert_jax.config_schema docs/reference/configuration.md"
  for field in config_schema.FIELDS:
    assert f"| `{field.key}` |" in readme


def test_the_readme_names_every_job_and_each_command_once():
  with open(REFERENCE, encoding="utf-8") as f:
    reference = f.read()
  named = re.search(r"Every job \(`bert_jax/jobs.py`: (.*?); a config names", reference, re.S)
  assert re.findall(r"`(\w+)`", named.group(1)) == list(jobs._JOBS)  # pylint: disable=protected-access
  readme = "\n".join(open(path, encoding="utf-8").read() for path in sorted(glob.glob(DOCS, recursive=True)))
  rows = re.findall(r"^\| `(bert-jax [^`]*)` \|", readme, re.M)
  assert len(rows) > 10 and len(rows) == len(set(rows)), [r for r in rows if rows.count(r) > 1]


@pytest.mark.parametrize("spec", PRESETS)
def test_every_preset_has_every_shared_field_and_passes(spec):
  config = load_config(spec)
  schema = jobs.get(config, spec).schema
  schema.check(config)
  assert config.train.eval_batch_size > 0  # 0 stands for train.batch_size, filled in by the check
  shared = {f.key for f in schema.fields}
  assert {"train.num_steps", "optimizer.warmup_steps", "checkpoint.every_steps", "data.max_seq_length"} <= shared


@pytest.mark.parametrize("command, spec, override, message", [
    ("pretrain", "configs/bert.py:demo", "train.eval_every_steps=-1", "train.eval_every_steps=-1 must be >= 0: "
     "evaluate every N steps"),
    ("finetune", "configs/glue.py:embedded", "train.eval_every_steps=-1", "train.eval_every_steps=-1 must be >= 0: "
     "evaluate every N steps"),
    ("pretrain", "configs/bert.py:demo", "optimizer.warmup_ratio=1.5", "optimizer.warmup_ratio=1.5 must be in [0, 1)"),
    ("finetune", "configs/glue.py:embedded", "optimizer.decay=cosine", "optimizer.decay='cosine' must be one of "
     "linear, polynomial, constant"),
    ("pretrain", "configs/bert.py:demo", "train.num_steps=0", "train.num_steps=0 must be >= 1: a job on a corpus"),
    ("finetune", "configs/glue.py:embedded", "train.epochs=0", "train.num_steps=0 and train.epochs=0: set the run's "
     "length in one of them"),
    ("distill", "configs/distill.py:sst2", "checkpoint.keep=0", "checkpoint.keep=0 must be >= 1"),
    ("pretrain", "configs/bert.py:demo", "optimizer.learning_rate=1e309", "bad value for "
     "config.optimizer.learning_rate: '1e309' is inf; expected a finite number"),
    ("finetune", "configs/glue.py:embedded", "head.dropout=-1e999", "'-1e999' is -inf"),
    ("finetune", "configs/glue.py:embedded", 'data.length_buckets=(64,"x")', "data.length_buckets=(64, 'x') must "
     "be a tuple of whole token counts"),
    ("finetune", "configs/mtdnn.py:tiny", "data.length_buckets=(32.5,)", "data.length_buckets=(32.5,) must be"),
])
def test_a_bad_value_is_one_line_naming_the_field(tmp_path, capsys, command, spec, override, message):
  assert cli.main([command, "--config", spec, "--workdir", str(tmp_path / "w"), f"--config.{override}"]) == 2
  err = capsys.readouterr().err.strip()
  assert message in err and "\n" not in err, err
  assert not (tmp_path / "w").exists()


def test_every_number_field_refuses_inf_and_nan():
  """1e309 parses as inf, which passes "> 0" and ">= 0": the schema's number check is finite first, for every
  field that takes a float."""
  configs = {config_schema.CORPUS: load_config_file("configs/bert.py:demo"),
             config_schema.DATASET: load_config_file("configs/glue.py:embedded")}
  numbers = [f for f in config_schema.FIELDS if f.check(0.5) or f.check(1.0)]
  assert {"optimizer.learning_rate", "optimizer.b2", "train.epochs"} <= {f.key for f in numbers}
  for field in numbers:
    block, name = field.key.split(".")
    config = configs[field.kinds[0]]
    for bad in (float("inf"), float("-inf"), float("nan")):
      assert not field.check(bad), (field.key, bad)
      with config[block].ignore_type():
        saved, config[block][name] = config[block][name], bad
      with pytest.raises(UserError, match=f"{field.key}=.* must be a finite number, "):
        config_schema.Schema(field.kinds[0]).check(config)
      config[block][name] = saved


def test_one_rule_for_a_quantity_in_two_units():
  """The steps field, when > 0, wins over its epochs or ratio twin; else the twin counts."""
  train = ml_collections.ConfigDict({"num_steps": 7, "epochs": 3.0, "eval_every_steps": 5, "eval_every_epochs": 1.0})
  assert config_schema.run_steps(train, steps_per_epoch=10) == 7
  assert config_schema.eval_every(train, steps_per_epoch=10) == 5
  train.update(num_steps=0, eval_every_steps=0)
  assert config_schema.run_steps(train, steps_per_epoch=10) == 30
  assert config_schema.eval_every(train, steps_per_epoch=10) == 10
  train.eval_every_epochs = 0.0
  assert config_schema.eval_every(train, steps_per_epoch=10) == 0  # no evaluation while training
  optimizer = ml_collections.ConfigDict({"warmup_steps": 0, "warmup_ratio": 0.1})
  assert config_schema.warmup_steps(optimizer, 55) == 6
  optimizer.warmup_steps = 3
  assert config_schema.warmup_steps(optimizer, 55) == 3
