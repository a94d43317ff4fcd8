"""`bert-jax data prepare --runner` (data_pipelines/beam_prepare.py) writes the in-process path's shards byte for
byte, with 1 DirectRunner worker (4 worker processes in the weekly suite); the Beam vocabulary sample, the tfds builder, launch/dataflow_prepare.sh
(its local twin run, its Dataflow options built but not run), and bad input as one line.

Beam's DirectRunner starts slowly: each pipeline runs once per module (fixtures) and serves several checks."""
import argparse
import glob
import json
import os
import signal
import stat
import subprocess
import sys
import tempfile
import time
import types

import pytest

import data_fixtures
from core_helpers import slow
from bert_jax.cli import data as data_cli
from bert_jax.cli import main
from bert_jax.data_pipelines import beam_prepare, beam_runner, prepare, prepare_rows, tftools, vocab
from bert_jax.data_pipelines.errors import DataError

tf = tftools.tf()  # TensorFlow without Keras, as bert_jax imports it

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROWS = ["--config.data.max_seq_length=48", "--config.data.max_predictions_per_seq=8", "--config.data.num_shards=4",
        "--config.data.shuffle_buffer=12", "--config.data.seed=3", "--config.data.eval_fraction=0.1"]


def _shards(directory) -> dict:
  """file name -> bytes, for every shard and metadata.json (not the eval/ folder of the hold-out's rows)."""
  return {os.path.basename(p): open(p, "rb").read() for p in sorted(glob.glob(os.path.join(directory, "*")))
          if os.path.isfile(p)}


def _records(directory) -> list[bytes]:
  return [r.numpy() for p in sorted(glob.glob(os.path.join(directory, "*.tfrecord")))
          for r in tf.data.TFRecordDataset(p)]


def _prepare_rows(corpus, out, *extra):
  assert main(["data", "prepare", "--format", "bert_tfrecord", "--config", "configs/bert.py:demo",
               f"--config.data.corpus={corpus}", "--output", str(out), "--epochs", "2", "--workers", "1",
               *ROWS, *extra]) == 0


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  """Three files of real multi-sentence documents, one with a line that is not UTF-8."""
  directory = tmp_path_factory.mktemp("corpus")
  pattern = data_fixtures.write_corpus(directory, num_docs=30, sentences_per_doc=5, num_files=3)
  with open(directory / "part1.txt", "ab") as f:
    f.write(b"A last document with \xff\xfe a broken line.\n\xc3\x28 not UTF-8 either\nIts second sentence.\n")
  return pattern


@pytest.fixture(scope="module")
def rows(corpus, tmp_path_factory):
  """The rows of one config: in-process and on DirectRunner in this process."""
  out = {name: tmp_path_factory.mktemp(name) / "rows" for name in ("in_process", "direct1")}
  _prepare_rows(corpus, out["in_process"])
  _prepare_rows(corpus, out["direct1"], "--runner", "DirectRunner")
  return out


def _assert_same_shards(rows, got_dir):
  want = _shards(rows["in_process"])
  got = _shards(got_dir)
  assert got.keys() == want.keys()
  for file in want:
    assert got[file] == want[file], file
  assert not glob.glob(os.path.join(got_dir, "*.tmp"))


def test_rows_on_direct_runner_are_the_in_process_rows(rows):
  records = _records(rows["in_process"])
  metadata = json.loads(_shards(rows["in_process"])["metadata.json"])
  assert metadata["rows"] == len(records) > 100 and len(_shards(rows["in_process"])) == 5  # 4 shards (hashed)
  assert len(set(records)) == len(records)  # real rows, masked: no two alike
  _assert_same_shards(rows, rows["direct1"])


@slow
def test_rows_with_4_direct_runner_worker_processes_are_the_in_process_rows(rows, corpus, tmp_path):
  """Beam's multi-process DirectRunner starts 4 interpreters (~30 s on 2 cores): the weekly suite."""
  _prepare_rows(corpus, tmp_path / "rows", "--runner", "DirectRunner", "--workers", "4")
  _assert_same_shards(rows, tmp_path / "rows")


