"""XLNet's pretraining layout (data.example_builder="xlnet_stream"): the released data_utils.py's
_create_data / create_tfrecords, read on the fly.

The split's documents (the same reader, order and held-out share as every builder's; [SEP] between
documents, the released code's <eod>) make one token stream, cut into `S` parallel streams (S = the
global batch, or half of it with `xlnet.bi_data`, whose second half of rows are the same streams
reversed: row S + i reads stream i backwards). Step s's row i is, at offset o = (s mod E) x reuse_len
of its stream (E: the steps an epoch holds):

  tokens [o, o + reuse_len) | A [SEP] B [SEP] [CLS]          segment ids 0 ... 0 | 0 ... 0 0 1 ... 1 1 2

A starts at o + reuse_len and ends at a sentence boundary; B is the text after A (label 1) or, half the
time or when A has no boundary to end at, a random piece of the same stream (label 0), both cut to
seq - reuse_len - 3 tokens together (`split_a_and_b`, the released _split_a_and_b). So row i of step
s + 1 starts reuse_len tokens after row i of step s: the memory of step s's first reuse_len tokens
(training/objectives/xlnet.py) is the text just before it. The draws come from a generator seeded by
(data.seed, split, step, row): a batch depends on the config and the step only, so the saved position
is the step. Features: input_ids, input_mask (all 1), segment_ids, `predictable` (0 at [SEP] and
[CLS], the tokens never predicted), next_sentence_labels (the label above), `backward_rows` (the model reads
those rows' distances negated, wherever the rows land: a device's share, a micro-batch).

The whole split is tokenized into memory at the start (as the released code held each input file);
knowledge masking's tags and data.format=bert_tfrecord are not read here.
"""
from __future__ import annotations

import numpy as np

from bert_jax.data_pipelines import shards
from bert_jax.data_pipelines.errors import DataError

FEATURES = {
    "input_ids": ("int32", ("B", "T"), "reuse_len tokens, A [SEP] B [SEP] [CLS] (no padding)"),
    "input_mask": ("int32", ("B", "T"), "1 (every token is real)"),
    "segment_ids": ("int32", ("B", "T"), "0 on the reused tokens, A and its [SEP]; 1 on B and its [SEP]; 2 on [CLS]"),
    "predictable": ("int32", ("B", "T"), "1 where a token may be a target; 0 at [SEP] and [CLS]"),
    "next_sentence_labels": ("int32", ("B",), "1: B follows A; 0: B is a random piece of the stream"),
    "backward_rows": ("int32", ("B",), "1 on a reversed stream's row (xlnet.bi_data: the second half), else 0"),
}


def split_a_and_b(data: np.ndarray, sent_ids: np.ndarray, begin: int, total: int, rng: np.random.Generator):
  """(A, B, label) of `total` tokens from `data` at `begin`, as the released _split_a_and_b (extend_target), or
  None when the stream ends first. sent_ids flips at each sentence boundary."""
  data_len = len(data)
  if begin + total >= data_len:
    return None
  end = begin + 1
  cuts = []
  while end < data_len:
    if sent_ids[end] != sent_ids[end - 1]:
      if end - begin >= total:
        break
      cuts.append(end)
    end += 1
  if not cuts or rng.random() < 0.5:
    label = 0
    a_end = end if not cuts else int(rng.choice(cuts))
    b_len = max(1, total - (a_end - begin))
    b_begin = int(rng.integers(0, data_len - 1 - b_len + 1))
    b_end = b_begin + b_len
    while b_begin > 0 and sent_ids[b_begin - 1] == sent_ids[b_begin]:
      b_begin -= 1
    while b_end < data_len - 1 and sent_ids[b_end - 1] == sent_ids[b_end]:
      b_end += 1
  else:
    label = 1
    a_end = int(rng.choice(cuts))
    b_begin, b_end = a_end, end
  while a_end - begin + b_end - b_begin > total:
    if a_end - begin > b_end - b_begin:
      a_end -= 1
    else:
      b_end -= 1
  return data[begin:a_end], data[b_begin:b_end], label


