"""Sentences in, embeddings out: `Embedder.load(model)(sentences) -> float32[N, D]`, and `bert-jax embed`.

Each sentence becomes [CLS] tokens [SEP], cut at the model's max_seq_length, as sentence-transformers
tokenizes it. Padding costs compute on every layer, so, like sentence-transformers, the rows run sorted
by length, longest first, in batches of batch_size; unlike it (it pads each batch to its longest row,
one shape per batch), a batch is padded to the smallest of a few length *buckets* that holds its
longest row (powers of two from 16 up to max_seq_length), and the last batch is filled up with copies
of a row, so the jitted forward has one shape per bucket and compiles at most once for each. The embeddings are put
back in the input's order.

The forward is jitted over a data-parallel mesh of the local devices (the batch is rounded up to a
multiple of their count); the embedder holds its parameters so one `load` serves many calls, while the
model stays a pure function (`SentenceEncoder.apply`).
"""
from __future__ import annotations

import bisect
import dataclasses
import os
import sys
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import tqdm
from etils import epath

from bert_jax import pretrained, workdir
from bert_jax.configs import common as config_common
from bert_jax.errors import UserError
from bert_jax.models import families
from bert_jax.models.pooling import Pooling
from bert_jax.sbert import model as model_lib
from bert_jax.training import partitioning

SMALLEST_BUCKET = 16


def buckets_for(max_seq_length: int) -> tuple[int, ...]:
  """16, 32, 64, ... below max_seq_length, then max_seq_length itself."""
  sizes, size = [], SMALLEST_BUCKET
  while size < max_seq_length:
    sizes.append(size)
    size *= 2
  return (*sizes, max_seq_length)


def token_ids(tokenizer, sentence: str, max_seq_length: int) -> list[int]:
  """[CLS] the sentence's tokens [SEP], at most max_seq_length ids (sentence-transformers' truncation)."""
  special = tokenizer.special_ids
  return [special["[CLS]"], *tokenizer.encode(sentence)[:max_seq_length - 2], special["[SEP]"]]


def _mesh():
  return partitioning.make_mesh(ml_collections.ConfigDict({"data": -1, "fsdp": 1, "tensor": 1}),
                                jax.local_devices())


