"""T5's streamed span-corruption input (data_pipelines/span_stream.py) against span_corruption.py's NumPy definition:
the same examples from the same key, every chunk once per epoch with fresh masks, exact resume, host-count
independence and a reader that never holds the corpus."""
from __future__ import annotations

import os

import numpy as np
import pytest

from bert_jax.config_utils import load_config
from bert_jax.data_pipelines import span_corruption as sc

SEQ = 32


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  """(corpus file, SentencePiece model): 60 documents of 3 sentences of 8 words."""
  from bert_jax.data_pipelines import t5_spm  # pylint: disable=import-outside-toplevel
  tmp = tmp_path_factory.mktemp("span_stream")
  rng = np.random.default_rng(0)
  words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa"]
  docs = ["\n".join(" ".join(rng.choice(words, 8)) + "." for _ in range(3)) for _ in range(60)]
  (tmp / "corpus.txt").write_text("\n\n".join(docs) + "\n")
  vocab = t5_spm.train([line for d in docs for line in d.splitlines()], 40, str(tmp / "spm"))
  return str(tmp / "corpus.txt"), vocab


def _config(files, **data):
  path, vocab = files
  config = load_config("configs/t5.py:tiny", [])
  config.data.update(corpus=path, vocab=vocab, max_seq_length=SEQ, num_shards=1, eval_fraction=0.0)
  config.data.update(**data)
  config.model.vocab_size = 256
  return config


def _stream(config, batch=4, process_index=0, process_count=1):
  from bert_jax.data_pipelines import pipeline  # pylint: disable=import-outside-toplevel
  return pipeline.for_config(config, "train", batch, process_index, process_count)


def _examples(batches):
  """(inputs, targets) of every packed example, in stream order (one shard: batch, row, segment)."""
  out = []
  for batch in batches:
    for r in range(len(batch["encoder_input_tokens"])):
      enc, dec = batch["encoder_segment_ids"][r], batch["decoder_segment_ids"][r]
      for s in range(1, enc.max() + 1):
        out.append((batch["encoder_input_tokens"][r][enc == s], batch["decoder_target_tokens"][r][dec == s]))
  return out


def _uncorrupt(inputs, targets, top):
  """The chunk a (inputs, targets) pair came from: each sentinel of the inputs replaced by its span."""
  spans, current = {}, None
  for t in targets[:-1]:
    if t > top - 100:
      current = spans.setdefault(int(t), [])
    else:
      current.append(int(t))
  return [x for t in inputs[:-1] for x in (spans[int(t)] if t > top - 100 else [int(t)])]


