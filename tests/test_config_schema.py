"""The one schema of every job's config blocks: every preset of every job satisfies it and sets no key its job's
schema does not declare, a bad value (a shared block's or a job's own) is one line naming the field and what it
allows, a quantity in two units follows one rule in every job, `config show --fields` reads it, and the docs
site's config reference (docs/reference/configuration.md) is the schema's table."""
import glob
import importlib
import os
import pkgutil
import re

import ml_collections
import pytest

from bert_jax import cli, config_schema, configs, jobs
from bert_jax.config_utils import load_config, load_config_file
from bert_jax.errors import UserError
from bert_jax.models import config as model_config, modernbert

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
  field that takes a float (the shared ones through a whole config's check)."""
  loaded = {config_schema.CORPUS: load_config_file("configs/bert.py:demo"),
            config_schema.DATASET: load_config_file("configs/glue.py:embedded")}
  numbers = [f for f in config_schema.FIELDS if (f.check(0.5) or f.check(1.0)) and not f.check("")]
  assert {"optimizer.learning_rate", "optimizer.b2", "train.epochs", "model.hidden_dropout", "ranking.scale",
          "distill.temperature"} <= {f.key for f in numbers}
  for field in numbers:
    for bad in (float("inf"), float("-inf"), float("nan")):
      assert not field.check(bad), (field.key, bad)
      with pytest.raises(UserError, match=f"{re.escape(field.key)}=.* must be a finite number, "):
        config_schema.check_field(field, bad)
  for field in [f for f in numbers if f.required]:
    block, name = field.key.split(".")
    config = loaded[field.kinds[0]]
    with config[block].ignore_type():
      saved, config[block][name] = config[block][name], float("nan")
    with pytest.raises(UserError, match=f"{field.key}=nan must be a finite number, "):
      config_schema.Schema(field.kinds[0]).check(config)
    config[block][name] = saved


def _presets():
  """(spec, config) of every preset of every file in configs/."""
  for module in pkgutil.iter_modules(configs.__path__):
    file = importlib.import_module(f"bert_jax.configs.{module.name}")
    for name in getattr(file, "PRESETS", ()):
      yield f"configs/{module.name}.py:{name}", file.get_config(name)


def test_every_key_a_preset_sets_is_declared_by_its_jobs_schema():
  """Each job declares the blocks it reads: a key any preset sets that its job's schema does not declare
  (with its type, range and meaning) fails here. 275 keys over 127 presets on 2026-11-29; before the job
  blocks were declared, 37 of them."""
  undeclared, checked, keys = {}, 0, set()
  for spec, config in _presets():
    schema = jobs.get(config, spec).schema
    schema.check(config)  # and every preset passes its job's schema
    checked += 1
    for key in config_schema.set_keys(config):
      keys.add(key)
      if not schema.declares(key):
        undeclared.setdefault(key, spec)
  assert checked > 100 and len(keys) > 250
  assert not undeclared, f"keys set by configs/ that their job's schema does not declare: {undeclared}"
  assert {f.key for f in config_schema.FIELDS} >= keys  # no key without its meaning in the reference


def test_each_registered_job_has_its_schema():
  assert set(config_schema.SCHEMAS) == set(jobs._JOBS)  # pylint: disable=protected-access
  for name, job in jobs._JOBS.items():  # pylint: disable=protected-access
    assert job.schema is config_schema.SCHEMAS[name] and job.schema.kind == config_schema.JOB_KINDS[name]
  sbert, pretrain = config_schema.SCHEMAS["sbert"], config_schema.SCHEMAS["pretrain"]
  assert sbert.declares("ranking.scale") and not pretrain.declares("ranking.scale")
  assert pretrain.declares("xlnet.mem_len") and not sbert.declares("xlnet.mem_len")
  assert not pretrain.declares("train.epochs") and sbert.declares("train.epochs")  # a corpus job counts steps


@pytest.mark.parametrize("command, spec, override, message", [
    ("pretrain", "configs/bert.py:demo", "model.num_layers=0", "model.num_layers=0 must be >= 1: the encoder's layers"),
    ("pretrain", "configs/bert.py:demo", "model.hidden_dropout=1.0", "model.hidden_dropout=1.0 must be in [0, 1)"),
    ("finetune", "configs/glue.py:embedded", "mesh.data=0", "mesh.data=0 must be >= 1 or -1: devices along the data"),
    ("finetune", "configs/sbert.py:mnr", "ranking.scale=0", "ranking.scale=0.0 must be > 0: loss=ranking"),
    ("finetune", "configs/sbert.py:mnr", "ranking.chunk_tokens=-1", "ranking.chunk_tokens=-1 must be >= 0: GradCache"),
    ("finetune", "configs/glue.py:embedded", "smart.iterations=0", "smart.iterations=0 must be >= 1: ascent steps"),
    ("finetune", "configs/t5_finetune.py:embedded", "decode.num_beams=0", "decode.num_beams=0 must be >= 1: beams"),
    ("distill", "configs/distill.py:theseus", "distill.replace_rate=1.5", "distill.replace_rate=1.5 must be in [0, 1]"),
    ("distill", "configs/distill.py:sst2", "distill.soft_loss=l2", "distill.soft_loss='l2' must be one of kl, "
     "logit_mse"),
])
def test_a_bad_value_in_a_jobs_own_block_is_one_line(tmp_path, capsys, command, spec, override, message):
  assert cli.main([command, "--config", spec, "--workdir", str(tmp_path / "w"), f"--config.{override}"]) == 2
  err = capsys.readouterr().err.strip()
  assert message in err and "\n" not in err, err
  assert not (tmp_path / "w").exists()


def test_config_show_checks_and_explains_with_the_schema(capsys):
  assert cli.main(["config", "show", "--config", "configs/sbert.py:mnr", "--fields"]) == 0
  lines = capsys.readouterr().out.splitlines()
  assert "ranking.scale = 20.0  (> 0) loss=ranking: the similarities' scale (sentence-transformers' " \
         "MultipleNegativesRankingLoss)" in lines
  batch = next(line for line in lines if line.startswith("train.batch_size = "))
  assert "sbert a sentence pair" in batch and not any("not declared" in line for line in lines)
  assert cli.main(["config", "show", "--config", "configs/bert.py:demo", "--config.model.num_layers=0"]) == 2
  assert capsys.readouterr().err.strip().endswith("model.num_layers=0 must be >= 1: the encoder's layers")


def test_a_model_config_class_checks_the_schemas_ranges():
  """The family config classes read the model block's plain ranges from the schema (one declaration)."""
  with pytest.raises(UserError, match=r"^model.num_heads=0 must be >= 1: attention heads per layer$"):
    model_config.ModelConfig(num_heads=0)
  with pytest.raises(UserError, match=r"^model.local_window=0 must be >= 1: ModernBERT"):
    modernbert.ModernBertConfig(local_window=0)


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
