"""The documented paths (README and the docs site), run as they are written, at tiny sizes (issue 37): GLUE from tfds with no network, the
pod-scale records recipe with its hold-out, `info` on a mesh this machine lacks, RoBERTa `tiny`'s own
SentencePiece vocabulary, whole-word masking on split words, predict on an adapters workdir fine-tuned
from a pretraining run, an int8 teacher, and the shipped NER and SQuAD samples."""
import json
import os
import re
import string
import time

import jax
import numpy as np
import pytest

import data_fixtures
from bert_jax import cli, jobs
from bert_jax.config_utils import load_config
from bert_jax.configs import common
from bert_jax.configs import ner as ner_config
from bert_jax.configs import squad as squad_config
from bert_jax.data_pipelines import embedded, vocab
from bert_jax.data_pipelines.errors import DataError
from bert_jax.errors import UserError
from bert_jax.data_pipelines.pipeline import make_pretrain_input
from bert_jax.training import info, partitioning, step

SIZES = ["--config.model.num_layers=1", "--config.model.hidden_size=32", "--config.model.num_heads=2", "--config.model.intermediate_size=64",
         "--config.data.max_seq_length=16", "--config.data.max_predictions_per_seq=4", "--config.train.batch_size=8",
         "--config.train.tensorboard=false"]
FINETUNE = ["--config.train.batch_size=8", "--config.train.eval_batch_size=16", "--config.train.epochs=1",
            "--config.train.tensorboard=false"]
CORPUS = dict(num_docs=24, sentences_per_doc=5)


def _batches(data_cfg, split, n=2):
  data = make_pretrain_input(data_cfg, global_batch_size=8, process_index=0, process_count=1, split=split)
  try:
    return [next(data) for _ in range(n)]
  finally:
    data.close()


@pytest.fixture(scope="module")
def records_run(tmp_path_factory):
  """docs/guides/data.md, "Input at pod scale": `data prepare --format bert_tfrecord`, then `pretrain` on the records, as
  written (no data.eval_corpus), with an evaluation; the workdir is the base the later tests fine-tune."""
  root = tmp_path_factory.mktemp("records")
  corpus = data_fixtures.write_corpus(root / "text", **CORPUS)
  data = [f"--config.data.corpus={corpus}", "--config.data.eval_fraction=0.25", "--config.data.num_shards=2"]
  assert cli.main(["data", "prepare", "--format", "bert_tfrecord", "--config", "configs/bert.py:tiny",
                   "--output", str(root / "rows"), "--epochs", "2", "--workers", "1", *SIZES, *data]) == 0
  run = ["--config.data.format=bert_tfrecord", f"--config.data.corpus={root / 'rows'}/*.tfrecord",
         "--config.train.num_steps=2", "--config.train.eval_every_steps=2", "--config.train.eval_steps=1"]
  assert cli.main(["pretrain", "--config", "configs/bert.py:tiny", "--workdir", str(root / "demo"),
                   *SIZES, *data[1:], *run]) == 0
  return root, corpus