def test_documents_on_direct_runner_are_the_in_process_documents_on_the_embedded_corpus(tmp_path):
  assert main(["data", "prepare", "--output", str(tmp_path / "a"), "--workers", "1"]) == 0
  assert main(["data", "prepare", "--output", str(tmp_path / "b"), "--runner", "DirectRunner", "--workers", "1"]) == 0
  want, got = _shards(tmp_path / "a"), _shards(tmp_path / "b")
  assert list(want) == ["metadata.json", "part-00000-of-00001.tfrecord"] and got == want
  assert json.loads(want["metadata.json"])["documents"] > 5000


def _run_script(env_extra, *args):
  env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": ROOT, **env_extra}
  return subprocess.run(["bash", os.path.join(ROOT, "launch", "dataflow_prepare.sh"), *args], env=env, cwd=ROOT,
                        capture_output=True, text=True, timeout=600)


@slow  # the launch script run end to end (~25 s in the suite); the pipeline it runs is tested above
def test_launch_scripts_local_twin_writes_the_in_process_documents(corpus, tmp_path):
  """launch/dataflow_prepare.sh with RUNNER=DirectRunner (several files, a non-UTF-8 line skipped alike)."""
  metadata = prepare.prepare(corpus, str(tmp_path / "in_process"), num_workers=1)
  assert metadata["skipped"] == {"skipped_lines": 2} and metadata["files"] == 3
  result = _run_script({"RUNNER": "DirectRunner", "WORKERS": "1", "CORPUS": corpus, "OUTPUT": str(tmp_path / "b")})
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stderr.strip().splitlines()[-1] == (
      "bert-jax data prepare: warning: skipped 2 lines not UTF-8 text; the rest is prepared")
  assert _shards(tmp_path / "b") == _shards(tmp_path / "in_process")
  again = _run_script({"RUNNER": "DirectRunner", "WORKERS": "1", "CORPUS": corpus, "OUTPUT": str(tmp_path / "b")})
  assert again.returncode == 2 and "--overwrite" in again.stderr.strip().splitlines()[-1]


_FAKE_PYTHON = """#!/usr/bin/env python3
import json, os, sys
open(os.environ["FAKE_LOG"], "w").write(json.dumps(sys.argv[1:]))
"""


def test_dataflow_options_from_the_launch_script_build_the_pipeline(tmp_path):
  """The script's Dataflow command, parsed by the CLI, builds (does not run) a Dataflow pipeline with its options."""
  fake = tmp_path / "python"
  fake.write_text(_FAKE_PYTHON)
  fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
  env = {"PYTHON": str(fake), "FAKE_LOG": str(tmp_path / "argv.json"), "PROJECT": "my-project",
         "REGION": "europe-west4", "BUCKET": "gs://my-bucket", "CORPUS": "gs://my-bucket/wiki/*.txt",
         "VOCAB": "gs://my-bucket/vocab.txt", "MAX_WORKERS": "100"}
  result = _run_script(env, "--corpus-format", "document_per_line")
  assert result.returncode == 0, result.stderr
  argv = json.loads((tmp_path / "argv.json").read_text())
  assert argv[:2] == ["-m", "bert_jax.cli"]
  parser = argparse.ArgumentParser()
  data_cli.register(parser.add_subparsers(dest="command"))
  args = parser.parse_args(argv[2:])
  assert (args.corpus, args.vocab, args.output, args.corpus_format) == (
      "gs://my-bucket/wiki/*.txt", "gs://my-bucket/vocab.txt", "gs://my-bucket/prepared", "document_per_line")
  flags = data_cli._beam_args(args) + ["--dry_run=True"]  # pylint: disable=protected-access  # no GCS check
  text = beam_prepare.TextCorpus(("gs://my-bucket/wiki/a.txt", "gs://my-bucket/wiki/b.txt"), args.corpus_format,
                                 args.vocab, args.lower_case)
  pipeline = beam_runner.build(flags, lambda p: beam_prepare.documents_graph(p, args.corpus, text, args.output))
  options = pipeline.options.get_all_options()
  assert {k: options[k] for k in ("runner", "project", "region", "temp_location", "max_num_workers",
                                  "machine_type", "disk_size_gb")} == {
      "runner": "DataflowRunner", "project": "my-project", "region": "europe-west4",
      "temp_location": "gs://my-bucket/dataflow-tmp", "max_num_workers": 100, "machine_type": "n2-standard-4",
      "disk_size_gb": 50}
  assert options["setup_file"] == os.path.join(ROOT, "setup.py") and options["job_name"].startswith("bert-jax")
  steps = {t.unique_name for t in pipeline.to_runner_api().components.transforms.values()}
  assert {"read", "tokenize", "write", "metadata"} <= steps
  with pytest.raises(DataError, match="--vocab .* is on this machine"):
    beam_runner.check_reachable(flags, {"--corpus": ["gs://b/a.txt"], "--vocab": ["/home/me/vocab.txt"]})


