"""The `bert-jax` command's own surface: --version, `config show`, help with defaults, one-line errors."""
import json
import os

import pytest

import bert_jax
from bert_jax.cli import main


def test_version(capsys):
  with pytest.raises(SystemExit) as e:
    main(["--version"])
  assert e.value.code == 0
  assert capsys.readouterr().out.strip() == f"bert-jax {bert_jax.__version__}"


def test_config_show_prints_the_resolved_config(capsys):
  assert main(["config", "show", "--config", "configs/bert.py:demo", "--config.train.num_steps=7",
               "--config.optimizer.learning_rate=2e-4"]) == 0
  shown = json.loads(capsys.readouterr().out)
  assert shown["train"]["num_steps"] == 7
  assert shown["optimizer"]["learning_rate"] == 2e-4
  assert shown["model"]["num_layers"] == 2 and shown["data"]["max_seq_length"] == 64  # the demo preset


@pytest.mark.parametrize("override,suggestion", [
    ("--config.train.num_step=3", "config.train.num_steps"),           # a typo in the leaf
    ("--config.train.learning_rate=3", "config.optimizer.learning_rate"),  # the right leaf, wrong section
    ("--config.optimiser.learning_rate=3", "config.optimizer.learning_rate"),  # a typo in the section
])
def test_misspelled_key_gets_did_you_mean(capsys, override, suggestion):
  assert main(["config", "show", "--config", "configs/bert.py:demo", override]) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and f"did you mean {suggestion}?" in err


def test_sub_command_help_shows_defaults(capsys):
  with pytest.raises(SystemExit):
    main(["benchmark", "--help"])
  out = capsys.readouterr().out
  assert "default: 32" in out and "default: 128" in out and "(default: configs/bert.py:base)" in out


