"""Task readers: GLUE TSV layouts, tfds paths under tfds.testing.mock_data (GLUE, SQuAD, CoNLL-2003),
NER first-sub-token labels, leaderboard prediction files."""
import ml_collections
import numpy as np
import pytest

from bert_jax.finetune import glue, ner, task_registry
from bert_jax.configs import glue as glue_configs
from bert_jax.configs import ner as ner_configs
from bert_jax.configs import squad as squad_configs
from bert_jax.data_pipelines import tftools
from bert_jax.data_pipelines.tokenizers import load_tokenizer

tfds = tftools.tf_module("tensorflow_datasets")  # after TensorFlow without Keras

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "bronco", "##s", "won", "in", "denver", "."]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
  path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
  path.write_text("\n".join(WORDS) + "\n")
  return load_tokenizer(str(path), lower_case=True)


def _write(path, lines):
  path.write_text("\n".join("\t".join(cells) for cells in lines) + "\n")
  return str(path)


def test_glue_tsv_layouts(tmp_path):
  cola = _write(tmp_path / "cola.tsv", [["gj04", "1", "", "The broncos won."], ["gj04", "0", "*", "Won the."]])
  assert glue.read_tsv(cola, glue.SPECS["cola"]) == [("The broncos won.", None, "1"), ("Won the.", None, "0")]
  cola_test = _write(tmp_path / "cola_test.tsv", [["index", "sentence"], ["0", "A test."]])
  assert glue.read_tsv(cola_test, glue.SPECS["cola"]) == [("A test.", None, None)]
  mrpc = _write(tmp_path / "mrpc.tsv", [["\ufeffQuality", "#1 ID", "#2 ID", "#1 String", "#2 String"],
                                        ["1", "1", "2", "a b", "c d"], ["broken row"]])
  assert glue.read_tsv(mrpc, glue.SPECS["mrpc"]) == [("a b", "c d", "1")]
  header = ["index", "promptID", "pairID", "genre", "s1b", "s2b", "s1p", "s2p", "sentence1", "sentence2",
            "label1", "gold_label"]
  mnli = _write(tmp_path / "mnli.tsv", [header, ["0", "", "", "", "", "", "", "", "p \"q", "h", "x", "neutral"]])
  rows = glue.read_tsv(mnli, glue.SPECS["mnli"])
  assert rows == [('p "q', "h", "neutral")]  # quotes are text, not CSV quoting
  features = glue.featurize(rows, glue.SPECS["mnli"], _FakeTokenizer(), 8)
  assert features["label"].tolist() == [1]  # tfds order: entailment, neutral, contradiction


class _FakeTokenizer:
  special_ids = {"[CLS]": 2, "[SEP]": 3, "[PAD]": 0}

  def encode(self, text):
    return [10 + len(w) for w in text.split()]


def test_pair_encoding_truncates_longest_first():
  row = glue.feats.encode_pair(_FakeTokenizer(), [11, 12, 13, 14, 15], [21, 22], 8)
  assert row["input_ids"].tolist() == [2, 11, 12, 13, 3, 21, 22, 3]
  assert row["token_type_ids"].tolist() == [0] * 5 + [1] * 3


def test_leaderboard_files(tmp_path):
  features = {"example_weight": np.array([1, 1, 0], np.float32)}
  glue.write_predictions(str(tmp_path), "RTE.tsv", features, {"logits": np.array([[2, 1], [0, 3], [0, 0]])},
                         glue.SPECS["rte"])
  assert (tmp_path / "RTE.tsv").read_text() == "index\tprediction\n0\tentailment\n1\tnot_entailment\n"
  glue.write_predictions(str(tmp_path), "STS-B.tsv", features, {"logits": np.array([5.7, 2.25, 0.0])},
                         glue.SPECS["stsb"])
  assert (tmp_path / "STS-B.tsv").read_text() == "index\tprediction\n0\t5.000\n1\t2.250\n"