def test_records_recipe_writes_and_evaluates_on_its_hold_out(records_run, capsys):
  root, corpus = records_run
  metadata = json.loads((root / "rows" / "metadata.json").read_text())
  held_out = json.loads((root / "rows" / "eval" / "metadata.json").read_text())
  assert (metadata["split"], metadata["epochs"], held_out["split"], held_out["epochs"]) == ("train", 2, "eval", 1)
  assert held_out["rows"] == sum(held_out["rows_per_file"].values()) > 0
  assert sorted(p.name for p in (root / "rows" / "eval").glob("*.tfrecord")) == sorted(held_out["rows_per_file"])
  rows = [json.loads(line) for line in (root / "demo" / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows if r.get("eval")] == [2]
  # the eval/ records are the text pipeline's held-out rows: the same batches (epoch 0, dynamic masks)
  text = common.data_config(corpus=corpus, vocab=data_fixtures.embedded_paths()[1], max_seq_length=16,
                            max_predictions_per_seq=4, eval_fraction=0.25, num_shards=2)
  records = common.data_config(**{**text.to_dict(), "format": "bert_tfrecord",
                                  "corpus": str(root / "rows" / "*.tfrecord")})
  capsys.readouterr()
  for a, b in zip(_batches(text, "eval"), _batches(records, "eval")):
    assert set(a) == set(b)
    for name in a:
      np.testing.assert_array_equal(a[name], b[name], err_msg=name)
  assert "hold-out records beside data.corpus" in capsys.readouterr().out
  (root / "rows" / "eval").rename(root / "moved")
  with pytest.raises(DataError, match="has no hold-out: no records match .*`bert-jax data prepare"):
    _batches(records, "eval")
  (root / "moved").rename(root / "rows" / "eval")


def test_glue_from_tfds_without_a_network_is_one_line(tmp_path, monkeypatch, capsys):
  """The download path up to the network: tfds finds glue/sst2 unprepared, asks its servers through a proxy
  that refuses, and the job ends in one line (not after tfds' ~3.5 minutes of retries)."""
  for name in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"):
    monkeypatch.setenv(name, "http://127.0.0.1:9")  # the discard port: nothing listens
  for name in ("NO_PROXY", "no_proxy"):
    monkeypatch.delenv(name, raising=False)
  start = time.monotonic()
  code = cli.main(["finetune", "--config", "configs/glue.py:sst2", "--workdir", str(tmp_path / "run"),
                   f"--config.data.tfds_data_dir={tmp_path / 'tfds'}", *FINETUNE])
  err = capsys.readouterr().err.strip()
  assert code == 2 and len(err.splitlines()) == 1, err
  assert "'glue/sst2' is not prepared" in err and "download failed" in err and "dl.fbaipublicfiles.com" in err
  assert "--config.data.data_dir to a folder with the GLUE sst2 TSVs" in err and "tfds_data_dir" in err
  assert time.monotonic() - start < 120  # a hang guard: the probe waits at most 3 x 10 s


def test_info_sizes_a_mesh_this_machine_lacks(capsys):
  """docs/reference/configuration.md: the command as printed; a mesh of more devices than this process has (8) is sized on
  an abstract mesh, and that sizes each device's bytes exactly as the real 8-device mesh does."""
  assert cli.main(["info", "--json", "--config", "configs/bert.py:large", "--config.mesh.fsdp=8"]) == 0
  large = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert large["mesh"] == {"data": 1, "fsdp": 8, "tensor": 1} and round(large["num_params"] / 1e6) == 335
  config = load_config("configs/bert.py:tiny", ["--config.mesh.fsdp=8", "--config.train.batch_size=64"])
  real = step.build_train_setup(config, mesh=partitioning.make_mesh(config.mesh))

  def model_info(config, num_devices=0):  # what `bert-jax info` does: the job's step on the abstract mesh
    return info.model_info(*jobs.with_step(config, "configs/bert.py:tiny", "info").step(
        config, info.sizing_mesh(config.mesh, num_devices)))

  assert len(jax.devices()) == 8 and model_info(config)["param_bytes_per_device"] == info.bytes_per_device(
      real.abstract_state.params, real.state_shardings.params)
  assert cli.main(["info", "--json", "--config", "configs/bert.py:tiny", "--config.mesh.fsdp=16"]) == 0
  wide = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert (wide["machine_devices"], wide["devices"], wide["mesh"]) == (8, 16, {"data": 1, "fsdp": 16, "tensor": 1})
  eight = model_info(config)
  # fsdp splits every weight with an `embed` axis 16 ways instead of 8; LayerNorms and biases stay whole
  assert eight["param_bytes_per_device"] > wide["param_bytes_per_device"] > eight["param_bytes_per_device"] / 2
  assert model_info(config, num_devices=32)["mesh"] == {"data": 4, "fsdp": 8, "tensor": 1}
  with pytest.raises(UserError, match="does not fit 12 devices"):
    model_info(config, num_devices=12)


def test_roberta_tiny_learns_its_sentencepiece_vocabulary_from_the_embedded_corpus(tmp_path, capsys):
  """configs/roberta.py:tiny with no data.vocab: a cased BPE model beside the embedded corpus; the batches'
  tokens, masks put back, decode to the corpus's own text."""
  assert cli.main(["data", "preview", "--config", "configs/roberta.py:tiny", "--output", str(tmp_path / "p.npz"),
                   "--num-batches", "1", "--config.data.max_seq_length=32", "--config.train.batch_size=8"]) == 0
  capsys.readouterr()
  model = embedded.ensure_sentencepiece(lower_case=False)
  assert os.path.dirname(model) == os.path.dirname(embedded.ensure_embedded()[0])
  import sentencepiece as spm  # pylint: disable=import-outside-toplevel
  sp = spm.SentencePieceProcessor(model_file=model)
  merges = [sp.get_score(i) for i in range(sp.get_piece_size()) if not (sp.is_control(i) or sp.is_byte(i)
                                                                       or sp.is_unknown(i))]
  assert merges == [-float(rank) for rank in range(len(merges))]  # BPE: each piece scored by its merge rank
  assert sp.get_piece_size() <= 8192 and sp.encode("The interpreter", out_type=str)[0] == "▁The"
  saved = np.load(tmp_path / "p.npz")
  batch = {k: saved[k][0] for k in ("input_ids", "input_mask", "masked_lm_positions", "masked_lm_ids",
                                    "masked_lm_weights")}
  corpus = " ".join(open(embedded.ensure_embedded()[0], encoding="utf-8").read().split())
  specials = set(saved["special_token_ids"].tolist())
  for row in range(2):
    ids = batch["input_ids"][row].copy()
    weights = batch["masked_lm_weights"][row] > 0
    ids[batch["masked_lm_positions"][row][weights]] = batch["masked_lm_ids"][row][weights]
    pieces = [int(i) for i in ids[:int(batch["input_mask"][row].sum())] if int(i) not in specials]
    assert sp.decode(pieces[:12]) in corpus


def test_whole_word_masking_needs_split_words(tmp_path):
  """On the demo vocabulary no continuation piece shows up, so whole-word masking is token masking; with a
  small vocabulary learnt from the same text, words split and every masked word is masked whole."""
  corpus = data_fixtures.write_corpus(tmp_path / "text", **CORPUS)
  small = vocab.train_vocab(corpus, "wordpiece", 300, str(tmp_path / "v"))
  for vocab_file, split_words in ((data_fixtures.embedded_paths()[1], False), (small, True)):
    cfg = lambda masking: common.data_config(corpus=corpus, vocab=vocab_file, max_seq_length=64,  # noqa: E731
                                             max_predictions_per_seq=10, masking=masking, eval_fraction=0.0)
    token, whole = _batches(cfg("token"), "train"), _batches(cfg("whole_word"), "train")
    pieces = np.array([line.rstrip("\n") for line in open(vocab_file, encoding="utf-8")])
    continuation = np.char.startswith(pieces, "##")
    special = {i for i, p in enumerate(pieces) if p in ("[CLS]", "[SEP]", "[PAD]", "[MASK]")}
    assert continuation[np.concatenate([b["input_ids"] for b in token])].any() == split_words
    same = all(np.array_equal(a[k], b[k]) for a, b in zip(token, whole) for k in a)
    assert same != split_words
    if not split_words:
      continue
    whole_masked = 0
    for b in whole:
      for row in range(len(b["input_ids"])):
        original = b["input_ids"][row].copy()
        weights = b["masked_lm_weights"][row] > 0
        original[b["masked_lm_positions"][row][weights]] = b["masked_lm_ids"][row][weights]
        masked = set(b["masked_lm_positions"][row][weights].tolist())
        words = []  # a word: a piece and the continuation pieces after it; special tokens stand alone
        for position, piece in enumerate(original[:int(b["input_mask"][row].sum())]):
          if continuation[piece] and words and original[words[-1][-1]] not in special:
            words[-1].append(position)
          else:
            words.append([position])
        for word in words:
          assert len(masked.intersection(word)) in (0, len(word)), (word, masked)
          whole_masked += len(word) > 1 and masked.issuperset(word)
    assert whole_masked > 0


@pytest.fixture(scope="module")
def adapters_run(records_run):
  """docs/guides/finetuning.md: the embedded task with train.mode=adapters from the pretraining workdir."""
  root, _ = records_run
  run = ["--config.task.num_train=64", "--config.task.num_dev=16", "--config.data.max_seq_length=16",
         "--config.train.mode=adapters", "--config.train.adapter_size=4", *FINETUNE]
  assert cli.main(["finetune", "--config", "configs/glue.py:embedded", f"--config.init_from={root / 'demo'}",
                   "--workdir", str(root / "adapters"), *run]) == 0
  return root, root / "adapters"


def test_predict_takes_an_adapters_workdir_fine_tuned_from_pretraining(adapters_run, tmp_path):
  import bert_jax  # pylint: disable=import-outside-toplevel
  from bert_jax.finetune import embedded as task  # pylint: disable=import-outside-toplevel
  _, workdir = adapters_run
  rows = task.make_rows(task.corpus_sentences(16 + 64)[:16], seed=1)
  (tmp_path / "dev.txt").write_text("".join(text + "\n" for text, _, _ in rows), encoding="utf-8")
  assert cli.main(["predict", "--model", str(workdir), "--input", str(tmp_path / "dev.txt"),
                   "--output", str(tmp_path / "out.jsonl")]) == 0
  labels = [json.loads(line)["label"] for line in (tmp_path / "out.jsonl").read_text().splitlines()]
  written = (workdir / "predictions" / "EMBEDDED.dev.tsv").read_text().splitlines()[1:]
  assert labels == [line.split("\t")[1] for line in written]
  predictor = bert_jax.Predictor.load(str(workdir))
  assert [r["label"] for r in predictor([text for text, _, _ in rows])] == labels
  assert "mlm_head" not in predictor.params and "sentence_classifier" not in predictor.params


SLOW = pytest.mark.skipif(not os.environ.get("BERT_JAX_SLOW_TESTS"),
                          reason="a fine-tuning or quantize run more (~10-35 s of CPU); set BERT_JAX_SLOW_TESTS=1")


@SLOW
def test_an_int8_teacher_is_refused_as_int8(adapters_run, capsys):
  pytest.importorskip("qwix")
  root, workdir = adapters_run
  assert cli.main(["quantize", "--model", str(workdir), "--output", str(root / "int8")]) == 0
  capsys.readouterr()
  assert cli.main(["distill", "--config", "configs/distill.py:embedded", f"--config.distill.teacher={root / 'int8'}",
                   "--workdir", str(root / "student")]) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and "holds int8 weights" in err and f"teacher={workdir}" in err, err


def _squad_normalize(text):
  """The official SQuAD script's normalisation: lower case, no punctuation, articles or extra spaces."""
  text = "".join(c for c in text.lower() if c not in set(string.punctuation))
  return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def test_the_shipped_samples_read_cleanly():
  """Every NER tag is CoNLL-2003's and in IOB2 order; every SQuAD answer sits at its answer_start (strict)."""
  from bert_jax.finetune import ner, squad  # pylint: disable=import-outside-toplevel
  counts = {}
  for name in ("train.txt", "valid.txt", "test.txt"):
    sentences = ner.read_conll(os.path.join(ner_config.SAMPLE_DIR, name))
    counts[name] = len(sentences)
    for words, tags in sentences:
      assert len(words) == len(tags) and set(tags) <= set(ner_config.CONLL2003_LABELS), words
      assert all(t[2:] == p[2:] for p, t in zip(["O", *tags], tags) if t.startswith("I-")), words
  assert counts == {"train.txt": 40, "valid.txt": 12, "test.txt": 12}
  for name, questions, impossible in (("train-v1.1", 32, 0), ("dev-v1.1", 12, 0), ("train-v2.0", 40, 8),
                                      ("dev-v2.0", 15, 3)):
    path = os.path.join(squad_config.SAMPLE_DIR, f"{name}.json")
    examples = squad.check_answers(squad.read_json(path), path, strict=True)
    assert (len(examples), sum(e.impossible for e in examples)) == (questions, impossible), name
    for e in examples:
      assert all(e.context[start:start + len(text)] == text for text, start in e.answers) and e.impossible != bool(
          e.answers), e.qid


@SLOW
def test_sample_ner_and_squad_run_offline(records_run):
  root, _ = records_run
  base = [f"--config.init_from={root / 'demo'}", *FINETUNE]
  assert cli.main(["finetune", "--config", "configs/ner.py:sample", "--workdir", str(root / "ner"), *base,
                   "--config.data.max_seq_length=32"]) == 0
  gold = [block.split("\n") for block in open(os.path.join(ner_config.SAMPLE_DIR, "valid.txt")).read().strip().split("\n\n")]
  gold = [[line.split() for line in block] for block in gold if not block[0].startswith("-DOCSTART-")]
  written = (root / "ner" / "predictions" / "ner.dev.txt").read_text().strip().split("\n\n")
  assert len(gold) == len(written) == 12
  assert [[line.split()[:2] for line in block.splitlines()] for block in written] == gold
  assert cli.main(["finetune", "--config", "configs/squad.py:sample-v1", "--workdir", str(root / "squad"), *base,
                   "--config.data.max_seq_length=64", "--config.task.doc_stride=32",
                   "--config.task.max_query_length=24"]) == 0
  dev = json.load(open(os.path.join(squad_config.SAMPLE_DIR, "dev-v1.1.json")))
  truth = {qa["id"]: qa["answers"][0]["text"] for a in dev["data"] for p in a["paragraphs"] for qa in p["qas"]}
  answers = json.loads((root / "squad" / "predictions" / "predictions.dev.json").read_text())
  assert set(answers) == set(truth) and len(truth) == 12
  exact = 100 * np.mean([_squad_normalize(answers[k]) == _squad_normalize(v) for k, v in truth.items()])
  assert json.loads((root / "squad" / "eval_results.json").read_text())["exact_match"] == pytest.approx(exact)

