"""`bert-jax data preview`: a few batches exactly as the model gets them, saved to .npz, one printed."""
from __future__ import annotations

import io

import numpy as np

from bert_jax import workdir
from bert_jax.data_pipelines import pipeline

_SPECIALS = ("[CLS]", "[SEP]", "[MASK]", "[PAD]")


def render_example(batch: dict, row: int, tokenizer) -> str:
  """Tokens of one row up to its padding; a prediction (a masked token, or a shuffled trigram's token:
  `shuffled_*`) shows as `[input->ORIGINAL]`, knowledge masking's units as `{E:...}` and `{P:...}`."""
  length = int(batch["input_mask"][row].sum())
  tokens = tokenizer.decode_tokens(batch["input_ids"][row][:length])
  for kind in ("masked_lm", "shuffled"):
    if f"{kind}_weights" not in batch:
      continue
    weights = batch[f"{kind}_weights"][row] > 0
    for position, label in zip(batch[f"{kind}_positions"][row][weights], batch[f"{kind}_ids"][row][weights]):
      tokens[position] = f"[{tokens[position]}->{tokenizer.id_to_token(int(label))}]"
  if "knowledge_units" in batch:
    _mark_units(tokens, batch["knowledge_units"][row][:length])
  return " ".join(tokens)


def _mark_units(tokens: list[str], tags) -> None:
  """Knowledge masking's spans as `{E:...}` (entity) and `{P:...}` (phrase), in place."""
  for i, tag in enumerate(tags):
    if tag % 2:
      tokens[i] = f"{{{'PE'[(tag - 1) // 2]}:{tokens[i]}"
    if tag and (i + 1 == len(tags) or tags[i + 1] % 2 or not tags[i + 1]):
      tokens[i] += "}"


def preview(config, num_batches: int, output: str) -> str:
  """Writes `num_batches` batches (arrays [N, B, ...]) plus token metadata to `output`; returns one example."""
  data = pipeline.for_config(config, "train", config.train.batch_size)  # what the trainer reads
  try:
    batches = [next(data) for _ in range(num_batches)]
  finally:
    data.close()
  arrays = {k: np.stack([b[k] for b in batches]) for k in batches[0]}
  tokenizer = data.tokenizer
  arrays["special_token_ids"] = np.array([tokenizer.special_ids[t] for t in _SPECIALS], np.int32)
  arrays["special_token_names"] = np.array(_SPECIALS)
  arrays["mask_token_id"] = np.int32(tokenizer.special_ids["[MASK]"])
  arrays["vocab"] = np.array(tokenizer.vocab)
  buffer = io.BytesIO()
  np.savez(buffer, **arrays)
  workdir.write_bytes(workdir.path(output), buffer.getvalue())
  number, row, note = _shown_row(batches)
  label = int(batches[number]["next_sentence_labels"][row])
  return f"{note}next_sentence_label={label}\n{render_example(batches[number], row, tokenizer)}"


def _shown_row(batches: list[dict]) -> tuple[int, int, str]:
  """(batch, row, a line saying why) of the example to print: the first row; with knowledge masking the first
  row that holds a phrase or entity span, since most rows of most corpora hold none."""
  if "knowledge_units" not in batches[0]:
    return 0, 0, ""
  for number, batch in enumerate(batches):
    rows = np.flatnonzero(np.asarray(batch["knowledge_units"]).any(axis=1))
    if len(rows):
      return number, int(rows[0]), (f"batch {number}, row {rows[0]}: the first with a knowledge span ({{E:...}} "
                                    "an entity, {P:...} a phrase)\n")
  return 0, 0, (f"no row of these {len(batches)} batches holds a phrase or entity span: the annotator found none "
                "(data.knowledge; --num-batches for more)\n")