def layout(tokens: np.ndarray, sent_ids: np.ndarray, num_rows: int, bi_data: bool):
  """(streams [num_rows, N], their sent_ids): `tokens` cut into num_rows (num_rows / 2 with bi_data, then
  followed by the same reversed) consecutive streams, the tail that does not divide dropped."""
  forward = num_rows // 2 if bi_data else num_rows
  n = len(tokens) // forward
  data = tokens[:forward * n].reshape(forward, n)
  sent = sent_ids[:forward * n].reshape(forward, n)
  if bi_data:
    data, sent = np.concatenate([data, data[:, ::-1]]), np.concatenate([sent, sent[:, ::-1]])
  return data, sent


def build_row(data, sent_ids, offset: int, seq_len: int, reuse_len: int, sep_id: int, cls_id: int,
              rng: np.random.Generator) -> dict:
  """One row's features at `offset` of its stream (FEATURES, without the batch axis)."""
  pieces = split_a_and_b(data, sent_ids, offset + reuse_len, seq_len - reuse_len - 3, rng)
  if pieces is None:
    raise DataError(f"xlnet_stream: offset {offset} leaves too little of a {len(data)}-token stream")
  a, b, label = pieces
  ids = np.concatenate([data[offset:offset + reuse_len], a, [sep_id], b, [sep_id, cls_id]]).astype(np.int32)
  segments = np.array([0] * (reuse_len + len(a) + 1) + [1] * (len(b) + 1) + [2], np.int32)
  if len(ids) != seq_len:
    raise AssertionError(f"an xlnet_stream row of {len(ids)} tokens, not {seq_len}")
  return {"input_ids": ids, "input_mask": np.ones(seq_len, np.int32), "segment_ids": segments,
          "predictable": ((ids != sep_id) & (ids != cls_id)).astype(np.int32),
          "next_sentence_labels": np.int32(label)}


def read_stream(data_cfg, split: str, max_position_embeddings, model_vocab_size):
  """(tokenizer, tokens, sent_ids) of the split: its documents in the pipeline's order, [SEP] after each, each
  sentence (and each [SEP]) flipping sent_ids."""
  one = data_cfg.copy_and_resolve_references()
  with one.unlocked():
    one.example_builder, one.num_shards, one.packing = "full_sentences", 1, False
  ctx = shards.make_context(one, split, max_position_embeddings, model_vocab_size)
  if ctx.encoder is not None:
    raise DataError("data.example_builder='xlnet_stream' reads plain text: use data.masking other than "
                    "'knowledge'")
  sep = ctx.tokenizer.special_ids["[SEP]"]
  stream = shards.ShardStream(ctx, 0)
  cursor, tokens, flags, flag = [0, 0, 0, 0], [], [], False
  while cursor[0] == 0:
    docs, cursor = stream.read_block(cursor)
    for doc in docs:
      for sentence in [*(s if ctx.tokenized else ctx.tokenizer.encode(s) for s in doc), [sep]]:
        if sentence:
          tokens.append(np.asarray(sentence, np.int32))
          flags.append(np.full(len(sentence), flag))
          flag = not flag
  if not tokens:
    raise DataError(f"data.example_builder='xlnet_stream': the {split} split has no text (stats: {dict(ctx.stats)})")
  return ctx.tokenizer, np.concatenate(tokens), np.concatenate(flags)