def test_missing_config_file_lists_each_folder_once(capsys, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert main(["config", "show", "--config", "nope.py:x"]) == 2
  err = capsys.readouterr().err
  folders = err.split("looked in ")[1].split(")")[0].split(", ")
  assert len(folders) == len(set(folders)) and str(tmp_path) in folders
  assert all(os.path.isdir(f) for f in folders)


PRESETS = {"configs/bert.py:demo": ("pretrain", "pretrain"), "configs/electra.py:tiny": ("pretrain", "pretrain"),
           "configs/glue.py:sst2": ("finetune", "finetune"), "configs/squad.py:v1": ("finetune", "finetune"),
           "configs/ner.py:conll2003": ("finetune", "finetune"), "configs/distill.py:sst2": ("distill", "distill"),
           "configs/distill.py:general-tiny": ("general_distill", "distill"),
           "configs/t5_finetune.py:sst2": ("seq2seq", "finetune")}


@pytest.mark.parametrize("spec", sorted(PRESETS))
def test_every_config_names_its_job_and_other_commands_refuse_it(spec, capsys, tmp_path):
  """The job registry, not the config's other keys, says what runs a config: its own command takes it,
  every other job command refuses it in one line before touching the workdir; compile and info take
  only jobs whose step needs no data."""
  from bert_jax import jobs  # pylint: disable=import-outside-toplevel
  from bert_jax.config_utils import load_config  # pylint: disable=import-outside-toplevel
  name, command = PRESETS[spec]
  job = jobs.get(load_config(spec))
  assert (job.name, job.command) == (name, command)
  for other in {"pretrain", "finetune", "distill"} - {command}:
    assert main([other, "--config", spec, "--workdir", str(tmp_path / "w")]) == 2
    assert capsys.readouterr().err.strip() == (f"bert-jax {other}: error: {spec} is a {name} config: run it with "
                                               f"`bert-jax {command}`, not `bert-jax {other}`")
    assert not (tmp_path / "w").exists()
  if job.step is None:
    assert main(["info", "--config", spec]) == 2
    assert f"bert-jax info builds a pretraining step from the config alone: {spec} is a {name} config" in \
        capsys.readouterr().err
# Backbone parameters of released checkpoints (HF's BertModel / AlbertModel / ElectraModel num_parameters();
# RobertaModel's 124,645,632 less its pooler, which bert_jax's RoBERTa leaves off; ModernBertModel's plus layer 0's
# attention norm, which scanned layers all carry (HF's layer 0 has none)).
PUBLISHED_PARAMS = {"configs/bert.py:base": 109_482_240, "configs/bert.py:large": 335_141_888,
                    "configs/albert.py:base": 11_683_584, "configs/roberta.py:base": 124_645_632 - 768 * 769,
                    "configs/electra.py:base": 108_891_648, "configs/modernbert.py:base": 149_014_272 + 768,
                    "configs/modernbert.py:large": 394_781_696 + 1024}


def test_presets_lists_every_preset_of_every_config_file(capsys):
  import importlib
  assert main(["presets", "--json"]) == 0
  rows = {r["config"]: r for r in map(json.loads, capsys.readouterr().out.splitlines())}
  for file in ("bert", "roberta", "albert", "electra", "spanbert", "structbert", "stacking", "distill", "glue",
               "squad", "ner", "modernbert"):
    module = importlib.import_module(f"bert_jax.configs.{file}")
    assert [r["preset"] for r in rows.values() if r["file"] == file] == list(module.PRESETS)
  assert {k: rows[k]["params"] for k in PUBLISHED_PARAMS} == PUBLISHED_PARAMS
  demo = rows["configs/bert.py:demo"]
  assert (demo["family"], demo["layers"], demo["hidden"], demo["seq_length"], demo["num_steps"]) == (
      "bert", 2, 128, 64, 1200)
  assert rows["configs/glue.py:rte"]["model_from"] == "init_from" and rows["configs/squad.py:v1"]["seq_length"] == 384
  assert rows["configs/electra.py:tiny"]["family"] == "electra" and rows["configs/albert.py:tiny"]["family"] == "albert"
  assert rows["configs/modernbert.py:base"]["family"] == "modernbert"


@pytest.mark.parametrize("spec", ["configs/albert.py:tiny", "configs/electra.py:tiny", "configs/modernbert.py:tiny",
                                  "configs/ernie_thu.py:tiny"])
def test_preset_parameter_counts_agree_with_the_built_model(spec):
  """presets counts from the sizes; `bert-jax info` counts the leaves of the abstract parameter tree."""
  from bert_jax import presets
  from bert_jax import jobs
  from bert_jax.config_utils import load_config
  from bert_jax.training import info
  config = load_config(spec)
  built = jobs.with_step(config, spec, "info").step(config, None)
  assert presets.backbone_params(config.model) == info.model_info(*built)["num_params"]


@pytest.mark.parametrize("spec, presets", [("xlnet", None), ("configs/xlnet.py", None),
                                           ("configs/xlnet.py:tiny", ["tiny"]), ("configs/bert.py:demo", ["demo"])])
def test_presets_takes_the_names_its_listing_prints(capsys, spec, presets):
  """Before: `presets configs/xlnet.py` looked for configs/configs/xlnet.py.py."""
  import importlib
  assert main(["presets", "--json", spec]) == 0
  rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
  file = spec.split(":")[0].rsplit("/", 1)[-1].removesuffix(".py")
  assert [r["preset"] for r in rows] == (presets or list(importlib.import_module(f"bert_jax.configs.{file}").PRESETS))
  assert main(["presets", "configs/xlnet.py:huge"]) == 2
  assert "configs/xlnet.py has no preset 'huge'; its presets: tiny" in capsys.readouterr().err


def test_presets_table_and_help_point_at_each_other(capsys):
  assert main(["presets", "bert"]) == 0
  out = capsys.readouterr().out.splitlines()
  assert out[0].startswith("configs/bert.py  BERT pretraining configs")
  demo = next(line for line in out if line.split()[:1] == ["demo"])
  assert "L2 H128 1.5M" in demo and "seq 64" in demo and "README's first run" in demo
  with pytest.raises(SystemExit):
    main(["--help"])
  assert "bert-jax presets" in capsys.readouterr().out
  assert main(["config", "show", "--config", "configs/bert.py:huge"]) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and "'tiny', 'mini'" in err and "bert-jax presets" in err