def test_examples_are_the_definitions_draw_every_chunk_once_per_epoch(corpus):
  config = _config(corpus)
  data = _stream(config)
  tokenizer = data.tokenizer
  top, eos = tokenizer.sentinel(0), tokenizer.eos_id
  tokens_length, targets_length = sc.random_spans_helper(SEQ, 0.15, 3.0)
  assert (data.corruption.inputs_length, data.corruption.targets_length) == (SEQ, targets_length)
  # The chunks, independently: the corpus's documents (one block: data.shuffle_buffer=1000) end to end, cut.
  with open(corpus[0], encoding="utf-8") as f:
    lines = [line.strip() for line in f]
  tokens = [t for line in lines if line for t in tokenizer.encode(line)]
  chunks = [tuple(tokens[i:i + tokens_length]) for i in range(0, len(tokens), tokens_length)]
  n = len(chunks)
  batches = [next(data) for _ in range(-(-2 * n // 4) + 2)]
  data.close()
  examples = _examples(batches)[:2 * n]
  seen = [tuple(_uncorrupt(i, t, top)) for i, t in examples]
  assert sorted(seen[:n]) == sorted(chunks) and sorted(seen[n:]) == sorted(chunks)  # each chunk once an epoch
  assert seen[:n] != seen[n:]  # shuffled afresh
  first_mask = {}
  for k, ((inputs, targets), chunk) in enumerate(zip(examples, seen)):
    epoch, index = divmod(k, n)
    rng = np.random.default_rng([config.data.seed, 0, 0, (epoch << 40) | index])  # (seed, train, shard, counter)
    mask = sc.random_spans_noise_mask(len(chunk), 0.15, 3.0, rng)
    want_in, want_tgt = sc.corrupt(np.asarray(chunk), mask, top, eos)
    np.testing.assert_array_equal(inputs, want_in)
    np.testing.assert_array_equal(targets, want_tgt)
    if len(chunk) == tokens_length:  # full chunks: T5's counts exactly, sentinels counting down from the top
      noise = round(tokens_length * 0.15)
      assert mask.sum() == noise and len(targets) == targets_length
      sentinels = [t for t in targets if t > top - 100]
      assert sentinels == list(range(top, top - round(noise / 3), -1))
    first_mask.setdefault(chunk, []).append(mask.tobytes())
  assert sum(len(set(m)) == 2 for m in first_mask.values()) >= n - 1  # re-drawn in epoch 1


def test_rows_pack_with_segment_ids(corpus, tmp_path):
  # Documents of 3 words, each shorter than a chunk: rows hold several examples.
  (tmp_path / "short.txt").write_text("\n\n".join(f"alpha {w} gamma." for w in ("beta", "eta", "zeta") * 10) + "\n")
  batch = next(_stream(_config(corpus, corpus=str(tmp_path / "short.txt"), shuffle_buffer=1), batch=4))
  enc, dec = batch["encoder_segment_ids"], batch["decoder_segment_ids"]
  assert enc.max(axis=1).min() >= 2  # every row holds two examples or more
  for r in range(len(enc)):
    for s in range(1, enc[r].max() + 1):
      ends = batch["encoder_input_tokens"][r][enc[r] == s][-1], batch["decoder_target_tokens"][r][dec[r] == s][-1]
      assert ends == (1, 1)  # each example ends with </s> in the inputs and the targets
      targets = batch["decoder_target_tokens"][r][dec[r] == s]
      np.testing.assert_array_equal(batch["decoder_input_tokens"][r][dec[r] == s], np.r_[0, targets[:-1]])
    np.testing.assert_array_equal(batch["decoder_loss_weights"][r], dec[r] > 0)


def test_resume_gives_the_batches_of_an_uninterrupted_run(corpus, tmp_path):
  config = _config(corpus, num_shards=2, shuffle_buffer=5)
  whole = _stream(config)
  want = [next(whole) for _ in range(7)]
  whole.close()
  # Stopped after step 3: the position saved with the train state, as the trainer's checkpoint saves it.
  from bert_jax.training import checkpoint  # pylint: disable=import-outside-toplevel
  state = {"w": np.zeros(2, np.float32)}
  ckpt = checkpoint.Checkpointer(tmp_path / "checkpoints", keep=1, async_save=False)
  first = _stream(config)
  for _ in range(3):
    next(first)
  ckpt.save(3, state, force=True, data=first)
  first.close()
  again = _stream(config)
  assert ckpt.restore_latest(state, data=again)[1] == 3
  for k in range(3, 7):
    got = next(again)
    for name in sc.FEATURES:
      np.testing.assert_array_equal(got[name], want[k][name], err_msg=f"batch {k} {name}")
  again.close()
  # Two hosts build the same global batch: host h the rows of its shard.
  halves = [_stream(config, 4, h, 2) for h in range(2)]
  for k in range(2):
    parts = [next(h) for h in halves]
    for name in sc.FEATURES:
      np.testing.assert_array_equal(np.concatenate([p[name] for p in parts]), want[k][name])
  for h in halves:
    h.close()


def test_workers_give_the_in_process_batches_and_resume_exactly(corpus, tmp_path):
  # One pool of workers (each spawn starts TensorFlow, seconds): it resumes from an in-process position, gives the
  # in-process batches, and its own saved position resumes the in-process input exactly.
  import multiprocessing  # pylint: disable=import-outside-toplevel
  config = _config(corpus, num_shards=4, shuffle_buffer=5)
  reference = _stream(config, batch=8)
  want = [next(reference) for _ in range(8)]
  reference.close()
  first = _stream(config, batch=8)
  for _ in range(2):
    next(first)
  first.save(str(tmp_path / "at2"))
  first.close()
  config.data.num_workers = 2  # shard groups [0, 1] and [2, 3], each worker's rows through the shared-memory slots
  pool = _stream(config, batch=8)
  pool.restore(str(tmp_path / "at2"))
  try:
    for k in range(2, 6):
      got = next(pool)
      for name in sc.FEATURES:
        assert got[name].dtype == want[k][name].dtype
        np.testing.assert_array_equal(got[name], want[k][name], err_msg=f"batch {k} {name}")
    children = multiprocessing.active_children()
    assert len(children) == 2
    pool.save(str(tmp_path / "at6"))
  finally:
    pool.close()
  assert not any(c.is_alive() for c in children)
  config.data.num_workers = 0
  last = _stream(config, batch=8)
  last.restore(str(tmp_path / "at6"))
  for k in range(6, 8):
    got = next(last)
    for name in sc.FEATURES:
      np.testing.assert_array_equal(got[name], want[k][name], err_msg=f"batch {k} {name}")
  last.close()


def test_throughput_counts_the_encoder_inputs_real_tokens(corpus):
  from bert_jax.data_pipelines import throughput  # pylint: disable=import-outside-toplevel
  config = _config(corpus, num_shards=2, shuffle_buffer=5)
  config.train.batch_size = 4
  data = _stream(config)
  batch = [next(data) for _ in range(4)][-1]  # after throughput's 3 warm-up batches
  data.close()
  result = throughput.measure(config, 1)
  assert result["mean_real_tokens_per_row"] == (batch["encoder_input_tokens"] > 0).sum() / 4


def test_reads_the_corpus_a_block_at_a_time(corpus, tmp_path):
  data = _stream(_config(corpus, shuffle_buffer=3))
  next(data)
  data.save(str(tmp_path))
  data.close()
  from bert_jax.data_pipelines import shards  # pylint: disable=import-outside-toplevel
  (_, state), = shards.read_states(str(tmp_path))
  epoch, unit, offset, _ = state["shards"]["0"]["cursor"]
  # The first batch came from the file's first few blocks: the position is a byte offset inside epoch 0's pass.
  assert (epoch, unit) == (0, 0) and 0 < offset < os.path.getsize(corpus[0]) / 2


def test_lengths_follow_t5_and_bad_settings_are_one_line(corpus):
  from bert_jax.data_pipelines.errors import DataError  # pylint: disable=import-outside-toplevel
  data = _stream(_config(corpus, max_seq_length=512))
  assert data._ctx.builder.max_seq_length == 568  # pylint: disable=protected-access
  assert (data.corruption.inputs_length, data.corruption.targets_length) == (512, 114)
  with pytest.raises(DataError, match="data.num_workers=-2"):
    _stream(_config(corpus, num_workers=-2))
  with pytest.raises(DataError, match="not a multiple of data.num_shards"):
    _stream(_config(corpus, num_shards=3))
