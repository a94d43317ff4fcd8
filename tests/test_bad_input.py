"""Bad input through the CLI: one line on stderr and exit 2, never a traceback or a hang; silent data
problems counted, and fatal with data.strict=true."""
import contextlib
import json
import logging
import os
import re
import signal

import pytest

from bert_jax.cli import main
from bert_jax.data_pipelines import corpora
from bert_jax.errors import UserError
from bert_jax.finetune import glue, squad

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "a", "dog", "who", "."]


@pytest.fixture
def vocab(tmp_path):
  path = tmp_path / "vocab.txt"
  path.write_text("\n".join(WORDS) + "\n")
  return str(path)


@contextlib.contextmanager
def deadline(seconds):
  """Turns a hang into a test failure (the SQuAD window loop used to spin while memory grew)."""
  def fail(*_):
    raise TimeoutError(f"still running after {seconds} s")
  previous = signal.signal(signal.SIGALRM, fail)
  signal.alarm(seconds)
  try:
    yield
  finally:
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def one_error_line(capsys, argv):
  """Runs the CLI; asserts exit 2 and exactly one stderr line; returns that line."""
  capsys.readouterr()  # what fixtures printed while they were set up (a first vocabulary build) is not the run's
  assert main(argv) == 2
  lines = capsys.readouterr().err.strip().splitlines()
  assert len(lines) == 1, lines
  assert lines[0].startswith(f"bert-jax {argv[0]}: error: "), lines
  return lines[0]


def finetune(workdir, config, *overrides):
  return ["finetune", "--config", config, "--workdir", str(workdir), *overrides]


def write_squad(path, qas, context="the cat sat"):
  path.write_text(json.dumps({"data": [{"paragraphs": [{"context": context, "qas": qas}]}]}))


@pytest.mark.parametrize("batch", ["0", "-8"])
def test_pretrain_batch_size_below_one(tmp_path, capsys, batch):
  line = one_error_line(capsys, ["pretrain", "--config", "configs/bert.py:demo", "--workdir", str(tmp_path),
                                 f"--config.train.batch_size={batch}"])
  assert f"train.batch_size={batch} must be >= 1" in line


def test_pretrain_sequence_longer_than_the_position_table(tmp_path, capsys):
  line = one_error_line(capsys, ["pretrain", "--config", "configs/bert.py:demo", "--workdir", str(tmp_path),
                                 "--config.data.max_seq_length=1024"])
  assert "data.max_seq_length=1024 must be between 1 and model.max_position_embeddings=512" in line


def test_finetune_sequence_longer_than_the_position_table(tmp_path, capsys, vocab):
  line = one_error_line(capsys, finetune(tmp_path / "run", "configs/glue.py:embedded", f"--config.data.vocab={vocab}",
                                         "--config.task.num_train=64", "--config.task.num_dev=8",
                                         "--config.data.max_seq_length=1024"))
  assert "data.max_seq_length=1024 must be between 1 and the model's max_position_embeddings=512" in line


def test_benchmark_negative_batch(capsys):
  line = one_error_line(capsys, ["benchmark", "--config", "configs/bert.py:tiny", "--batch-size", "-4"])
  assert line.endswith("--batch-size=-4 must be >= 1")


def test_benchmark_with_a_backend_that_cannot_run_here(capsys):
  """Before: cudnn's traceback from the compile."""
  line = one_error_line(capsys, ["benchmark", "--config", "configs/bert.py:tiny", "--config.model.attention=cudnn",
                                 "--config.model.attention_dropout=0"])
  assert "model.attention='cudnn' needs a GPU with cuDNN and the step runs on cpu" in line


def test_config_file_with_a_syntax_error_names_file_and_line(tmp_path, capsys):
  path = tmp_path / "mine.py"
  path.write_text("import ml_collections\n\ndef get_config(arg=None:\n  return ml_collections.ConfigDict()\n")
  line = one_error_line(capsys, ["config", "show", "--config", f"{path}:x"])
  assert f"{path}, line 3: " in line and "syntax error" in line


