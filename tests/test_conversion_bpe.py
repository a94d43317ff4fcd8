"""Byte-level BPE against the `tokenizers` package, and RoBERTa's tokenizer travelling with its checkpoint."""
import json
import os

import pytest

tokenizers = pytest.importorskip("tokenizers")

from bert_jax.conversion.bpe import ByteLevelBPETokenizer  # noqa: E402

CORPUS = ["The quick brown fox jumps over the lazy dog's back, doesn't it?",
          "Numbers 12345 and 3.14159 — with ünïcödé, naïve café, 東京 and emoji 🙂🙂.",
          "  leading spaces,\ttabs\nand newlines   at the end   ",
          "We'll see: they're here; I'm sure you've heard it'd work."] * 20
SAMPLES = CORPUS[:4] + ["unseen wordsmithery zzzqx", "Ⅻ ² ½ 〇 numerals", "", "a", "don't  stop 🙂 now"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  directory = str(tmp_path_factory.mktemp("bpe"))
  reference = tokenizers.ByteLevelBPETokenizer()
  reference.train_from_iterator(CORPUS, vocab_size=400, min_frequency=1,
                                special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
  reference.save_model(directory)
  return reference, directory


def test_encode_matches_tokenizers(trained):
  reference, directory = trained
  ours = ByteLevelBPETokenizer(os.path.join(directory, "vocab.json"), os.path.join(directory, "merges.txt"))
  for text in SAMPLES:
    assert ours.encode(text) == reference.encode(text).ids, text
    assert ours.decode(ours.encode(text)) == text
  assert ours.vocab_size == reference.get_vocab_size()
  assert ours.special_ids == {"[PAD]": 1, "[UNK]": 3, "[CLS]": 0, "[SEP]": 2, "[MASK]": 4}
  assert ours.id_to_token(0) == "<s>"


def test_roberta_directory_brings_its_tokenizer(trained, tmp_path):
  import bert_jax
  _, directory = trained
  for name in ("vocab.json", "merges.txt"):
    with open(os.path.join(directory, name), "rb") as src, open(tmp_path / name, "wb") as dst:
      dst.write(src.read())
  with open(tmp_path / "config.json", "w") as f:
    json.dump({"model_type": "roberta", "architectures": ["RobertaForMaskedLM"]}, f)
  tokenizer = bert_jax.load_tokenizer(str(tmp_path))
  assert isinstance(tokenizer, ByteLevelBPETokenizer)
  assert tokenizer.encode("the lazy dog") == trained[0].encode("the lazy dog").ids


def test_converted_roberta_fine_tunes_and_its_tokenizer_travels_on(trained, tmp_path):
  """HF RoBERTa (byte-level BPE) -> bert-jax convert -> finetune -> the fine-tuned workdir's tokenizer."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  import bert_jax
  from bert_jax import cli
  reference, directory = trained
  torch.manual_seed(0)
  hf = transformers.RobertaForMaskedLM(transformers.RobertaConfig(
      vocab_size=reference.get_vocab_size(), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
      intermediate_size=64, max_position_embeddings=40, pad_token_id=1))
  hf.save_pretrained(tmp_path / "hf")
  for name in ("vocab.json", "merges.txt"):
    with open(os.path.join(directory, name), "rb") as src, open(tmp_path / "hf" / name, "wb") as dst:
      dst.write(src.read())
  assert cli.main(["convert", "--from", "hf", str(tmp_path / "hf"), str(tmp_path / "ckpt")]) == 0
  data = tmp_path / "glue"
  data.mkdir()
  for split in ("train", "dev"):
    lines = [f"{('false', 'true')[i % 2]} {' '.join(CORPUS[i % 4].split())}\t{i % 2}" for i in range(32)]
    (data / f"{split}.tsv").write_text("sentence\tlabel\n" + "\n".join(lines) + "\n")
  workdir = tmp_path / "ft"
  assert cli.main(["finetune", "--config", "configs/glue.py:sst2", "--workdir", str(workdir),
                   f"--config.init_from={tmp_path / 'ckpt'}", f"--config.data.data_dir={data}",
                   "--config.data.max_seq_length=32", "--config.train.batch_size=16",
                   "--config.train.epochs=1", "--config.train.tensorboard=false"]) == 0
  assert 0.0 <= json.load(open(workdir / "eval_results.json"))["accuracy"] <= 1.0
  travelled = bert_jax.load_tokenizer(str(workdir))
  assert isinstance(travelled, ByteLevelBPETokenizer)
  assert travelled.encode(SAMPLES[1]) == reference.encode(SAMPLES[1]).ids
