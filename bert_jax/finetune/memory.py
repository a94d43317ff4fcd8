"""Fine-tuning over long inputs with XLNet's segment-level memory (`task.memory_segments`, Yang et al. 2019's
Transformer-XL recurrence, used at fine-tuning).

task.memory_segments = N > 0 makes each example's row N consecutive windows of data.max_seq_length tokens
(features.input_length: the task modules, predict and the trainer build rows that long). The model runs the
windows in order inside one step, each attending to the memory of the windows before it: the last
task.memory_len (0: the model's model.mem_len) states of each layer's input, without gradient
(models/xlnet.py: `window_len`, which this module sets; the saved config.json carries it, so evaluation,
predict and a continued run take the same path). XLNet's layout puts the text first and `<sep> <cls>` at the
end of the last window; a short text's left padding fills the first windows. A text longer than N windows keeps
its first N * max_seq_length - 2 tokens (a pair: longest-first truncation to N * max_seq_length - 3), where
without memory it kept the first max_seq_length - 2. Sequence heads read the last window's last token (XLNet's
summary); token heads read every window. Padding in the memory is masked, so a row's prediction does not depend
on how many windows of padding precede its text (Hugging Face's XLNet keeps its memory always visible; rows
without padding in memory give its numbers). N = 0: off, one window as before. `convert --to hf` exports the
weights and mem_len: transformers has no windows, its caller feeds them one at a time with `mems=`.
"""
from __future__ import annotations

import dataclasses

import ml_collections

from bert_jax.errors import UserError

HEADS = ("classification", "regression", "token")  # heads whose rows are whole texts (not SQuAD's windows)


def segments(config: ml_collections.ConfigDict) -> int:
  return int(config.task.get("memory_segments", 0) or 0)


def validate(config: ml_collections.ConfigDict) -> None:
  """What the config alone says: N >= 0, task.memory_len >= 0, plain fine-tuning, no length buckets."""
  n, mem_len = segments(config), int(config.task.get("memory_len", 0) or 0)
  if n < 0 or mem_len < 0:
    raise UserError(f"task.memory_segments={n} and task.memory_len={mem_len} must be >= 0 (0: off, the model's "
                    "mem_len)")
  if n and config.job != "finetune":
    raise UserError(f"task.memory_segments={n} is for `bert-jax finetune` (job finetune), not job {config.job!r}")
  if n and tuple(config.data.get("length_buckets", ())):
    raise UserError(f"task.memory_segments={n} runs whole windows of data.max_seq_length: set "
                    "data.length_buckets=() (buckets cut rows to other lengths)")


def model_config(config: ml_collections.ConfigDict, model, head: str):
  """The encoder's config with the windows task.memory_segments asks for (and task.memory_len), or without
  any (a fine-tuned checkpoint's windows do not carry over to a run without them); a family without segment
  memory (XLNet's window_len) is refused when N > 0."""
  n = segments(config)
  has_windows = any(f.name == "window_len" for f in dataclasses.fields(model))
  if not has_windows:
    if n:
      raise UserError(f"task.memory_segments={n}: segment memory is XLNet's (model.family='xlnet' or an XLNet "
                      f"init_from); this model's family is {getattr(model, 'family', type(model).__name__)!r}")
    return model
  if not n:
    return model.replace(window_len=0)
  if head not in HEADS:
    raise UserError(f"task.memory_segments={n} is for the {HEADS} heads; this task's head is {head!r} "
                    "(SQuAD windows its contexts with task.doc_stride instead)")
  mem_len = int(config.task.get("memory_len", 0) or 0) or model.mem_len
  if not mem_len:
    raise UserError(f"task.memory_segments={n} needs a memory: the model's mem_len is 0; set task.memory_len "
                    "(e.g. the window length, data.max_seq_length)")
  return model.replace(window_len=config.data.max_seq_length, mem_len=mem_len)