def test_runner_options_pass_through_and_the_users_win():
  parser = argparse.ArgumentParser()
  data_cli.register(parser.add_subparsers(dest="command"))
  args = parser.parse_args(["data", "prepare", "--output", "o", "--runner", "DirectRunner", "--workers", "4",
                            "--beam-option", "direct_runner_bundle_repeat=2", "--", "--direct_num_workers=3"])
  flags = data_cli._beam_args(args)  # pylint: disable=protected-access
  options = beam_runner.pipeline_options(flags).get_all_options()
  assert (options["runner"], options["direct_num_workers"], options["direct_running_mode"],
          options["direct_runner_bundle_repeat"]) == ("DirectRunner", 3, "multi_processing", 2)


def test_tfds_builder_examples_are_the_prepared_documents(corpus, tmp_path):
  import apache_beam as beam
  import tensorflow_datasets as tfds
  from bert_jax.data_pipelines import tfds_corpus  # pylint: disable=unused-import  # registers the builder
  manual = tmp_path / "manual"
  manual.mkdir()
  for path in glob.glob(corpus):
    (manual / os.path.basename(path)).write_bytes(open(path, "rb").read())
  prepare.prepare(str(manual / "*.txt"), str(tmp_path / "prepared"), num_workers=1)
  builder = tfds.builder("bert_jax_corpus", data_dir=str(tmp_path / "tfds"))
  builder.download_and_prepare(download_config=tfds.download.DownloadConfig(
      manual_dir=str(manual), beam_options=beam.options.pipeline_options.PipelineOptions(["--runner=DirectRunner"])))
  examples = sorted(tfds.as_numpy(tfds.load("bert_jax_corpus", data_dir=str(tmp_path / "tfds"), split="train")),
                    key=lambda e: (e["source"], e["index"]))
  records = [tf.train.Example.FromString(r).features.feature for r in _records(tmp_path / "prepared")]
  assert len(examples) == len(records) == 31
  for example, record in zip(examples, records):
    assert list(example["ids"]) == list(record["ids"].int64_list.value)
    assert list(example["lengths"]) == list(record["lengths"].int64_list.value)
  assert [e["index"] for e in examples[:3]] == [0, 1, 2] and examples[0]["source"] == b"part0.txt"
  assert builder.info.metadata["vocab_sha256"] == json.loads((tmp_path / "prepared/metadata.json").read_text())[
      "vocab_sha256"]


