"""Helpers every task shares: reading tfds splits, [CLS] a [SEP] b [SEP] encoding, padding rows.

The tokenizer's layout (data_pipelines/tokenizers.py:Layout) places the special tokens and the padding:
XLNet's rows are a <sep> b <sep> <cls>, padded on the left, token types 0, 1 and 2 (<cls>).

The feature contract the model and train step read (all int32 unless noted, N rows, T max_seq_length, or
task.memory_segments windows of it, `input_length`):
  input_ids, attention_mask, token_type_ids: [N, T]
  classification: label [N];  regression: label float32[N]
  token: token_labels [N, T], label_weights float32[N, T] (1 on each word's first sub-token)
  span: start_positions, end_positions [N] (0, the [CLS] position, for "no answer in this window")
  ranking, training (finetune/ranking.py): G groups of K rows, input_ids, attention_mask, token_type_ids
    [G, K, T], label [G] (the positive's index), candidate_mask float32[G, K] (0: padding), scale float32[G];
    its eval rows are classification's
Eval sets add example_weight float32[N] (0 on rows that only pad the last batch).
"""
from __future__ import annotations

import logging
import urllib.parse
from typing import Iterator

import numpy as np

from bert_jax.data_pipelines.tokenizers import layout_of
from bert_jax.errors import UserError

MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
_PROBE_HOSTS = 3  # download servers asked before a download starts (each within _PROBE_TIMEOUT_S)
_PROBE_TIMEOUT_S = 10


def tfds_examples(name: str, split: str, data_dir: str = "", local_files: str = "the task's files") -> Iterator[dict]:
  """The examples of a tfds split as numpy dicts (TF kept off the accelerators JAX uses).

  A dataset not yet prepared in `data_dir` is downloaded and prepared first; `local_files` names what
  `data.data_dir` would hold instead, for the message when that download cannot start.
  """
  from bert_jax.data_pipelines.tftools import tf_module  # pylint: disable=import-outside-toplevel
  tfds = tf_module("tensorflow_datasets")
  try:
    builder = tfds.builder(name, data_dir=data_dir or None)
    try:
      dataset = builder.as_dataset(split=split, shuffle_files=False)
    except AssertionError:  # tfds' "could not find data": not prepared in data_dir yet
      _download(builder, name, local_files)
      dataset = builder.as_dataset(split=split, shuffle_files=False)
  except UserError:
    raise
  except Exception as e:  # tfds raises several types for "not prepared" / "no such split"
    raise UserError(f"cannot load tfds {name!r} split {split!r}: {e}; prepare it with tfds or set "
                    f"--config.data.data_dir to {local_files}") from None
  yield from tfds.as_numpy(dataset)


def _download(builder, name: str, local_files: str) -> None:
  """Downloads and prepares a tfds dataset, after one bounded look at whether its servers answer.

  tfds retries a failed connection ten times with growing pauses (about 3.5 minutes offline) and
  sets no timeout, so a machine without a network would sit there before hearing why.
  """
  import requests  # pylint: disable=import-outside-toplevel  (tfds' HTTP client, so its proxy settings hold)
  urls = sorted(builder.url_infos or ()) or [builder.info.homepage]
  hosts = list(dict.fromkeys(urllib.parse.urlsplit(u)[:2] for u in urls if u))[:_PROBE_HOSTS]
  failures = []
  for scheme, host in hosts:
    try:
      requests.head(f"{scheme}://{host}/", timeout=_PROBE_TIMEOUT_S, allow_redirects=False)
      break
    except requests.RequestException as e:
      failures.append(f"{host}: {type(e).__name__}")
  else:
    if failures:
      raise UserError(
          f"tfds {name!r} is not prepared in {builder.data_dir_root} and its download failed (no answer from "
          f"{', '.join(failures)}): offline, set --config.data.data_dir to {local_files}, or prepare it where "
          f"there is a network (`tfds build {name} --data_dir DIR`) and set --config.data.tfds_data_dir=DIR")
  try:
    builder.download_and_prepare()
  except Exception as e:  # network, checksum and disk errors alike end the job here
    reason = (str(e).splitlines() or [""])[0]
    raise UserError(f"downloading tfds {name!r} into {builder.data_dir_root} failed ({type(e).__name__}: {reason}); "
                    f"set --config.data.data_dir to {local_files}") from None