class StreamInput:
  """Iterable of this host's rows of each global batch in XLNet's stream layout; `save`/`restore` its step."""

  def __init__(self, data_cfg, split: str, batch_size: int, reuse_len: int, bi_data: bool, process_index: int = 0,
               process_count: int = 1, max_position_embeddings=None, model_vocab_size=None):
    seq = data_cfg.max_seq_length
    if not 0 < reuse_len <= seq - 5:
      raise DataError(f"data.example_builder='xlnet_stream' advances each stream by xlnet.reuse_len={reuse_len} "
                      f"tokens a step: it must be between 1 and data.max_seq_length - 5 = {seq - 5}")
    if batch_size % process_count or (bi_data and batch_size % 2):
      raise DataError(f"xlnet_stream: the batch of {batch_size} rows must split over {process_count} processes "
                      "(and in two halves with xlnet.bi_data)")
    self.tokenizer, tokens, sent_ids = read_stream(data_cfg, split, max_position_embeddings, model_vocab_size)
    self._data, self._sent = layout(tokens, sent_ids, batch_size, bi_data)
    # offsets o with o + seq - 3 < stream length leave text for A and B (split_a_and_b); then the streams
    # start again (the memory then holds the stream's end)
    self._steps_per_epoch = (self._data.shape[1] - seq + 2) // reuse_len + 1 if self._data.shape[1] > seq else 0
    if self._steps_per_epoch < 1:
      raise DataError(f"xlnet_stream: {len(tokens)} tokens of the {split} split make {batch_size} streams shorter "
                      f"than data.max_seq_length={seq}; give more text or a smaller batch")
    special = self.tokenizer.special_ids
    self._sep, self._cls = special["[SEP]"], special["[CLS]"]
    self._seq, self._reuse = seq, reuse_len
    self._seeds = shards.seeds(data_cfg, split)
    per_host = batch_size // process_count
    self._rows = range(process_index * per_host, (process_index + 1) * per_host)
    self._process_index, self._batch_size, self._bi_data = process_index, batch_size, bi_data
    self.step = 0
    self.stats = {}
    self.spec = FEATURES

  def batch(self, step: int) -> dict:
    """This host's rows of the global batch of `step` (0-based)."""
    offset = (step % self._steps_per_epoch) * self._reuse
    rows = []
    for r in self._rows:
      rng = np.random.default_rng([*self._seeds, step, r])
      rows.append(build_row(self._data[r], self._sent[r], offset, self._seq, self._reuse, self._sep, self._cls,
                            rng))
    out = {k: np.stack([row[k] for row in rows]) for k in FEATURES if k != "backward_rows"}
    out["backward_rows"] = np.array([int(self._bi_data and r >= self._batch_size // 2) for r in self._rows], np.int32)
    return out

  def __iter__(self):
    return self

  def __next__(self) -> dict:
    out = self.batch(self.step)
    self.step += 1
    return out

  def save(self, directory: str) -> None:
    shards.write_state(directory, self._process_index,
                       {"builder": "xlnet_stream", "batch_size": self._batch_size, "step": self.step})

  def restore(self, directory: str) -> None:
    steps = set()
    for path, state in shards.read_states(directory):
      if state.get("builder") != "xlnet_stream" or state["batch_size"] != self._batch_size:
        raise DataError(f"{path}: not an xlnet_stream position of a batch of {self._batch_size} rows; keep "
                        "data.example_builder and the batch size to resume")
      steps.add(state["step"])
    if len(steps) != 1:
      raise DataError(f"{directory}: no single saved xlnet_stream position (found steps {sorted(steps)})")
    self.step = steps.pop()

  def close(self) -> None:
    """Nothing runs in the background."""


def for_config(config, split: str, batch_size: int, process_index: int = 0, process_count: int = 1) -> StreamInput:
  block = config.get("xlnet") or {}
  if config.data.format != "text":
    raise DataError("data.example_builder='xlnet_stream' reads text (data.corpus, prepared or tfds_name), not "
                    f"data.format={config.data.format!r}")
  return StreamInput(config.data, split, batch_size, block.get("reuse_len", 0), bool(block.get("bi_data", False)),
                     process_index, process_count, config.model.max_position_embeddings, config.model.vocab_size)

