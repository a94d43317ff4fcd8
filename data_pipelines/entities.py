"""ERNIE-THU's entity inputs (Zhang et al. 2019, "ERNIE: Enhanced Language Representation with Informative
Entities"): which entity each token is aligned to, the frozen entity vectors, and the denoising entity
auto-encoder's (dEA) noised alignments, candidates and labels. Host-side NumPy, run on each batch by the
objective's feed (training/objectives/ernie_thu.py), so the entity table never enters the model's parameters,
its checkpoints or the compiled step.

- The table: a `.npy` file of float vectors [N, De] (e.g. TransE's), row r the vector of entity r.
- Alignment: `entity_ids` int32[B, T], row + 1 of the entity whose mention starts at that token (0: none), read
  from the batch when it has them, else matched in the row by a `Mentions` list: a file of `surface<TAB>row`
  lines (the surface text of a mention, the entity's 0-based row in the table), each surface tokenized with the
  run's tokenizer and matched on the row's original ids (the masked LM's [MASK]s put back) at word boundaries,
  longest first, left to right.
- dEA noise (paper section 4.3): each alignment independently is replaced by another random entity
  (`replace`, 5%), masked (`mask`, 15%: no entity there) or kept (80%); every original alignment is predicted
  among the row's entities (its candidates: the distinct aligned entities, in order of first mention, at most
  `max_entities`; an entity beyond those is not predicted).
"""
from __future__ import annotations

import collections
import os
import re

import numpy as np

from bert_jax.data_pipelines import embedded
from bert_jax.errors import UserError

EMBEDDED = "embedded"  # ernie_thu.entity_embeddings / mentions: the toy graph of the embedded corpus (toy_graph)
TOY_ENTITIES = 64


def toy_graph(dim: int) -> tuple[str, str]:
  """(vectors.npy, mentions.tsv) of a toy knowledge graph for the embedded corpus, built on first use and cached:
  its TOY_ENTITIES most frequent words of 6 letters or more as entities, each with a random vector of width
  `dim` (seeded). It runs ERNIE-THU's pipeline end to end (the tiny preset); its vectors hold no knowledge."""
  corpus, _ = embedded.ensure_embedded()
  final = os.path.join(os.path.dirname(corpus), f"ernie-thu-toy-{TOY_ENTITIES}-{dim}")

  def build(staging: str) -> None:
    with open(corpus, encoding="utf-8") as f:
      counts = collections.Counter(w for w in re.findall(r"[a-z]{6,}", f.read().lower()))
    words = sorted(counts, key=lambda w: (-counts[w], w))[:TOY_ENTITIES]
    np.save(os.path.join(staging, "vectors.npy"),
            np.random.default_rng(0).normal(size=(len(words), dim)).astype(np.float32))
    with open(os.path.join(staging, "mentions.tsv"), "w", encoding="utf-8") as f:
      f.writelines(f"{w}\t{i}\n" for i, w in enumerate(words))

  embedded.build_once(final, build)
  return os.path.join(final, "vectors.npy"), os.path.join(final, "mentions.tsv")


def resolve(table: str, mentions: str, dim: int) -> tuple[str, str]:
  """The config's paths, "embedded" replaced by the toy graph's files."""
  if EMBEDDED in (table, mentions):
    toy = toy_graph(dim)
    table, mentions = (toy[0] if table == EMBEDDED else table), (toy[1] if mentions == EMBEDDED else mentions)
  return table, mentions


def load_table(path: str, dim: int) -> np.ndarray:
  """The frozen entity vectors float32[N, dim] of a `.npy` file (memory-mapped when it is float32)."""
  try:
    table = np.load(path, mmap_mode="r")
  except (OSError, ValueError) as e:
    raise UserError(f"ernie_thu.entity_embeddings={path!r}: cannot read a .npy array ({e})") from None
  if table.ndim != 2 or table.shape[1] != dim or not table.shape[0]:
    raise UserError(f"ernie_thu.entity_embeddings={path!r} holds an array of shape {table.shape}; it must be "
                    f"[entities, model.entity_dim={dim}]")
  return table if table.dtype == np.float32 else np.asarray(table, np.float32)


