"""TinyBERT's data augmentation (Jiao et al. 2019, Algorithm 1), `bert-jax data augment`.

Each training sentence becomes itself plus `per_example` copies in which every word, with probability
`replace_prob`, is replaced by one of its candidates, drawn uniformly. A word that is one word piece gets
as candidates the `candidates` most likely words of a masked language model with that word masked
(the sentence's other words in place): the MLM's top predictions that are whole words (no `##` piece,
no special token) other than the word itself. The paper gives a word of several pieces its GloVe nearest
neighbours instead; no word vectors ship here, so such words are kept as they are (the count is
reported). The augmented set feeds task distillation (`--config.data.data_dir=` the output folder).

Words come from BERT's basic tokenizer with their case (the MLM sees them as its tokenizer reads them);
the augmented sentences are those words joined by single spaces. WordPiece vocabularies only.
"""
from __future__ import annotations

import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax import pretrained
from bert_jax.data_pipelines.tokenizers import basic_tokenize
from bert_jax.errors import UserError
from bert_jax.finetune import glue
from bert_jax.models import families


def _round_up(n: int, multiple: int) -> int:
  return -(-n // multiple) * multiple


class Candidates:
  """The MLM of a checkpoint with an MLM head, asked for each single-piece word's replacements."""

  def __init__(self, model_path: str, count: int, batch_size: int = 64):
    model, params = pretrained.load_pretrained(model_path)
    if "mlm" not in families.of(model.config).heads_of(model.config):
      raise UserError(f"--model {model_path}: no MLM head (augmentation asks a masked language model for "
                      "replacements: give a pretraining checkpoint, e.g. the teacher's init_from)")
    self.tokenizer = pretrained.load_tokenizer(model_path)
    if getattr(self.tokenizer, "kind", "wordpiece") != "wordpiece" or not hasattr(self.tokenizer, "vocab"):
      raise UserError(f"--model {model_path}: augmentation reads WordPiece vocabularies (vocab.txt) only for now")
    self.count, self.batch_size = count, batch_size
    self.max_len = model.config.max_position_embeddings
    special = set(self.tokenizer.special_ids.values())
    self.allowed = np.zeros(model.config.vocab_size, bool)  # ids past the vocabulary (padded tables): never
    self.allowed[:len(self.tokenizer.vocab)] = [i not in special and not tok.startswith(("##", "["))
                                                for i, tok in enumerate(self.tokenizer.vocab)]
    self.mask_id = self.tokenizer.special_ids["[MASK]"]
    self.cls, self.sep = self.tokenizer.special_ids["[CLS]"], self.tokenizer.special_ids["[SEP]"]
    self.pad = self.tokenizer.special_ids["[PAD]"]

    @jax.jit
    def top(ids, mask, positions):
      logits = model.apply({"params": params}, ids, mask, jnp.zeros_like(ids), masked_positions=positions).mlm_logits
      logits = jnp.where(jnp.asarray(self.allowed), logits[:, 0].astype(jnp.float32), -jnp.inf)
      return jax.lax.top_k(logits, count + 1)[1]  # one spare: the word itself may be among them
    self._top = top

  def of(self, sentences: list[list[str]]) -> tuple[list[list[list[str]]], int]:
    """Per sentence, per word: its candidate words ([] for a word of several pieces, or beyond the
    model's length); and how many words had several pieces."""
    pieces = [[self.tokenizer.encode(w) for w in words] for words in sentences]
    result = [[[] for _ in words] for words in sentences]
    queries, several = [], 0
    for s, words in enumerate(pieces):
      for w, word_pieces in enumerate(words):
        if len(word_pieces) != 1:
          several += len(word_pieces) > 1
          continue
        ids = [self.cls] + [i for k, p in enumerate(words) for i in ([self.mask_id] if k == w else p)] + [self.sep]
        if len(ids) <= self.max_len:
          queries.append((s, w, ids, 1 + sum(len(p) for p in words[:w])))
    if not queries:
      return result, several
    length = min(_round_up(max(len(q[2]) for q in queries), 16), self.max_len)
    for start in range(0, len(queries), self.batch_size):
      chunk = queries[start:start + self.batch_size]
      ids = np.full((self.batch_size, length), self.pad, np.int32)
      mask = np.zeros((self.batch_size, length), np.int32)
      positions = np.zeros((self.batch_size, 1), np.int32)
      for row, (_, _, q, at) in enumerate(chunk):
        ids[row, :len(q)], mask[row, :len(q)], positions[row, 0] = q, 1, at
      top = np.asarray(self._top(jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(positions)))
      for row, (s, w, _, _) in enumerate(chunk):
        own = sentences[s][w].lower() if self.tokenizer.lower_case else sentences[s][w]
        words = [self.tokenizer.vocab[i] for i in top[row] if self.tokenizer.vocab[i] != own]
        result[s][w] = words[:self.count]
    return result, several


def augmented(words: list[str], candidates: list[list[str]], copies: int, replace_prob: float,
              rng: np.random.Generator) -> list[str]:
  """`copies` sentences: each word replaced with probability replace_prob by a uniform draw of its candidates."""
  out = []
  for _ in range(copies):
    draws = rng.random(len(words))
    out.append(" ".join(c[rng.integers(len(c))] if c and d < replace_prob else w
                        for w, c, d in zip(words, candidates, draws)))
  return out


def augment_glue(model_path: str, task: str, input_dir: str, output_dir: str, *, per_example: int = 20,
                 replace_prob: float = 0.4, candidates: int = 15, seed: int = 0, max_rows: int = 0,
                 batch_size: int = 64) -> dict:
  """Writes `output_dir`: train.tsv with each (of the first max_rows, 0: all) training row followed by its
  augmented copies (text a and text b each augmented, the label kept), and the folder's other files
  unchanged. Returns counts."""
  if task not in glue.SPECS:
    raise UserError(f"--task {task!r}: augmentation reads GLUE task folders: one of {sorted(glue.SPECS)}")
  if per_example < 1 or not 0 <= replace_prob <= 1 or candidates < 1:
    raise UserError("--per-example and --candidates must be >= 1 and --replace-prob in [0, 1]")
  spec = glue.SPECS[task]
  train = os.path.join(input_dir, "train.tsv")
  if not os.path.exists(train):
    raise UserError(f"--input {input_dir}: no train.tsv")
  if os.path.abspath(input_dir) == os.path.abspath(output_dir):
    raise UserError("--output must be another folder than --input (train.tsv would be overwritten)")
  rows = glue.read_tsv(train, spec, labelled=True)
  rows = rows[:max_rows] if max_rows else rows
  asker = Candidates(model_path, candidates, batch_size)
  texts = [[basic_tokenize(r[k], False) if r[k] is not None else None for r in rows] for k in (0, 1)]
  found = [asker.of([t for t in column if t is not None]) if any(t is not None for t in column) else ([], 0)
           for column in texts]
  rng = np.random.default_rng(seed)
  os.makedirs(output_dir, exist_ok=True)
  for name in os.listdir(input_dir):
    if name != "train.tsv" and os.path.isfile(os.path.join(input_dir, name)):
      shutil.copy(os.path.join(input_dir, name), os.path.join(output_dir, name))
  a_name, b_name, label_name = spec.tsv_columns
  header = [a_name, *([b_name] if b_name else []), label_name]
  iters = [iter(found[0][0]), iter(found[1][0])]
  written = 0
  with open(os.path.join(output_dir, "train.tsv"), "w", encoding="utf-8") as f:
    f.write("\t".join(header) + "\n")
    for r, (a, b, label) in enumerate(rows):
      copies = []
      for k, text in ((0, a), (1, b)):
        if text is None:
          copies.append([None] * per_example)
          continue
        copies.append(augmented(texts[k][r], next(iters[k]), per_example, replace_prob, rng))
      lines = [(a, b)] + list(zip(*copies))
      for x, y in lines:
        f.write("\t".join([x, *([y] if b_name else []), label]) + "\n")
      written += len(lines)
  return {"rows": len(rows), "written": written, "several_piece_words": found[0][1] + found[1][1]}