def test_vocabulary_sample_is_the_same_on_beam_and_uniform(corpus, tmp_path):
  everything = list(vocab.corpus_sentences(corpus))
  drawn = vocab.sample_sentences(corpus, 40, seed=7)
  assert main(["vocab", "--corpus", corpus, "--size", "300", "--output", str(tmp_path), "--sample-sentences", "40",
               "--seed", "7", "--runner", "DirectRunner", "--workers", "1"]) == 0
  assert (tmp_path / "vocab_sample.txt").read_text().splitlines() == drawn
  assert (tmp_path / "vocab.txt").read_text().startswith("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n")
  # 40 of 151 sentences, in corpus order, from every file; another seed draws another sample
  assert len(drawn) == 40 and len(everything) == 151
  positions = [everything.index(s) for s in drawn]
  assert positions == sorted(positions) and positions[0] < 50 and positions[-1] > 100
  assert vocab.sample_sentences(corpus, 40, seed=8) != drawn
  assert vocab.sample_sentences(corpus, 500, seed=7) == everything


def test_bad_input_is_one_line_and_leaves_no_shards(corpus, tmp_path, capsys, monkeypatch):
  def fails(argv):
    """The error line (after the in-process path's progress bar, if any)."""
    assert main(["data", "prepare", *argv, "--workers", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and err.splitlines()[-1].startswith("bert-jax data: error: "), err
    return err.splitlines()[-1]

  beam = ["--runner", "DirectRunner"]
  out = ["--corpus", corpus, "--output", str(tmp_path / "never")]
  assert "add --runner" in fails([*out, "--beam-option", "project=p"])
  assert "choose one of DirectRunner, PrismRunner" in fails([*out, "--runner", "DirectRuner"])
  assert "write KEY=VALUE" in fails([*out, *beam, "--beam-option", "project"])
  assert not os.path.exists(tmp_path / "never")
  assert "matches no file" in fails(["--corpus", str(tmp_path / "none*.txt"), "--output", str(tmp_path / "o"), *beam])
  broken = tmp_path / "broken"
  broken.mkdir()
  (broken / "a.txt").write_bytes(open(corpus.replace("*", "part0"), "rb").read())
  (broken / "b.txt").symlink_to(tmp_path / "gone.txt")
  for runner in ([], beam):
    out = tmp_path / f"out{len(runner)}"
    err = fails(["--corpus", str(broken / "*.txt"), "--output", str(out), *runner])
    assert err.endswith("b.txt: cannot be read (No such file or directory); check the file exists and is readable, "
                        "or leave it out of the corpus"), err
    assert os.listdir(out) == []  # the shard of a.txt, written or not, is gone; no metadata.json
  monkeypatch.setattr(beam_prepare, "load_tokenizer", lambda *a: types.SimpleNamespace(encode=lambda s: 1 / 0))
  err = fails(["--corpus", corpus, "--output", str(tmp_path / "failing"), *beam])
  assert "the Beam job failed in step 'tokenize': ZeroDivisionError: division by zero; see " in err
  log = err.rsplit("; see ", 1)[1]  # the runner's traceback went there, not to the terminal
  assert "Traceback" in open(log, encoding="utf-8").read()
  os.remove(log)


def test_a_non_empty_output_is_refused_unless_overwrite(corpus, tmp_path, capsys):
  """Both formats; --overwrite removes the previous run's metadata.json and shards first."""
  out = str(tmp_path / "out")
  assert main(["data", "prepare", "--corpus", corpus.replace("*", "part0"), "--output", out, "--workers", "1"]) == 0
  for argv in (["--format", "bert_tfrecord", "--config", "configs/bert.py:demo"], ["--corpus", corpus]):
    assert main(["data", "prepare", *argv, "--output", out]) == 2
    assert "not empty" in capsys.readouterr().err
  (tmp_path / "out" / "part-00007-of-00008.tfrecord").write_bytes(b"")
  assert main(["data", "prepare", "--corpus", corpus, "--output", out, "--workers", "1", "--overwrite"]) == 0
  assert sorted(os.listdir(out)) == ["metadata.json"] + [prepare.shard_name(i, 3) for i in range(3)]


def test_sigterm_takes_ctrl_cs_path_no_shard_left_and_143(corpus, tmp_path, capsys, monkeypatch):
  """SIGTERM while the shards are being written (here: after the first) stops the run as Ctrl-C does: the shards
  written are removed, no metadata.json, one line, exit 143; the same command may run again."""
  signal.signal(signal.SIGTERM, _not_answered)  # without the data commands' own answer: a job failure, not 143
  written = beam_prepare._WriteDocuments.process

  def write_then_sigterm(self, grouped):
    yield from written(self, grouped)
    os.kill(os.getpid(), signal.SIGTERM)

  monkeypatch.setattr(beam_prepare._WriteDocuments, "process", write_then_sigterm)
  out, logs = tmp_path / "out", os.path.join(tempfile.gettempdir(), "bert_jax-beam-*.log")
  argv = ["data", "prepare", "--corpus", corpus, "--output", str(out), "--runner", "DirectRunner", "--workers", "1"]
  before = set(glob.glob(logs))
  try:
    assert main(argv) == 143
  finally:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
  err = capsys.readouterr().err.strip()
  assert err == f"bert-jax data prepare: stopped by SIGTERM; the partial output in {out} is removed: the same " \
                "command starts again"
  assert os.listdir(out) == [] and set(glob.glob(logs)) <= before  # no runner log left either
  prepare.claim_output(str(out), overwrite=False)  # the same command is not refused as "not empty"


@slow  # the same SIGTERM path as the test above, at the hold-out's moment (~11 s)
def test_sigterm_while_the_hold_out_is_written_leaves_nothing(corpus, tmp_path, capsys, monkeypatch):
  """--format bert_tfrecord writes the training rows (metadata.json last), then the hold-out's in OUTPUT/eval: SIGTERM
  in the second leaves neither, or the same command would be refused as "not empty"."""
  signal.signal(signal.SIGTERM, _not_answered)
  rows = prepare_rows.prepare_rows

  def sigterm_in_the_hold_out(config, output, epochs, split, **kw):
    if split == "eval":
      os.kill(os.getpid(), signal.SIGTERM)
    return rows(config, output, epochs=epochs, split=split, **kw)

  monkeypatch.setattr(prepare_rows, "prepare_rows", sigterm_in_the_hold_out)
  out = tmp_path / "rows"
  try:
    assert main(["data", "prepare", "--format", "bert_tfrecord", "--config", "configs/bert.py:demo",
                 f"--config.data.corpus={corpus}", "--output", str(out), "--workers", "1", *ROWS]) == 143
  finally:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
  assert "stopped by SIGTERM" in capsys.readouterr().err and os.listdir(out) == []


def _not_answered(signum, frame):
  raise RuntimeError("SIGTERM reached the test's own handler")


@slow
def test_sigterm_stops_the_direct_runners_worker_processes(corpus, tmp_path):
  """The command run as a user runs it, 2 worker processes (Beam starts them under `sh -c`), SIGTERM to the
  command alone once a shard is written: exit 143, one line, nothing left in --output, no worker left running."""
  out = tmp_path / "out"
  process = subprocess.Popen([sys.executable, "-m", "bert_jax.cli", "data", "prepare", "--corpus", corpus, "--output",
                              str(out), "--runner", "DirectRunner", "--workers", "2"], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  deadline = time.time() + 400
  while not glob.glob(str(out / "*.tfrecord")) and process.poll() is None and time.time() < deadline:
    time.sleep(0.05)
  workers = data_cli._descendants(process.pid)  # pylint: disable=protected-access
  assert len(workers) >= 2, workers  # (sh and) python for each worker
  process.send_signal(signal.SIGTERM)
  _, err = process.communicate(timeout=120)
  assert process.returncode == 143, err
  assert "Traceback" not in err and err.strip().splitlines()[-1] == (  # (before it: TF's start-up lines, if any)
      f"bert-jax data prepare: stopped by SIGTERM; the partial output in {out} is removed: the same command starts "
      "again")
  assert os.listdir(out) == []
  time.sleep(1)  # the workers' exit: their parent gone, init reaps them
  assert not [pid for pid in workers if os.path.exists(f"/proc/{pid}")], workers
