"""Sentence embeddings at tiny sizes: pooling and the bi-encoder losses against NumPy, STS and retrieval
against scipy and hand counts, and a tiny sentence-transformers folder (cls + max pooling, a 12-token
limit) through convert, `bert-jax embed`, `embed-eval`, `search` and back, against sentence-transformers."""
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
sentence_transformers = pytest.importorskip("sentence_transformers")
scipy_stats = pytest.importorskip("scipy.stats")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import bert_jax  # noqa: E402
from bert_jax import cli  # noqa: E402
from bert_jax.errors import UserError  # noqa: E402
from bert_jax.models.pooling import Pooling  # noqa: E402
from bert_jax.sbert import embed as embed_lib, evaluate, losses  # noqa: E402
from bert_jax.sbert.data import Pairs  # noqa: E402
from test_faults import tmpfs  # noqa: E402,F401  (a small tmpfs: the full-disk test)

WORDS = "the a cat dog sat ran on mat rug fast slow big small red blue ##s ##ed".split()
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]


def _hidden_and_mask(seed=0):
  rng = np.random.default_rng(seed)
  hidden = rng.normal(size=(4, 6, 5)).astype(np.float32)
  mask = np.array([[1] * 6, [1, 1, 1, 0, 0, 0], [1, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 0]], np.int32)
  return hidden, mask


def _numpy_pool(hidden, mask, mode):
  kept = mask[..., None].astype(bool)
  if mode == "cls":
    return hidden[:, 0]
  if mode == "max":
    return np.where(kept, hidden, -np.inf).max(1)
  total, count = np.where(kept, hidden, 0).sum(1), mask.sum(1, keepdims=True)
  return total / (count if mode == "mean" else np.sqrt(count))


@pytest.mark.parametrize("modes,normalize", [(("mean",), False), (("mean",), True), (("cls",), False),
                                             (("max",), True), (("mean_sqrt_len_tokens",), False),
                                             (("max", "cls", "mean"), True)])
def test_pooling_matches_numpy(modes, normalize):
  hidden, mask = _hidden_and_mask()
  expected = np.concatenate([_numpy_pool(hidden, mask, m) for m in modes], axis=-1)
  if normalize:
    expected = expected / np.linalg.norm(expected, axis=-1, keepdims=True)
  pooling = Pooling(modes, normalize, 8)
  got = np.asarray(pooling(jnp.asarray(hidden), jnp.asarray(mask)))
  assert got.shape == (4, len(modes) * 5) == (4, pooling.dimension(5))
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
  # Padding is ignored whatever it holds.
  noisy = np.where(mask[..., None].astype(bool), hidden, 1e3)
  np.testing.assert_allclose(np.asarray(pooling(jnp.asarray(noisy), jnp.asarray(mask))), expected, rtol=1e-5,
                             atol=1e-6)
  assert Pooling.from_dict(pooling.to_dict()) == pooling


def _log_softmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _unit(x):
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


def test_losses_match_numpy():
  softmax, cosine_regression = jax.jit(losses.softmax), jax.jit(losses.cosine_regression)
  ranking_rows = jax.jit(losses.ranking_rows)  # compiled: eager, each of their ops compiles on its own
  rng = np.random.default_rng(1)
  u, v, negatives = (rng.normal(size=(4, 6)).astype(np.float32) for _ in range(3))
  kernel, bias = rng.normal(size=(18, 3)).astype(np.float32), rng.normal(size=3).astype(np.float32)
  labels = np.array([0, 2, 1, 2])
  logits = np.concatenate([u, v, np.abs(u - v)], 1) @ kernel + bias
  np.testing.assert_allclose(softmax(u, v, kernel, bias, labels), -_log_softmax(logits)[np.arange(4), labels],
                             rtol=1e-5)
  scores = np.array([0.9, -0.2, 0.5, 0.0], np.float32)
  cosines = np.sum(_unit(u) * _unit(v), 1)
  np.testing.assert_allclose(cosine_regression(u, v, scores), (cosines - scores) ** 2, rtol=1e-5, atol=1e-7)
  candidates = np.concatenate([v, negatives])  # in-batch positives, then hard negatives
  for scale in (1.0, 20.0):
    expected = -_log_softmax(scale * _unit(u) @ _unit(candidates).T)[np.arange(4), np.arange(4)]
    batch = np.stack([u, v, negatives], 1)
    np.testing.assert_allclose(ranking_rows(batch, batch, 0, scale), expected, rtol=1e-5)
    np.testing.assert_allclose(ranking_rows(batch[1:3], batch, 1, scale), expected[1:3], rtol=1e-5)
  same = np.stack([u, u * 3.0], 1)
  pairs = batch[:, :2]
  assert float(ranking_rows(same, same, 0).mean()) < float(ranking_rows(pairs, pairs, 0).mean())