def test_ner_labels_first_sub_token_only(tokenizer):
  labels = ner_configs.CONLL2003_LABELS
  rows, positions = ner.featurize([(["Broncos", "won", "in", "Denver"], ["B-ORG", "O", "O", "B-LOC"])],
                                  labels, tokenizer, 16)
  assert [WORDS[i] for i in rows["input_ids"][0][:7]] == ["[CLS]", "bronco", "##s", "won", "in", "denver", "[SEP]"]
  assert positions[0].tolist() == [1, 3, 4, 5]
  assert rows["label_weights"][0][:7].tolist() == [0, 1, 0, 1, 1, 1, 0]
  assert rows["token_labels"][0][[1, 5]].tolist() == [labels.index("B-ORG"), labels.index("B-LOC")]
  outputs = {"logits": np.eye(len(labels))[rows["token_labels"]]}
  assert ner.predicted_tags(outputs, [(["Broncos", "won", "in", "Denver", "cut"], None)], positions, labels) == [
      ["B-ORG", "O", "O", "B-LOC", "O"]]  # a word past the length limit is predicted O


def test_conll_file_reading(tmp_path):
  path = _write(tmp_path / "train.txt", [["-DOCSTART-", "-X-", "-X-", "O"], [""], ["EU", "NNP", "B-NP", "I-ORG"],
                                         ["rejects", "VBZ", "B-VP", "O"], [""], ["Peter", "NNP", "B-NP", "I-PER"]])
  assert ner.read_conll(path) == [(["EU", "rejects"], ["I-ORG", "O"]), (["Peter"], ["I-PER"])]


def _small(config, **data):
  config.train.eval_batch_size = 8
  config.data.update(max_seq_length=32, **data)
  return config


def test_tfds_glue_mnli_has_matched_and_mismatched_dev(tokenizer):
  config = _small(glue_configs.get_config("mnli"))
  config.predict_split = "test"
  with tfds.testing.mock_data(num_examples=5):
    task = task_registry.build_task(config, tokenizer, need_train=True)
  assert [s.name for s in task.evals] == ["dev_matched", "dev_mismatched"]
  assert task.head == "classification" and task.num_labels == 3 and len(task.train["label"]) == 5
  assert task.evals[0].features["input_ids"].shape == (8, 32)  # padded to the eval batch
  metrics = task.evals[0].evaluate({"logits": np.zeros((8, 3))})
  assert set(metrics) == {"accuracy", "loss"} and metrics["loss"] == pytest.approx(np.log(3))  # uniform


def test_tfds_glue_stsb_is_regression(tokenizer):
  with tfds.testing.mock_data(num_examples=4):
    task = task_registry.build_task(_small(glue_configs.get_config("stsb")), tokenizer, need_train=True)
  assert task.head == "regression" and task.train["label"].dtype == np.float32
  metrics = task.evals[0].evaluate({"logits": np.arange(8, dtype=np.float32)})
  assert set(metrics) == {"pearson", "spearman", "loss"}
  constant = task.evals[0].evaluate({"logits": np.full(8, 2.5, np.float32)})
  assert constant["pearson"] == constant["spearman"] == 0.0 and "constant predictions" in constant["note"]


def test_tfds_conll2003(tokenizer):
  with tfds.testing.mock_data(num_examples=4):
    task = task_registry.build_task(_small(ner_configs.get_config("conll2003")), tokenizer, need_train=True)
  assert task.head == "token" and task.train["token_labels"].shape == (4, 32)
  assert set(task.evals[0].evaluate({"logits": np.zeros((8, 32, 9))})) == {"precision", "recall", "f1"}


def test_tfds_squad_v2(tokenizer):
  config = _small(squad_configs.get_config("v2"))
  config.task.max_query_length = 16  # questions + [CLS] + 2 x [SEP] must leave room in 32 tokens
  with tfds.testing.mock_data(num_examples=4):
    task = task_registry.build_task(config, tokenizer, need_train=False)
  dev = task.evals[0]
  rows = dev.features["input_ids"].shape[0]
  scores = dev.evaluate({"start_logits": np.zeros((rows, 32)), "end_logits": np.zeros((rows, 32))})
  assert set(scores) == {"exact_match", "f1"} and task.head == "span"


def test_config_presets_exist():
  for name in glue_configs.GLUE_TASKS + ("embedded",):
    assert isinstance(glue_configs.get_config(name), ml_collections.ConfigDict)
  with pytest.raises(KeyError):
    glue_configs.get_config("sts")