class Mentions:
  """Mention surfaces (as token id sequences) -> entity row + 1, matched in rows of token ids."""

  def __init__(self, mentions: dict[tuple[int, ...], int], continuation: np.ndarray | None = None):
    self.by_first: dict[int, list[tuple[tuple[int, ...], int]]] = {}
    for ids, entity in mentions.items():
      self.by_first.setdefault(ids[0], []).append((ids, entity))
    for options in self.by_first.values():
      options.sort(key=lambda o: -len(o[0]))  # longest first
    self.continuation = continuation  # bool[vocab]: pieces that continue a word (no match starts or ends there)

  @classmethod
  def from_file(cls, path: str, tokenizer, num_entities: int) -> "Mentions":
    """`surface<TAB>row` lines; the surfaces tokenized by `tokenizer` (encode); rows below num_entities."""
    try:
      with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    except OSError as e:
      raise UserError(f"ernie_thu.mentions={path!r}: cannot read it ({e.strerror})") from None
    mentions = {}
    for n, line in enumerate(lines, 1):
      if not line.strip() or line.startswith("#"):
        continue
      surface, _, row = line.rpartition("\t")
      if not surface.strip() or not row.strip().isdigit() or int(row) >= num_entities:
        raise UserError(f"ernie_thu.mentions={path!r} line {n}: write `surface<TAB>row` with the entity's row "
                        f"in the table (0..{num_entities - 1}), got {line!r}")
      ids = tuple(int(i) for i in tokenizer.encode(surface.strip()))
      if ids:
        mentions.setdefault(ids, int(row) + 1)
    if not mentions:
      raise UserError(f"ernie_thu.mentions={path!r} lists no mention")
    continuation = tokenizer.continuation_mask() if hasattr(tokenizer, "continuation_mask") else None
    return cls(mentions, continuation)

  def _starts_word(self, ids: np.ndarray, i: int) -> bool:
    return i >= len(ids) or self.continuation is None or not self.continuation[ids[i]]

  def match(self, ids: np.ndarray) -> np.ndarray:
    """int32[T]: entity row + 1 at the first token of each mention found in `ids` (a row), 0 elsewhere."""
    out = np.zeros(len(ids), np.int32)
    i = 0
    while i < len(ids):
      for surface, entity in self.by_first.get(int(ids[i]), ()) if self._starts_word(ids, i) else ():
        end = i + len(surface)
        if end <= len(ids) and tuple(int(t) for t in ids[i:end]) == surface and self._starts_word(ids, end):
          out[i] = entity
          i = end
          break
      else:
        i += 1
    return out


def original_ids(batch: dict) -> np.ndarray:
  """input_ids with the masked LM's targets put back at its positions (what the text said)."""
  ids = np.array(batch["input_ids"], copy=True)
  weights = np.asarray(batch["masked_lm_weights"]) > 0
  rows, slots = np.nonzero(weights)
  ids[rows, np.asarray(batch["masked_lm_positions"])[rows, slots]] = np.asarray(batch["masked_lm_ids"])[rows, slots]
  return ids


def noise(entity_ids: np.ndarray, num_entities: int, replace: float, mask: float, rng: np.random.Generator
          ) -> np.ndarray:
  """dEA's input alignments: each aligned token's entity replaced by another random one (p `replace`), masked
  to 0 (p `mask`) or kept."""
  u = rng.random(entity_ids.shape)
  aligned = entity_ids > 0
  # another entity: uniform over the N - 1 others (1-based ids)
  other = rng.integers(1, max(num_entities, 2), entity_ids.shape)
  other = np.where(other >= entity_ids, other + 1, other) if num_entities > 1 else entity_ids
  out = np.where(aligned & (u < replace), other, entity_ids)
  out = np.where(aligned & (u >= replace) & (u < replace + mask), 0, out)
  return out.astype(np.int32)


def candidates(entity_ids: np.ndarray, max_entities: int) -> tuple[np.ndarray, np.ndarray]:
  """Each row's candidates int32[B, C] (distinct entity ids in order of first mention, 0-padded; C =
  max_entities) and the labels int32[B, T]: each aligned token's entity's index among them (-1: none, or
  an entity beyond the first C)."""
  rows, length = entity_ids.shape
  cands = np.zeros((rows, max_entities), np.int32)
  labels = np.full((rows, length), -1, np.int32)
  for b in range(rows):
    index: dict[int, int] = {}
    for t in np.flatnonzero(entity_ids[b]):
      e = int(entity_ids[b, t])
      if e not in index and len(index) < max_entities:
        index[e] = len(index)
        cands[b, index[e]] = e
      labels[b, t] = index.get(e, -1)
  return cands, labels


def vectors(table: np.ndarray, ids: np.ndarray) -> np.ndarray:
  """float32[..., De]: the table's row id - 1 for each id > 0, zeros for 0."""
  out = np.asarray(table[np.maximum(ids, 1).reshape(-1) - 1], np.float32).reshape(ids.shape + (table.shape[1],))
  return out * (ids > 0)[..., None]


def features(entity_ids: np.ndarray, table: np.ndarray, max_entities: int, replace: float, mask: float,
             rng: np.random.Generator) -> dict[str, np.ndarray]:
  """The model's and dEA's features of a batch whose original alignments are `entity_ids` int32[B, T]:
  entity_vectors f32[B, T, De] and entity_mask int32[B, T] of the noised alignments, entity_candidates
  f32[B, C, De] and entity_candidate_mask int32[B, C], entity_labels int32[B, T] (-1: nothing to predict)."""
  noised = noise(entity_ids, table.shape[0], replace, mask, rng)
  cands, labels = candidates(entity_ids, max_entities)
  return {"entity_vectors": vectors(table, noised), "entity_mask": (noised > 0).astype(np.int32),
          "entity_candidates": vectors(table, cands), "entity_candidate_mask": (cands > 0).astype(np.int32),
          "entity_labels": labels}