def test_config_file_that_fails_names_file_and_line(tmp_path, capsys):
  path = tmp_path / "mine.py"
  path.write_text("def get_config(arg=None):\n  return undefined_name\n")
  line = one_error_line(capsys, ["config", "show", "--config", str(path)])
  assert f"{path}, line 2: NameError: name 'undefined_name' is not defined" in line


def test_stsb_score_that_is_not_a_number(tmp_path, capsys, vocab):
  header = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
  rows = ["0\tx\tx\tx\tx\tx\tx\tthe cat\ta cat\t4.2\n", "1\tx\tx\tx\tx\tx\tx\tthe dog\ta cat\tfour\n"]
  for name in ("train.tsv", "dev.tsv"):
    (tmp_path / name).write_text(header + "".join(rows))
  line = one_error_line(capsys, finetune(tmp_path / "run", "configs/glue.py:stsb", f"--config.data.vocab={vocab}",
                                         f"--config.data.data_dir={tmp_path}"))
  assert line.endswith(f"{tmp_path}/train.tsv:3: score 'four' is not a number")


@pytest.mark.parametrize("content, message", [
    ('{"data": [{"paragraphs": [{"context": "the cat", "qas": [{"question": "who", "answers": []}]}]}]}',
     r"data\[0\]\.paragraphs\[0\]\.qas\[0\] has no 'id'"),
    ('{"data": [{"paragraphs": [', r"not valid JSON \(Expecting value: line 1"),
])
def test_squad_json_without_an_id_or_broken(tmp_path, capsys, vocab, content, message):
  (tmp_path / "train-v1.1.json").write_text(content)
  line = one_error_line(capsys, finetune(tmp_path / "run", "configs/squad.py:v1", f"--config.data.vocab={vocab}",
                                         f"--config.data.data_dir={tmp_path}"))
  assert f"{tmp_path}/train-v1.1.json: " in line
  assert re.search(message, line), line


def test_ner_with_an_empty_dev_file(tmp_path, capsys, vocab):
  (tmp_path / "train.txt").write_text("the B-ORG\ncat O\n\n")
  (tmp_path / "valid.txt").write_text("")
  line = one_error_line(capsys, finetune(tmp_path / "run", "configs/ner.py:conll2003", f"--config.data.vocab={vocab}",
                                         f"--config.data.data_dir={tmp_path}"))
  assert line.endswith(f"{tmp_path}/valid.txt: no sentences (an empty file?)")


def test_squad_question_longer_than_the_sequence_fails_fast(tmp_path, capsys, vocab):
  question = " ".join(["who"] * 120)
  qas = [{"id": "q1", "question": question, "answers": [{"text": "cat", "answer_start": 4}]}]
  write_squad(tmp_path / "train-v1.1.json", qas)
  write_squad(tmp_path / "dev-v1.1.json", qas)
  with deadline(120):
    line = one_error_line(capsys, finetune(tmp_path / "run", "configs/squad.py:v1", f"--config.data.vocab={vocab}",
                                           f"--config.data.data_dir={tmp_path}", "--config.data.max_seq_length=64"))
  assert "data.max_seq_length=64 leaves no room for the context: it must exceed task.max_query_length=64 + 3" in line


@pytest.mark.parametrize("max_tokens, stride", [(0, 128), (-3, 128), (4, 0)])
def test_window_loop_refuses_to_spin(max_tokens, stride):
  with deadline(10), pytest.raises(UserError, match="data.max_seq_length must exceed task.max_query_length"):
    squad.windows(10, max_tokens, stride)


def test_malformed_glue_rows_are_counted_or_fatal(tmp_path, caplog):
  path = tmp_path / "train.tsv"
  path.write_text("index\tquestion\tsentence\tlabel\n0\tq a\ts a\tentailment\n1\tq b\n\n2\tq c\ts c\tnot_entailment\n"
                  "3\n")
  with caplog.at_level(logging.WARNING):
    rows = glue.read_tsv(str(path), glue.SPECS["qnli"])
  assert rows == [("q a", "s a", "entailment"), ("q c", "s c", "not_entailment")]
  assert f"{path}: 2 rows with fewer than 4 tab-separated fields dropped (line 3, line 6)" in caplog.text
  with pytest.raises(UserError, match=r"2 rows with fewer than 4 .* \(data\.strict=true makes this an error"):
    glue.read_tsv(str(path), glue.SPECS["qnli"], strict=True)