def test_sts_and_retrieval_match_scipy_and_hand_counts():
  rng = np.random.default_rng(2)
  table = {f"s{i}": rng.normal(size=8) for i in range(12)}
  embed = lambda sentences: np.stack([table[s] for s in sentences])  # noqa: E731
  pairs = Pairs([[f"s{i}" for i in range(6)], [f"s{i}" for i in range(6, 12)]], rng.uniform(0, 5, 6))
  cosines = np.sum(_unit(embed(pairs.columns[0])) * _unit(embed(pairs.columns[1])), 1)
  results = evaluate.sts(embed, pairs)
  assert results["spearman"] == pytest.approx(scipy_stats.spearmanr(pairs.target, cosines)[0])
  assert results["pearson"] == pytest.approx(scipy_stats.pearsonr(pairs.target, cosines)[0])
  queries, corpus = ["s0", "s1", "s2"], ["s3", "s1", "s4", "s5"]
  table["s3"] = table["s0"] * 0.5 + table["s5"]  # not s0 itself: its rank is counted below
  scores = _unit(embed(queries)) @ _unit(embed(corpus)).T
  gold_ranks = [1 + int(np.sum(scores[q] > scores[q, q])) for q in range(3)]
  got = evaluate.retrieval(embed, queries, corpus, ks=(1, 2))
  assert gold_ranks[1] == 1
  assert got["recall@1"] == pytest.approx(np.mean([r <= 1 for r in gold_ranks]))
  assert got["recall@2"] == pytest.approx(np.mean([r <= 2 for r in gold_ranks]))
  assert got["mrr@10"] == pytest.approx(np.mean([1 / r for r in gold_ranks]))
  hits = evaluate.search(embed, ["s1"], corpus, 2)[0]
  assert [i for i, _ in hits] == list(np.argsort(-scores[1])[:2]) and hits[0] == (1, pytest.approx(1.0))


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
  """A tiny random BERT as a sentence-transformers folder: cls + max pooling, no Normalize, 12 tokens."""
  root = tmp_path_factory.mktemp("tiny_st")
  torch.manual_seed(0)
  config = transformers.BertConfig(vocab_size=len(VOCAB), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                   intermediate_size=37, max_position_embeddings=32)
  transformers.BertModel(config).eval().save_pretrained(root / "st")
  (root / "st" / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
  (root / "st" / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True,
                                                                  "tokenizer_class": "BertTokenizer"}))
  modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
             {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
  (root / "st" / "modules.json").write_text(json.dumps(modules))
  (root / "st" / "1_Pooling").mkdir()
  (root / "st" / "1_Pooling" / "config.json").write_text(json.dumps(
      {"word_embedding_dimension": 32, "pooling_mode_cls_token": True, "pooling_mode_max_tokens": True,
       "pooling_mode_mean_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False}))
  (root / "st" / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 12, "do_lower_case": False}))
  assert cli.main(["convert", "--from", "hf", str(root / "st"), str(root / "ours")]) == 0
  rng = np.random.default_rng(3)
  sentences = [" ".join(rng.choice(WORDS[:-2], rng.integers(1, 20))) for _ in range(10)] + ["The CAT sat", ""]
  reference = sentence_transformers.SentenceTransformer(str(root / "st"), device="cpu")
  return root, sentences, reference.encode(sentences, convert_to_numpy=True)


@pytest.fixture(scope="module")
def tiny_embedder(tiny_folder):
  """The converted tiny folder's Embedder (8 sentences a call), loaded and traced once for the tests that call it."""
  return bert_jax.Embedder.load(str(tiny_folder[0] / "ours"), batch_size=8)


def test_a_tiny_folder_embeds_as_sentence_transformers_does(tiny_folder, tiny_embedder, tmp_path):
  root, sentences, expected = tiny_folder
  with open(root / "ours" / "config.json", encoding="utf-8") as f:
    assert json.load(f)["sentence_embedding"] == {"modes": ["cls", "max"], "normalize": False, "max_seq_length": 12}
  embedder = tiny_embedder
  assert embedder.buckets == (12,) and embedder.dimension == 64
  np.testing.assert_allclose(embedder(sentences), expected, atol=1e-5)
  unpacked = bert_jax.Embedder.load(str(root / "ours"), batch_size=8, pack=False)  # one sentence per row
  assert embedder.packed_forward is not None and unpacked.packed_forward is None
  np.testing.assert_allclose(unpacked(sentences), expected, atol=1e-5)
  back = str(tmp_path / "hf")
  assert cli.main(["convert", "--to", "hf", str(root / "ours"), back]) == 0
  reloaded = sentence_transformers.SentenceTransformer(back, device="cpu")
  assert reloaded.max_seq_length == 12 and reloaded[1].pooling_mode == ("cls", "max")
  np.testing.assert_allclose(reloaded.encode(sentences, convert_to_numpy=True), expected, atol=1e-5)


def test_embed_eval_and_search_on_files(tiny_folder, tmp_path, capsys):
  root, sentences, expected = tiny_folder
  model = str(root / "ours")
  gold = np.arange(6) / 5.0
  sts = tmp_path / "sts.tsv"
  sts.write_text("sentence1\tsentence2\tscore\n" + "".join(f"{sentences[i]}\t{sentences[i + 6]}\t{gold[i]}\n"
                                                           for i in range(6)))
  assert cli.main(["embed-eval", "--model", model, "--sts", str(sts)]) == 0
  results = json.loads(capsys.readouterr().out)
  cosines = np.sum(_unit(expected[:6]) * _unit(expected[6:]), 1)
  assert results["pairs"] == 6
  assert results["spearman"] == pytest.approx(scipy_stats.spearmanr(gold, cosines)[0], abs=1e-6)
  corpus = tmp_path / "corpus.txt"
  corpus.write_text("\n".join(sentences[:10]) + "\n")
  assert cli.main(["search", "--model", model, "--corpus", str(corpus), "--query", sentences[3], "--top-k", "3"]) == 0
  found = json.loads(capsys.readouterr().out)
  scores = _unit(expected[:10]) @ _unit(expected[3])
  assert [h["line"] - 1 for h in found["hits"]] == list(np.argsort(-scores, kind="stable")[:3])
  assert found["hits"][0]["score"] == pytest.approx(1.0, abs=1e-5)
  bad = tmp_path / "bad.tsv"
  bad.write_text("a\tb\t0.5\nc\td\tnot-a-number\n")
  assert cli.main(["embed-eval", "--model", model, "--sts", str(bad)]) == 2
  assert "bad.tsv, line 2" in capsys.readouterr().err


def test_a_plain_model_embeds_with_mean_pooling_as_sentence_transformers_does(tiny_folder, tmp_path, capsys):
  root, sentences, _ = tiny_folder
  plain = tmp_path / "plain"
  plain.mkdir()
  for name in ("config.json", "model.safetensors", "vocab.txt", "tokenizer_config.json"):
    (plain / name).write_bytes((root / "st" / name).read_bytes())
  embedder = bert_jax.Embedder.load(str(plain), batch_size=8, buckets=(32,))
  assert "records no sentence pooling: mean pooling over at most 32 tokens" in capsys.readouterr().err
  reference = sentence_transformers.SentenceTransformer(str(plain), device="cpu")
  assert [type(m).__name__ for m in reference] == ["Transformer", "Pooling"] and reference[1].pooling_mode == "mean"
  np.testing.assert_allclose(embedder(sentences), reference.encode(sentences, convert_to_numpy=True), atol=1e-5)


@pytest.mark.parametrize("change,named", [
    ({"modules.json": [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                       {"idx": 1, "name": "1", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}]},
     "module sentence_transformers.models.Dense has no bert_jax counterpart"),
    ({"1_Pooling/config.json": {"word_embedding_dimension": 32, "pooling_mode_weightedmean_tokens": True}},
     "pooling mode pooling_mode_weightedmean_tokens has no bert_jax counterpart"),
    ({"sentence_bert_config.json": {"max_seq_length": 64}}, "max_seq_length 64 must be between 2 and"),
])
def test_a_folder_bert_jax_cannot_represent_is_refused_in_one_line(tiny_folder, tmp_path, capsys, change, named):
  root, _, _ = tiny_folder
  folder = tmp_path / "st"
  for source in (root / "st").rglob("*"):
    if source.is_file():
      (folder / source.relative_to(root / "st")).parent.mkdir(parents=True, exist_ok=True)
      (folder / source.relative_to(root / "st")).write_bytes(source.read_bytes())
  for name, value in change.items():
    (folder / name).write_text(json.dumps(value))
  assert cli.main(["convert", "--from", "hf", str(folder), str(tmp_path / "out")]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and named in err[0], err
  assert not (tmp_path / "out").exists()


def test_one_string_is_one_sentence(tiny_folder, tiny_embedder):
  """A plain string is one sentence (one vector, as sentence-transformers' encode("text")), not a list of
  characters; a tuple or a generator of strings is a list of sentences."""
  _, sentences, expected = tiny_folder
  embedder = tiny_embedder
  one = embedder(sentences[10])
  assert one.shape == (64,)
  np.testing.assert_allclose(one, expected[10], atol=1e-5)
  np.testing.assert_allclose(embedder(s for s in sentences[:3]), expected[:3], atol=1e-5)
  np.testing.assert_allclose(embedder(tuple(sentences[:3])), expected[:3], atol=1e-5)
  hits = evaluate.search(embedder, sentences[3], sentences[:10], 2)  # one query: its hits
  assert hits[0] == (3, pytest.approx(1.0, abs=1e-5)) and len(hits) == 2
  with pytest.raises(UserError, match="corpus: expected a list of strings, got one string"):
    evaluate.search(embedder, [sentences[3]], sentences[3], 2)


@pytest.fixture(scope="module")
def plain_model(tiny_folder, tmp_path_factory):
  """The tiny folder's model without its pooling: loading it prints a mean-pooling note."""
  root, _, _ = tiny_folder
  plain = tmp_path_factory.mktemp("plain")
  for name in ("config.json", "model.safetensors", "vocab.txt", "tokenizer_config.json"):
    (plain / name).write_bytes((root / "st" / name).read_bytes())
  return plain


def _write(path, text):
  path.write_text(text)
  return str(path)


@pytest.mark.parametrize("command,named", [
    (["search", "--corpus", "{empty}", "--query", "cat"], "--corpus {empty}: the file is empty"),
    (["search", "--corpus", "{lines}", "--queries", "{missing}"], "--queries {missing}: no such file"),
    (["search", "--corpus", "{lines}", "--query", "cat", "--top-k", "0"], "--top-k 0 must be at least 1"),
    (["embed-eval", "--sts", "{header}"], "{header}: only a header line, no examples"),
    (["embed-eval", "--sts", "{constant}"], "3 pairs, all scored 0.5: Spearman and Pearson need"),
    (["embed-eval", "--sts", "{one_pair}"], "1 pair, all scored 0.5"),
    (["embed-eval", "--sts", "{nan}"], "line 2: the score 'nan' is not a number"),
    (["embed-eval", "--sts", "{constant}", "--score-scale", "0"], "--score-scale 0.0 must be > 0"),
    (["embed-eval", "--queries", "{lines}", "--corpus", "{empty}"], "--corpus {empty}: the file is empty"),
    (["embed-eval", "--queries", "{lines}", "--corpus", "{one}"], "2 queries but 1 corpus lines"),
    (["embed-eval", "--queries", "{lines}", "--corpus", "{lines}", "--k", "0"], "--k '0': give positive"),
    (["embed", "--input", "{empty}", "--output", "{out}"], "--input {empty}: the file is empty"),
])
def test_bad_input_is_the_only_line_even_where_a_note_would_print(plain_model, tmp_path, capsys, command, named):
  """A model that records no pooling prints a note when it loads; a bad input file or flag stops the command
  before that, so the error is the only line (and names the flag the user gave)."""
  files = {"empty": _write(tmp_path / "empty.txt", ""), "lines": _write(tmp_path / "lines.txt", "a cat\nthe dog\n"),
           "one": _write(tmp_path / "one.txt", "a cat\n"), "missing": str(tmp_path / "missing.txt"),
           "header": _write(tmp_path / "header.tsv", "sentence1\tsentence2\tscore\n"),
           "constant": _write(tmp_path / "constant.tsv", "a\tb\t0.5\nc\td\t0.5\ne\tf\t0.5\n"),
           "one_pair": _write(tmp_path / "one_pair.tsv", "a\tb\t0.5\n"),
           "nan": _write(tmp_path / "nan.tsv", "a\tb\t0.5\nc\td\tnan\n"), "out": str(tmp_path / "out.npy")}
  capsys.readouterr()
  assert cli.main([*(c.format(**files) for c in command), "--model", str(plain_model)]) == 2
  out, err = capsys.readouterr()
  assert not out and len(err.splitlines()) == 1 and named.format(**files) in err, err
  assert not (tmp_path / "out.npy").exists()


def test_a_plain_model_notes_its_pooling_when_the_command_proceeds(plain_model, tmp_path, capsys):
  corpus = _write(tmp_path / "corpus.txt", "a cat\nthe dog\n")
  assert cli.main(["search", "--model", str(plain_model), "--corpus", corpus, "--query", "cat"]) == 0
  out, err = capsys.readouterr()
  assert "records no sentence pooling" in err and json.loads(out)["query"] == "cat"


def test_embeddings_onto_a_full_disk_are_one_line_and_no_file(tiny_folder, plain_model, tmpfs, tmp_path, capsys):
  """An 8 KB disk with one page free: the command stops before the work (the file would not fit; the plain
  model's pooling note stays unprinted); a write that runs out of space anyway (the space checked, then
  taken) is one line too; no file is left either way. Before: np.save's "5248 requested and 4096 written",
  a message without errno."""
  _, sentences, _ = tiny_folder
  disk = tmpfs("size=8k")
  (disk / "filler").write_bytes(b"x" * 4096)
  text = _write(tmp_path / "in.txt", "\n".join(sentences[:10] * 4) + "\n")  # 40 x 32 float32: 5 KB
  output = disk / "out.npy"
  capsys.readouterr()
  assert cli.main(["embed", "--model", str(plain_model), "--input", text, "--output", str(output)]) == 2
  err = capsys.readouterr().err.splitlines()
  assert len(err) == 1, err
  assert f"--output {output}: no space left on {disk} for the embeddings (40 x 32 float32" in err[0]
  with pytest.raises(UserError) as info:  # the write itself: the space checked, then taken
    embed_lib.write_npy(str(output), np.zeros((40, 64), np.float32))
  assert str(info.value).startswith(f"--output {output}: no space left on {disk} while writing embeddings")
  assert sorted(p.name for p in disk.iterdir()) == ["filler"]
