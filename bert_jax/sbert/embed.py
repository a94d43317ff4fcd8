"""Sentences in, embeddings out: `Embedder.load(model)(sentences) -> float32[N, D]`, and `bert-jax embed`.

Each sentence becomes [CLS] tokens [SEP], cut at the model's max_seq_length, as sentence-transformers
tokenizes it. Padding costs compute on every layer, so the rows are filled with as little of it as the
compiled shapes allow, in one of two ways:

- Packed (the default where the encoder takes document_ids and position_ids: BertModel's families and
  ModernBERT): several sentences share a row, laid end to end, each with its own document id (attention
  stays within a sentence, as the packed pretraining rows do) and positions from 0, and pooling reads each
  sentence's tokens (`SentenceEncoder.packed`). The rows are `widths` wide (128, and max_seq_length for the
  longer sentences: `pack_widths_for`), filled best-fit, longest sentence first (`pack_rows`); a model call
  takes about `tokens_per_call` tokens of rows, so short sentences run many to a call. One shape per width
  compiles; padding is what best fit leaves and the last call's free rows.
- One sentence per row (pack=False, or a family that cannot pack): like sentence-transformers, the rows
  run sorted by length, longest first, in batches of batch_size; unlike it (it pads each batch to its
  longest row, one shape per batch), a batch is padded to the smallest of a few length *buckets* that
  holds its longest row (powers of two from 16 up to max_seq_length).

Either way the last call is filled up with copies of a row, so the jitted forward has one shape per bucket
and compiles at most once for each. The embeddings are put back in the input's order. On CPU two calls run
at once, each from a thread of its own (`concurrent_calls`).

The forward is jitted over a data-parallel mesh of the local devices (the batch is rounded up to a
multiple of their count); the embedder holds its parameters so one `load` serves many calls, while the
model stays a pure function (`SentenceEncoder.apply`).
"""
from __future__ import annotations

import bisect
import concurrent.futures
import dataclasses
import errno
import functools
import os
import shutil
import sys
import tempfile
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
PACK_WIDTH = 128  # packed rows' width for sentences up to this long
# Packed rows per model call, in tokens: on CPU 512 ran faster than 1024-4096 (BENCHMARKS.md, "Sentence
# embeddings"); accelerators keep about what 32 sentences a call padded to a bucket gave (not measured).
TOKENS_PER_CALL = {"cpu": 512}
ACCELERATOR_TOKENS_PER_CALL = 4096
# Model calls run at once, each from a thread of its own: on CPU two overlap (one call's single-threaded
# elementwise fusions run beside the other's matmuls; BENCHMARKS.md, "Sentence embeddings", run 11);
# elsewhere one, its successors dispatched while it runs.
CONCURRENT_CALLS = {"cpu": 2}


def buckets_for(max_seq_length: int) -> tuple[int, ...]:
  """16, 32, 64, ... below max_seq_length, then max_seq_length itself."""
  sizes, size = [], SMALLEST_BUCKET
  while size < max_seq_length:
    sizes.append(size)
    size *= 2
  return (*sizes, max_seq_length)


def pack_widths_for(max_seq_length: int) -> tuple[int, ...]:
  """The packed rows' widths: PACK_WIDTH, and max_seq_length for the sentences longer than that."""
  return tuple(sorted({min(PACK_WIDTH, max_seq_length), max_seq_length}))