def test_squad_answers_out_of_range_dropped_and_misplaced_named(tmp_path, caplog):
  qas = [{"id": "good", "question": "who", "answers": [{"text": "cat", "answer_start": 4}]},
         {"id": "past_end", "question": "who", "answers": [{"text": "sat", "answer_start": 10}]},
         {"id": "negative", "question": "who", "answers": [{"text": "the", "answer_start": -1}]},
         {"id": "moved", "question": "who", "answers": [{"text": "cat", "answer_start": 3}]}]
  write_squad(tmp_path / "train.json", qas)
  examples = squad.read_json(str(tmp_path / "train.json"))
  with caplog.at_level(logging.WARNING):
    kept = squad.check_answers(examples, "train.json", strict=False)
  assert [e.qid for e in kept] == ["good", "moved"]
  assert "train.json: 2 training questions dropped: answer missing, empty or outside the context " \
         "(past_end, negative)" in caplog.text
  assert "train.json: 1 training answers whose text is not at answer_start (kept as given) (moved)" in caplog.text
  with pytest.raises(UserError, match=r"2 training questions dropped.*data\.strict=true"):
    squad.check_answers(examples, "train.json", strict=True)


def test_duplicate_squad_ids_are_refused(tmp_path):
  qas = [{"id": "q", "question": "who", "answers": []}, {"id": "q", "question": "what", "answers": []}]
  write_squad(tmp_path / "dev.json", qas)
  with pytest.raises(UserError, match="question id 'q' appears twice"):
    squad.read_json(str(tmp_path / "dev.json"))


@pytest.mark.parametrize("kind", ["wordpiece", "sentencepiece"])
@pytest.mark.parametrize("content, skipped", [(b"", "the files are empty"),
                                              (bytes(range(256)) * 40, "1 skipped files")])
def test_vocab_from_an_empty_or_binary_corpus_is_an_error(tmp_path, capsys, kind, content, skipped):
  (tmp_path / "corpus.txt").write_bytes(content)
  line = one_error_line(capsys, ["vocab", "--corpus", str(tmp_path / "corpus.txt"), "--type", kind,
                                 "--size", "100", "--output", str(tmp_path / "out")])
  assert f"no text to learn a vocabulary from ({skipped}" in line
  assert not (tmp_path / "out").exists()


def test_a_valid_line_over_one_mib_is_read_whole(tmp_path):
  long_line = ("ünïcode words " * 120_000).strip()  # 1.8 MB of valid UTF-8 on one line
  path = tmp_path / "corpus.txt"
  path.write_text(f"first line\n{long_line}\nlast line\n", encoding="utf-8")
  stats = corpora.Stats()
  (document, _, _), = corpora.TextSource([str(path)], corpora.SENTENCE_PER_LINE, stats).read(str(path), 0, 0)
  assert document == ["first line", long_line, "last line"]
  assert not stats["skipped_lines"] and not stats["overlong_lines"]


def test_a_line_over_the_limit_is_counted_as_overlong_not_as_bad_utf8(tmp_path, monkeypatch):
  monkeypatch.setattr(corpora, "_MAX_LINE_BYTES", 3 << 20)
  path = tmp_path / "corpus.txt"
  path.write_bytes(b"first\n" + b"x" * (4 << 20) + b"\nlast\n")
  stats = corpora.Stats()
  documents = list(corpora.TextSource([str(path)], corpora.DOCUMENT_PER_LINE, stats).read(str(path), 0, 0))
  assert [d for d, _, _ in documents] == [["first"], ["last"]]
  assert documents[-1][1] == path.stat().st_size  # the offset after "last" is the file's end
  assert (stats["overlong_lines"], stats["skipped_lines"]) == (1, 0)


@pytest.mark.parametrize("value, message", [
    ("{0: [1]}", "model.pruned_heads='{0: [1]}' is not JSON"),
    ("[[0], [7]]", "model.pruned_heads: head 7 of layer 1 is out of range (num_heads=2, heads 0..1)"),
    ("3", "model.pruned_heads='3' must be a JSON object {layer: [heads]}"),
])
def test_pruned_heads_on_the_command_line(tmp_path, capsys, value, message):
  line = one_error_line(capsys, ["pretrain", "--config", "configs/bert.py:demo", "--workdir", str(tmp_path),
                                 "--config.model.scan_layers=False", f"--config.model.pruned_heads={value}"])
  assert message in line