def report(source: str, count: int, problem: str, where: list[str], strict: bool) -> None:
  """A counted data problem (`count` rows/questions with `problem`): a warning naming the first few,
  or, with data.strict=true, an error."""
  if not count:
    return
  message = f"{source}: {count} {problem} ({', '.join(where[:5])}{', ...' if len(where) > 5 else ''})"
  if strict:
    raise UserError(f"{message} (data.strict=true makes this an error; false warns and goes on)")
  logging.warning("%s; data.strict=true makes this an error", message)


def text(value) -> str:
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def input_length(config) -> int:
  """The rows' length T: data.max_seq_length, times task.memory_segments windows when that is on
  (finetune/memory.py); `config` a ConfigDict or a saved config.json's dict."""
  return config["data"]["max_seq_length"] * max(1, int(config["task"].get("memory_segments", 0) or 0))


def truncate_pair(a: list[int], b: list[int], max_tokens: int) -> tuple[list[int], list[int]]:
  """Drops tokens from the end of the longer sequence until both fit (BERT's _truncate_seq_pair)."""
  a, b = list(a), list(b)
  while len(a) + len(b) > max_tokens:
    (a if len(a) > len(b) else b).pop()
  return a, b


def encode_pair(tokenizer, a: list[int], b: list[int] | None, max_len: int) -> dict[str, np.ndarray]:
  """a (and b) with the special tokens where the tokenizer's layout puts them (BERT's [CLS] a [SEP] b [SEP],
  XLNet's a <sep> b <sep> <cls>), truncated longest-first and padded to max_len."""
  cls, sep, layout = tokenizer.special_ids["[CLS]"], tokenizer.special_ids["[SEP]"], layout_of(tokenizer)
  if b is None:
    a = a[:max_len - 2]
  else:
    a, b = truncate_pair(a, b, max_len - layout.pair_specials)
  return pad_row(tokenizer, *layout.wrap(cls, sep, a, b), max_len)


def pad_start(tokenizer, length: int, max_len: int) -> int:
  """Where a row of `length` tokens starts once padded to max_len (after the padding, for a left-padding layout)."""
  return max_len - length if layout_of(tokenizer).pad_left else 0


def pad_row(tokenizer, ids: list[int], types: list[int] | None, max_len: int) -> dict[str, np.ndarray]:
  """The row padded to max_len on the layout's side (token types 0 when `types` is None)."""
  start = pad_start(tokenizer, len(ids), max_len)
  real = slice(start, start + len(ids))
  row = {name: np.zeros(max_len, np.int32) for name in MODEL_INPUTS}
  row["input_ids"][:] = tokenizer.special_ids["[PAD]"]
  row["input_ids"][real] = ids
  row["attention_mask"][real] = 1
  if types is not None:
    row["token_type_ids"][real] = types
  return row


def stack(rows: list[dict[str, np.ndarray]], **extra: np.ndarray) -> dict[str, np.ndarray]:
  if not rows:
    raise UserError("no examples: the split is empty (check --config.data.data_dir or the tfds name)")
  out = {k: np.stack([r[k] for r in rows]) for k in rows[0]}
  out.update(extra)
  return out


def pad_to_multiple(features: dict[str, np.ndarray], multiple: int) -> dict[str, np.ndarray]:
  """Appends copies of row 0 with example_weight 0 so the row count divides `multiple`."""
  n = len(next(iter(features.values())))
  extra = -n % multiple
  out = {k: np.concatenate([v, np.repeat(v[:1], extra, axis=0)]) for k, v in features.items()}
  out["example_weight"] = np.r_[np.ones(n, np.float32), np.zeros(extra, np.float32)]
  return out