@dataclasses.dataclass(frozen=True)
class Embedder:
  """An embedding handle on a sentence embedding model: `embedder(sentences) -> float32[N, D]`."""
  pooling: Pooling
  dimension: int
  tokenizer: Any
  params: Any
  forward: Callable  # jitted (params, input_ids, attention_mask) -> [B, D]
  mesh: Any
  batch_size: int
  buckets: tuple[int, ...]

  @classmethod
  def load(cls, path: str, batch_size: int = 32, buckets: Sequence[int] | None = None) -> "Embedder":
    """From any checkpoint (a bi-encoder workdir, a converted sentence-transformers folder, a HF or
    bert_jax model: mean pooling where none is recorded); buckets: the padded lengths (default
    `buckets_for(max_seq_length)`)."""
    if batch_size <= 0:
      raise UserError(f"batch size {batch_size} must be positive")
    model, params, tokenizer, notes = model_lib.from_checkpoint(path)
    for note in notes:
      print(note, file=sys.stderr, flush=True)
    if tokenizer is None:
      raise UserError(f"{path}: no tokenizer files (vocab.txt, *.model, or vocab.json + merges.txt) found")
    length = model.pooling.max_seq_length
    buckets = tuple(sorted(set(buckets or buckets_for(length))))
    if buckets[0] < 2 or buckets[-1] != length:
      raise UserError(f"length buckets {list(buckets)} must be >= 2 and end at the model's max_seq_length {length}")
    # Inference only. The layers stay a scanned loop: unrolling them doubles each bucket's compile on
    # CPU and measured no faster (BENCHMARKS.md, "Sentence embeddings").
    model = model.clone(config=families.of(model.config).with_dropout(model.config, 0.0, 0.0))
    mesh, rules = _mesh(), config_common.LOGICAL_AXIS_RULES
    dummy = jnp.zeros((1, 2), jnp.int32)
    abstract = jax.eval_shape(lambda: model.init(jax.random.key(0), dummy, dummy + 1)["params"])
    shardings = partitioning.logical_shardings(abstract, mesh, rules)
    data = partitioning.batch_sharding(mesh)
    forward = lambda p, ids, mask: model.apply({"params": p}, ids, mask)  # noqa: E731
    devices = partitioning.data_parallel_size(mesh)
    return cls(pooling=model.pooling, dimension=model.pooling.dimension(model.config.hidden_size),
               tokenizer=pretrained.build_tokenizer(tokenizer),
               params=jax.device_put(nn.meta.unbox(params), shardings),
               forward=jax.jit(partitioning.in_mesh(forward, mesh, rules), in_shardings=(shardings, data, data),
                               out_shardings=data),
               mesh=mesh, batch_size=-(-batch_size // devices) * devices, buckets=buckets)

  def tokenize(self, sentence: str) -> list[int]:
    """[CLS] the sentence's tokens [SEP], at most max_seq_length ids."""
    return token_ids(self.tokenizer, sentence, self.pooling.max_seq_length)

  def __call__(self, sentences: Sequence[str], *, progress: bool = False) -> np.ndarray:
    """float32[len(sentences), dimension], in the order given (a tqdm bar on stderr when `progress`
    and the job takes more than a couple of seconds)."""
    for i, sentence in enumerate(sentences):
      if not isinstance(sentence, str):
        raise UserError(f"sentence {i + 1}: expected a string, got {sentence!r:.80}")
    rows = [self.tokenize(s) for s in sentences]
    out = np.zeros((len(rows), self.dimension), np.float32)
    pending = []
    with tqdm.tqdm(total=len(rows), disable=not progress, delay=2.0, file=sys.stderr, unit="sentence",
                   desc="embed") as bar:
      for length, chosen in self.batches([len(r) for r in rows]):
        pending.append((chosen, self._run([rows[i] for i in chosen], length)))  # dispatched, not waited for
        if len(pending) > 2:
          self._collect(pending.pop(0), out, bar)
      for item in pending:
        self._collect(item, out, bar)
    return out

  def batches(self, lengths: Sequence[int]) -> list[tuple[int, list[int]]]:
    """(bucket, row indices) per model call: the rows sorted by length, longest first, in batches of
    batch_size, each padded to the smallest bucket that holds its longest row."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    starts = range(0, len(order), self.batch_size)
    return [(self.buckets[bisect.bisect_left(self.buckets, lengths[order[s]])], order[s:s + self.batch_size])
            for s in starts]

  def _run(self, rows: list[list[int]], length: int) -> jax.Array:
    """The embeddings of up to batch_size rows, padded to `length` (free rows repeat the first)."""
    ids = np.full((self.batch_size, length), self.tokenizer.special_ids["[PAD]"], np.int32)
    mask = np.zeros((self.batch_size, length), np.int32)
    for r in range(self.batch_size):
      row = rows[r] if r < len(rows) else rows[0]
      ids[r, :len(row)], mask[r, :len(row)] = row, 1
    return self.forward(self.params, *(partitioning.global_batch({"x": a}, self.mesh)["x"] for a in (ids, mask)))

  @staticmethod
  def _collect(item: tuple[list[int], jax.Array], out: np.ndarray, bar) -> None:
    chosen, embeddings = item
    out[chosen] = np.asarray(jax.device_get(embeddings))[:len(chosen)]
    bar.update(len(chosen))


def read_lines(path: str) -> list[str]:
  """One sentence per line (UTF-8; a final newline ends the last line, it does not add an empty one)."""
  file = epath.Path(path)
  if not file.is_file():
    raise UserError(f"--input {path}: no such file")
  try:
    text = file.read_text(encoding="utf-8")
  except UnicodeDecodeError as e:
    raise UserError(f"--input {path}: not UTF-8 text ({e})") from None
  lines = [line.removesuffix("\r") for line in text.split("\n")]
  lines = lines[:-1] if lines and not lines[-1] else lines
  if not lines:
    raise UserError(f"--input {path}: the file is empty; give one sentence per line")
  return lines


def check_output(path: str) -> None:
  """UserError before any work when --output cannot take a .npy file (wrong suffix, no such folder, read-only)."""
  target = workdir.path(path)
  if target.suffix != ".npy":
    raise UserError(f"--output {path}: name it *.npy (numpy's format, np.load reads it)")
  if workdir.is_url(target):
    return
  folder = target.parent
  if not folder.is_dir():
    raise UserError(f"--output {path}: the folder {folder} does not exist; create it first")
  if not os.access(folder, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
    raise UserError(f"--output {path}: not writable; choose a path you may write to")


def write_npy(path: str, array: np.ndarray) -> None:
  """`array` as a .npy file, written whole or not at all (workdir.atomic_open)."""
  check_output(path)
  with workdir.atomic_open(workdir.path(path), "wb") as f:
    np.save(f, array)