@pytest.mark.parametrize("unlabelled", ["train.tsv", "dev.tsv"])
def test_glue_tsv_without_a_label_column(tmp_path, capsys, vocab, unlabelled):
  """Before: the run went to exit 0 and reported `score nan`."""
  for name in ("train.tsv", "dev.tsv"):
    rows = ["the cat\t1", "a dog\t0"] * 8
    if name == unlabelled:
      rows = [r.split("\t")[0] for r in rows]
    (tmp_path / name).write_text("sentence" + ("" if name == unlabelled else "\tlabel") + "\n" + "\n".join(rows) + "\n")
  line = one_error_line(capsys, finetune(tmp_path / "run", "configs/glue.py:sst2", f"--config.data.vocab={vocab}",
                                         f"--config.data.data_dir={tmp_path}", "--config.train.batch_size=4"))
  assert line.endswith(f"{tmp_path}/{unlabelled}: no label column 'label' (header: ['sentence']); training and "
                       "dev files need one (only test files go without)")


def test_glue_test_tsv_without_labels_stays_valid(tmp_path):
  from bert_jax.config_utils import load_config  # pylint: disable=import-outside-toplevel
  (tmp_path / "test.tsv").write_text("index\tsentence\n0\tthe cat\n1\ta dog\n")
  config = load_config("configs/glue.py:sst2", [f"--config.data.data_dir={tmp_path}"])
  assert glue._read_split(config, glue.SPECS["sst2"], "test") == [  # pylint: disable=protected-access
      ("the cat", None, None), ("a dog", None, None)]


def test_ner_tag_outside_the_labels_names_file_and_line(tmp_path, capsys, vocab):
  (tmp_path / "train.txt").write_text("-DOCSTART- O\n\nthe B-ORG\ncat B-ANIMAL\n\n")
  (tmp_path / "valid.txt").write_text("the O\n\n")
  line = one_error_line(capsys, finetune(tmp_path / "run", "configs/ner.py:conll2003", f"--config.data.vocab={vocab}",
                                         f"--config.data.data_dir={tmp_path}"))
  assert line.endswith(f"{tmp_path}/train.txt:4: NER tag 'B-ANIMAL' is not one of task.labels ('O', 'B-PER', "
                       "'I-PER', 'B-ORG', 'I-ORG', 'B-LOC', 'I-LOC', 'B-MISC', 'I-MISC'); fix the line, or add the "
                       "tag to task.labels")


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOBS = {"pretrain": ["pretrain", "--config", os.path.join(ROOT, "configs/bert.py:demo")],
        "finetune": ["finetune", "--config", os.path.join(ROOT, "configs/glue.py:embedded")]}


@pytest.mark.parametrize("job", sorted(JOBS))
def test_an_empty_workdir_writes_nothing_here(tmp_path, capsys, monkeypatch, job):
  """Before: config.json, vocab.txt, run.lock and checkpoints/ landed in the current folder."""
  monkeypatch.chdir(tmp_path)
  line = one_error_line(capsys, [*JOBS[job], "--workdir", ""])
  assert line.endswith("--workdir is an empty path; name a directory (e.g. runs/demo)")
  assert not os.listdir(tmp_path)


@pytest.mark.parametrize("job", sorted(JOBS))
def test_a_workdir_that_is_a_file(tmp_path, capsys, job):
  (tmp_path / "run").write_text("notes\n")
  line = one_error_line(capsys, [*JOBS[job], "--workdir", str(tmp_path / "run")])
  assert line.endswith(f"--workdir {tmp_path}/run is a file; name a directory")
  assert (tmp_path / "run").read_text() == "notes\n"