def slots_for(width: int) -> int:
  """The most sentences one packed row of `width` tokens holds (each has [CLS] and [SEP] at least)."""
  return max(1, width // 4)


def pack_rows(lengths: Sequence[int], widths: Sequence[int]) -> dict[int, list[list[int]]]:
  """{width: rows}, each row a list of sentence indices whose lengths sum to at most width (and at most
  slots_for(width) of them). Longest sentence first, each goes to the open row of any width that it fills
  best (best fit decreasing: a short sentence fills the gap a long one left in a wide row), else opens a
  row of the narrowest width that holds it."""
  widths = sorted(widths)
  rows: dict[int, list[list[int]]] = {w: [] for w in widths}
  room: list[list[tuple[int, int]]] = [[] for _ in range(widths[-1] + 1)]  # free tokens -> open (width, row)
  for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
    length = lengths[i]
    free = next((f for f in range(length, len(room)) if room[f]), None)
    if free is None:
      width = widths[bisect.bisect_left(widths, length)]
      row, free = len(rows[width]), width
      rows[width].append([])
    else:
      width, row = room[free].pop()
    rows[width][row].append(i)
    if len(rows[width][row]) < slots_for(width) and free - length >= 2:
      room[free - length].append((width, row))
  return {w: r for w, r in rows.items() if r}


def can_pack(model: model_lib.SentenceEncoder) -> bool:
  """Does the encoder take several sentences per row (its family record's `packs`)?"""
  return families.of(model_lib.encoder_config(model.config)).packs


def packed_arrays(rows: Sequence[Sequence[Sequence[int]]], width: int, pad_id: int
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """input_ids, document_ids (1, 2, ... per sentence, 0 on padding), position_ids (from 0 in each
  sentence) int32[len(rows), width] of rows of sentences' token ids laid end to end."""
  ids = np.full((len(rows), width), pad_id, np.int32)
  docs, pos = np.zeros((len(rows), width), np.int32), np.zeros((len(rows), width), np.int32)
  for r, row in enumerate(rows):
    start = 0
    for d, sentence in enumerate(row):
      end = start + len(sentence)
      ids[r, start:end], docs[r, start:end], pos[r, start:end] = sentence, d + 1, np.arange(len(sentence))
      start = end
  return ids, docs, pos


def packed_apply(model: model_lib.SentenceEncoder) -> Callable:
  """(params, input_ids, document_ids, position_ids from 0) -> [B, slots_for(T), D]: the model's `packed`
  (RoBERTa's positions start after its pad id, as `default_position_ids` counts them)."""
  offset = model.config.pad_token_id + 1 if getattr(model.config, "position_style", "") == "roberta" else 0
  return lambda p, ids, docs, pos: model.apply({"params": p}, ids, docs, pos + offset, slots_for(ids.shape[1]),
                                               method=model_lib.SentenceEncoder.packed)


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
  # Packing (PACKING below): jitted (params, input_ids, document_ids, position_ids) -> [R, slots, D]; None:
  # one sentence per row.
  packed_forward: Callable | None = None
  tokens_per_call: int = ACCELERATOR_TOKENS_PER_CALL
  concurrent_calls: int = 1  # > 1: model calls run from this many threads at once (CONCURRENT_CALLS)

  @classmethod
  def load(cls, path: str, batch_size: int = 32, buckets: Sequence[int] | None = None, *, pack: bool = True,
           tokens_per_call: int | None = None, concurrent_calls: int | None = None,
           note: Callable[[str], None] | None = None) -> "Embedder":
    """From any checkpoint (a bi-encoder workdir, a converted sentence-transformers folder, a HF or
    bert_jax model: mean pooling where none is recorded). pack: several sentences per row where the
    family can (module docstring); buckets: the packed rows' widths (default `pack_widths_for`), or
    without packing the padded lengths (default `buckets_for(max_seq_length)`); batch_size: sentences per
    call without packing; tokens_per_call: about this many tokens of packed rows per call (default
    TOKENS_PER_CALL for the backend); concurrent_calls: model calls run at once, each from a thread
    (default CONCURRENT_CALLS for the backend, else 1); note: takes the loading notes (default: printed to
    stderr), e.g. to print them only once the caller's own checks pass."""
    if tokens_per_call is None:
      tokens_per_call = TOKENS_PER_CALL.get(jax.default_backend(), ACCELERATOR_TOKENS_PER_CALL)
    if concurrent_calls is None:
      concurrent_calls = CONCURRENT_CALLS.get(jax.default_backend(), 1)
    if batch_size <= 0 or tokens_per_call <= 0 or concurrent_calls <= 0:
      raise UserError(f"batch size {batch_size}, tokens per call {tokens_per_call} and concurrent calls "
                      f"{concurrent_calls} must be positive")
    model, params, tokenizer, notes = model_lib.from_checkpoint(path)
    if tokenizer is None:
      raise UserError(f"{path}: no tokenizer files (vocab.txt, *.model, tokenizer.json, or vocab.json + merges.txt) "
                      "found")
    length, pack = model.pooling.max_seq_length, pack and can_pack(model)
    buckets = tuple(sorted(set(buckets or (pack_widths_for(length) if pack else buckets_for(length)))))
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
    packed_forward = None
    if pack:
      packed_forward = jax.jit(partitioning.in_mesh(packed_apply(model), mesh, rules),
                               in_shardings=(shardings, data, data, data), out_shardings=data)
    for line in notes:  # after the checks above: a refused model prints its one error line alone
      (note or _to_stderr)(line)
    return cls(pooling=model.pooling, dimension=model.pooling.dimension(model.config.hidden_size),
               tokenizer=pretrained.build_tokenizer(tokenizer),
               params=jax.device_put(nn.meta.unbox(params), shardings),
               forward=jax.jit(partitioning.in_mesh(forward, mesh, rules), in_shardings=(shardings, data, data),
                               out_shardings=data),
               mesh=mesh, batch_size=-(-batch_size // devices) * devices, buckets=buckets,
               packed_forward=packed_forward, tokens_per_call=tokens_per_call, concurrent_calls=concurrent_calls)

  def tokenize(self, sentence: str) -> list[int]:
    """[CLS] the sentence's tokens [SEP], at most max_seq_length ids."""
    return token_ids(self.tokenizer, sentence, self.pooling.max_seq_length)

  def __call__(self, sentences: Sequence[str] | str, *, progress: bool = False) -> np.ndarray:
    """float32[len(sentences), dimension], in the order given (a tqdm bar on stderr when `progress`
    and the job takes more than a couple of seconds); one string gives one float32[dimension] vector, as
    sentence-transformers' `encode("text")` does."""
    if isinstance(sentences, str):
      return self([sentences], progress=progress)[0]
    if isinstance(sentences, (bytes, dict)) or not hasattr(sentences, "__iter__"):
      raise UserError(f"sentences: expected a string or a list of strings, got {type(sentences).__name__}")
    sentences = list(sentences)  # a generator is read once
    for i, sentence in enumerate(sentences):
      if not isinstance(sentence, str):
        raise UserError(f"sentence {i + 1}: expected a string, got {sentence!r:.80}")
    rows = [self.tokenize(s) for s in sentences]
    out = np.zeros((len(rows), self.dimension), np.float32)
    if self.packed_forward is None:
      calls = [(chosen, functools.partial(self._run, [rows[i] for i in chosen], length))
               for length, chosen in self.batches([len(r) for r in rows])]
    else:
      calls = [(packed, functools.partial(self._run_packed, [[rows[i] for i in row] for row in packed], width))
               for width, packed in self.packed_calls([len(r) for r in rows])]
    with tqdm.tqdm(total=len(rows), disable=not progress, delay=2.0, file=sys.stderr, unit="sentence",
                   desc="embed") as bar:
      if self.concurrent_calls > 1:  # each thread runs a call to its end, so calls overlap (CONCURRENT_CALLS)
        with concurrent.futures.ThreadPoolExecutor(self.concurrent_calls) as pool:
          for (chosen, _), embeddings in zip(calls, pool.map(lambda call: _fetch(call[1]()), calls)):
            self._collect((chosen, embeddings), out, bar)
        return out
      pending = []
      for chosen, run in calls:
        pending.append((chosen, run()))  # dispatched, not waited for
        if len(pending) > 2:
          self._collect(pending.pop(0), out, bar)
      for item in pending:
        self._collect(item, out, bar)
    return out

  def packed_calls(self, lengths: Sequence[int]) -> list[tuple[int, list[list[int]]]]:
    """(width, rows of sentence indices) per model call of the packed path: `pack_rows` per width, about
    tokens_per_call tokens per call (a multiple of the device count of rows)."""
    devices = partitioning.data_parallel_size(self.mesh)
    calls = []
    for width, rows in pack_rows(lengths, self.buckets).items():
      per_call = max(devices, self.tokens_per_call // width // devices * devices)
      calls.extend((width, rows[s:s + per_call]) for s in range(0, len(rows), per_call))
    return calls

  def _run_packed(self, rows: list[list[list[int]]], width: int) -> jax.Array:
    """[calls rows, slots, D] for rows of sentences' ids packed `width` wide (free rows repeat the first)."""
    devices = partitioning.data_parallel_size(self.mesh)
    per_call = max(devices, self.tokens_per_call // width // devices * devices)
    count = max(per_call, -(-len(rows) // devices) * devices)
    arrays = packed_arrays(rows + rows[:1] * (count - len(rows)), width, self.tokenizer.special_ids["[PAD]"])
    arrays = (partitioning.global_batch({"x": a}, self.mesh)["x"] for a in arrays)
    return self.packed_forward(self.params, *arrays)

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
  def _collect(item: tuple[list, jax.Array | np.ndarray], out: np.ndarray, bar) -> None:
    chosen, embeddings = item
    embeddings = _fetch(embeddings)
    if embeddings.ndim == 3:  # packed: rows of sentence indices, each row's sentences in its slots
      rows, slots = zip(*[(r, s) for r, row in enumerate(chosen) for s in range(len(row))])
      chosen, embeddings = [i for row in chosen for i in row], embeddings[list(rows), list(slots)]
    out[chosen] = embeddings[:len(chosen)]
    bar.update(len(chosen))


def _to_stderr(line: str) -> None:
  print(line, file=sys.stderr, flush=True)


def _fetch(embeddings: jax.Array | np.ndarray) -> np.ndarray:
  """A call's result on the host (waits for the call)."""
  return np.asarray(jax.device_get(embeddings))


def read_lines(path: str, flag: str = "--input") -> list[str]:
  """One sentence per line (UTF-8; a final newline ends the last line, it does not add an empty one).
  Errors name the `flag` that gave the path."""
  file = epath.Path(path)
  if not file.is_file():
    raise UserError(f"{flag} {path}: no such file")
  try:
    text = file.read_text(encoding="utf-8")
  except UnicodeDecodeError as e:
    raise UserError(f"{flag} {path}: not UTF-8 text ({e})") from None
  lines = [line.removesuffix("\r") for line in text.split("\n")]
  lines = lines[:-1] if lines and not lines[-1] else lines
  if not lines:
    raise UserError(f"{flag} {path}: the file is empty; give one sentence per line")
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
  """`array` as a .npy file, written whole or not at all (workdir.atomic_open): a full disk is one line and
  leaves no file. The data goes through `f.write`, not np.save's `tofile`, whose short write on a full disk
  says only "N requested and M written" (no errno)."""
  check_output(path)
  array = np.ascontiguousarray(array)
  with workdir.atomic_open(workdir.path(path), "wb") as f:
    try:
      np.lib.format.write_array_header_1_0(f, np.lib.format.header_data_from_array_1_0(array))
      f.write(memoryview(array.reshape(-1)).cast("B"))
      f.flush()
    except OSError as e:
      if e.errno in (errno.ENOSPC, errno.EDQUOT):
        raise UserError(f"--output {path}: no space left on {_device_of(path)} while writing embeddings "
                        f"({array.nbytes} bytes); free space there, or choose another disk, and rerun") from None
      raise workdir.write_error(path, e, "--output") from None


def check_dim(dim: int, dimension: int) -> int:
  """The embedding's first `dim` floats (0: all of them, the model's `dimension`)."""
  if not 0 <= dim <= dimension:
    raise UserError(f"--dim {dim}: the model's embeddings have {dimension} dimensions; keep 1 to {dimension} "
                    "of them (0: all)")
  return dim or dimension


def check_space(path: str, rows: int, dimension: int) -> None:
  """UserError before the embedding work when the disk holding --output has no room for the file."""
  needed = rows * dimension * 4 + 128  # float32 rows and the .npy header
  device = _device_of(path)
  free = shutil.disk_usage(device).free
  if free < needed:
    raise UserError(f"--output {path}: no space left on {device} for the embeddings ({rows} x {dimension} "
                    f"float32, {needed} bytes; {free} free); free space there, or choose another disk, and rerun")


def _device_of(path: str) -> str:
  """The mount point holding `path` (the device the disk-full line names)."""
  if workdir.is_url(workdir.path(path)):  # staged in a local temporary folder before the upload
    path = os.path.join(tempfile.gettempdir(), "x")
  folder = os.path.dirname(os.path.abspath(path))
  while not os.path.ismount(folder):
    folder = os.path.dirname(folder)
  return folder