@pytest.mark.parametrize("job", sorted(JOBS))
def test_init_from_that_does_not_exist_names_it_and_leaves_nothing(tmp_path, capsys, job):
  """Before: "no config.json", and a run.lock left in the workdir."""
  line = one_error_line(capsys, [*JOBS[job], "--workdir", str(tmp_path / "run"),
                                 f"--config.init_from={tmp_path}/nowhere/ckpt"])
  assert line.endswith(f"init_from: {tmp_path}/nowhere/ckpt does not exist; give a bert_jax workdir or params "
                       "checkpoint, a Hugging Face folder or an original TF checkpoint")
  assert not os.path.exists(tmp_path / "run")


_HF_SIZES = {"vocab_size": 100, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 37}
# family's config.json with one wrongly typed field: (its keys, the field, the type the message names)
_MISTYPED_HF = {
    "bert": ({**_HF_SIZES, "hidden_size": "64"}, "hidden_size", "an integer"),
    "albert": ({**_HF_SIZES, "hidden_size": 64, "num_attention_heads": 4.0}, "num_attention_heads", "an integer"),
    "electra": ({**_HF_SIZES, "hidden_size": 64, "layer_norm_eps": "1e-12"}, "layer_norm_eps", "a number"),
    "camembert": ({**_HF_SIZES, "hidden_size": 64, "hidden_dropout_prob": "0.1"}, "hidden_dropout_prob", "a number"),
    "xlnet": ({"vocab_size": 100, "d_model": "64", "n_layer": 2, "n_head": 4, "d_inner": 37}, "d_model",
              "an integer"),
    "modernbert": ({**_HF_SIZES, "hidden_size": "64"}, "hidden_size", "an integer"),
    "mobilebert": ({**_HF_SIZES, "hidden_size": 64, "use_bottleneck": "yes"}, "use_bottleneck", "true or false"),
}


@pytest.mark.parametrize("family", sorted(_MISTYPED_HF))
def test_a_wrongly_typed_hf_config_field_is_one_line(tmp_path, capsys, family):
  """Before: a TypeError in the family's config class (ModernBertConfig.__post_init__ comparing '64' <= 0)."""
  import safetensors.numpy  # pylint: disable=import-outside-toplevel
  keys, field, expected = _MISTYPED_HF[family]
  (tmp_path / "hf").mkdir()
  (tmp_path / "hf" / "config.json").write_text(json.dumps({"model_type": family, **keys}))
  (tmp_path / "hf" / "model.safetensors").write_bytes(safetensors.numpy.save({}))
  line = one_error_line(capsys, ["convert", "--from", "hf", str(tmp_path / "hf"), str(tmp_path / "out")])
  assert line.endswith(f"{tmp_path}/hf/config.json: {field} is {keys[field]!r} "
                       f"({'a float' if isinstance(keys[field], float) else 'a string'}); expected {expected}"), line
  assert not (tmp_path / "out").exists()


# Attention backends that cannot run here or at this length, for each kind of job: one line before the workdir
# exists (before: cudnn's 81-line traceback, splash's length error after config.json, vocab.txt and checkpoints/).
_BACKEND_REFUSALS = {
    "cudnn": (["--config.model.attention=cudnn", "--config.model.attention_dropout=0"],
              "model.attention='cudnn' needs a GPU with cuDNN and the step runs on cpu: set model.attention to a "
              "backend that runs there: 'dot'"),
    "splash_length": (["--config.model.attention=splash", "--config.model.attention_dropout=0",
                       "--config.data.max_seq_length=100"],
                      "the length 100 is not a multiple of 128"),
    "splash_dropout": (["--config.model.attention=splash", "--config.model.attention_dropout=0.1",
                        "--config.data.max_seq_length=128"],
                       "model.attention='splash' has no dropout on the attention probabilities"),
}


@pytest.mark.parametrize("config", ["configs/bert.py:demo", "configs/modernbert.py:tiny", "configs/glue.py:embedded"])
@pytest.mark.parametrize("refusal", sorted(_BACKEND_REFUSALS))
def test_an_attention_backend_that_cannot_run_is_refused_before_the_workdir(tmp_path, capsys, config, refusal):
  overrides, message = _BACKEND_REFUSALS[refusal]
  command = "finetune" if "glue" in config else "pretrain"
  line = one_error_line(capsys, [command, "--config", os.path.join(ROOT, config), "--workdir",
                                 str(tmp_path / "run"), *overrides])
  assert message in line, line
  assert not (tmp_path / "run").exists()
