"""The output contract (FEATURES), and the last stage that meets it: unmasked rows -> masked, padded batches.

Rows arrive as padded arrays with, per row, its shard and its mask counter; the masks are drawn in
TensorFlow (masking.py) from keys of (seeds, shard, counter), so they are the same in any batch,
on any host count and with any number of threads.
"""
from __future__ import annotations

import collections
import dataclasses

import numpy as np

from bert_jax.data_pipelines import span_corruption
from bert_jax.data_pipelines.knowledge import split_tags
from bert_jax.data_pipelines.masking import MaskingConfig, mask_batch, predictions_per_seq, rates_at, row_keys
from bert_jax.data_pipelines.shuffling import shuffle_trigrams, trigram_slots
from bert_jax.data_pipelines.tftools import tf

# name: (dtype, shape, meaning)
FEATURES = {
    "input_ids": ("int32", ("B", "T"), "[CLS] A [SEP] (B [SEP]) with masked positions replaced "
                  "(and trigrams shuffled: TRIGRAM_FEATURES); 0 ([PAD]) after"),
    "input_mask": ("int32", ("B", "T"), "1 on real tokens, 0 on padding"),
    "segment_ids": ("int32", ("B", "T"), "token type: 0 for [CLS] A [SEP], 1 for B [SEP], 0 on padding"),
    "masked_lm_positions": ("int32", ("B", "P"), "positions of the predictions, ascending; 0 on unused slots"),
    "masked_lm_ids": ("int32", ("B", "P"), "original token ids at those positions; 0 on unused slots"),
    "masked_lm_weights": ("float32", ("B", "P"), "1.0 for a real prediction, 0.0 for an unused slot"),
    "next_sentence_labels": ("int32", ("B",), "NSP: 1 = random B, 0 = actual next; SOP: 1 = swapped; "
                             "SSO: 0 = B follows A, 1 = B precedes A, 2 = random B; "
                             "0 without a sentence objective"),
}
PACKING_FEATURES = {
    "document_ids": ("int32", ("B", "T"), "1..k for the k documents packed in the row, 0 on padding; "
                     "attend only where equal and non-zero"),
    "position_ids": ("int32", ("B", "T"), "position inside its own document, from 0; 0 on padding"),
}
SPAN_FEATURES = {
    "masked_lm_span_left": ("int32", ("B", "P"), "position of the token just before the prediction's span"),
    "masked_lm_span_right": ("int32", ("B", "P"), "position of the token just after the prediction's span"),
    "masked_lm_span_offset": ("int32", ("B", "P"), "0-based index of the prediction inside its span"),
}
TRIGRAM_FEATURES = {  # data.trigram_shuffle_rate > 0 (shuffling.py); S = shuffling.trigram_slots(T, rate)
    "shuffled_positions": ("int32", ("B", "S"), "positions of the shuffled trigrams' tokens, ascending; 0 on "
                           "unused slots"),
    "shuffled_ids": ("int32", ("B", "S"), "original token ids at those positions; 0 on unused slots"),
    "shuffled_weights": ("float32", ("B", "S"), "1.0 for a shuffled position, 0.0 for an unused slot"),
}
KNOWLEDGE_FEATURES = {  # data.masking=knowledge (knowledge.py)
    "knowledge_units": ("int32", ("B", "T"), "the annotator's spans: 2L-1 on the first token of a level-L span "
                        "(1 phrase, 2 entity), 2L on its other tokens, 0 elsewhere"),
}
ERNIE_FEATURES = {  # data.example_builder="ernie" (ernie.py); -1: no label
    "capital_labels": ("int32", ("B", "T"), "1 when the token's word starts with a capital letter, else 0; -1 on "
                       "[CLS], [SEP] and padding"),
    "token_doc_labels": ("int32", ("B", "T"), "1 when the token appears in its document's sentences outside the "
                         "row, else 0; -1 on [CLS], [SEP] and padding"),
    "reorder_labels": ("int32", ("B",), "sentence reordering: the pieces' order, one of ernie.REORDER_CLASSES "
                       "(0..8); -1 on a sentence-distance row"),
    "distance_labels": ("int32", ("B",), "sentence distance: 0 B follows A, 1 B elsewhere in A's document, 2 B "
                        "from another document; -1 on a reordering row"),
    "task_ids": ("int32", ("B",), "the row's task (training/objectives/ernie2.py); 0 here, set per step by the "
                 "schedule's TaskFeed"),
}
# What a row source hands to `Featurizer`: the unmasked rows and each row's mask identity.
ROW_FIELDS = ("ids", "length", "segment_ids", "label", "document_ids", "shard", "counter")


def feature_spec(data_cfg) -> dict:
  """The contract for this config: name -> (dtype, shape, meaning)."""
  if data_cfg.get("example_builder") == span_corruption.BUILDER:  # an encoder-decoder's rows (T5)
    return dict(span_corruption.FEATURES)
  spec = dict(FEATURES)
  if data_cfg.packing:
    spec.update(PACKING_FEATURES)
  if data_cfg.masking == "span":
    spec.update(SPAN_FEATURES)
  if data_cfg.trigram_shuffle_rate > 0:
    spec.update(TRIGRAM_FEATURES)
  if data_cfg.masking == "knowledge":
    spec.update(KNOWLEDGE_FEATURES)
  if data_cfg.example_builder == "ernie":
    spec.update(ERNIE_FEATURES)
  return spec


def feature_shapes(data_cfg, batch_size: int) -> dict:
  """The contract for this config with its sizes: name -> (dtype, shape) for `batch_size` rows."""
  sizes = {"B": batch_size, "T": data_cfg.max_seq_length, "P": predictions_per_seq(data_cfg),
           "S": trigram_slots(data_cfg.max_seq_length, data_cfg.trigram_shuffle_rate)}
  if data_cfg.get("example_builder") == span_corruption.BUILDER:
    sizes["U"] = span_corruption.target_length(data_cfg)
  return {name: (dtype, tuple(sizes[d] for d in dims)) for name, (dtype, dims, _) in feature_spec(data_cfg).items()}


def position_ids(document_ids):
  """Each token's position inside its own packed document (PACKING_FEATURES), from document_ids int32[B, T]."""
  t = tf()
  pos = t.range(t.shape(document_ids)[1])[None]
  starts = t.pad(document_ids[:, 1:] != document_ids[:, :-1], [[0, 0], [1, 0]]) | (pos == 0)
  start_of = t.transpose(t.scan(t.maximum, t.transpose(t.where(starts, pos, 0))))
  return t.where(document_ids > 0, pos - start_of, 0)


def _traced_featurize(masking: MaskingConfig, seeds: tuple, spec: dict, max_seq_length: int):
  """The tf.function that masks a batch of rows into the features of `spec`."""
  t = tf()
  width = max_seq_length

  def featurize(ids, length, segment_ids, label, document_ids, shard, counter, rates):
    keys = row_keys(seeds, shard, counter)
    tags = None
    if masking.strategy == "knowledge":  # rows of tagged ids (knowledge.py)
      ids, tags = split_tags(ids)
    masked = mask_batch(ids, length, keys, masking, tags, rates)
    if "shuffled_positions" in spec:
      masked.update(shuffle_trigrams(ids, length, masked, keys, masking))
    real = t.range(width)[None] < length[:, None]
    out = {**masked, "input_mask": t.cast(real, t.int32), "segment_ids": segment_ids,
           "next_sentence_labels": label, "document_ids": document_ids, "knowledge_units": tags}
    if "position_ids" in spec:
      out["position_ids"] = position_ids(document_ids)
    return {name: out[name] for name in spec if name not in ERNIE_FEATURES}

  rows = [t.TensorSpec([None, width], t.int32), t.TensorSpec([None], t.int32),
          t.TensorSpec([None, width], t.int32), t.TensorSpec([None], t.int32),
          t.TensorSpec([None, width], t.int32), t.TensorSpec([None], t.int64), t.TensorSpec([None], t.int64),
          t.TensorSpec([None], t.float64)]
  # No autograph: featurize and the masking it calls branch on Python values only, and converting them took
  # ~3.5 s of a process's first trace (0.6 s without; 2026-11-30), in each worker of `data prepare` too.
  return t.function(featurize, input_signature=rows, autograph=False)


def _masking_key(masking: MaskingConfig) -> tuple:
  """MaskingConfig's fields as a hashable key: its arrays by dtype, shape and bytes."""
  return tuple((f.name, (v.dtype.str, v.shape, v.tobytes()) if isinstance(v, np.ndarray) else v)
               for f in dataclasses.fields(masking) for v in [getattr(masking, f.name)])


# A run builds a Featurizer for its training and one for its held-out input, and every run in a process (tests,
# sweeps, a notebook) built them anew: ~0.5 s of tf.function tracing each (2026-11-29). The traced functions of
# the last few masking configurations are kept, keyed on everything `featurize` reads.
_TRACED: collections.OrderedDict = collections.OrderedDict()
_TRACED_KEEP = 16


class Featurizer:
  """Unmasked row batches (numpy, ROW_FIELDS) -> the contract's features (numpy), masked in TensorFlow."""

  def __init__(self, masking: MaskingConfig, seeds: tuple, spec: dict, max_seq_length: int):
    self._spec, self._masking = spec, masking
    key = (_masking_key(masking), tuple(int(s) for s in seeds), tuple(spec), max_seq_length)
    if key not in _TRACED:
      _TRACED[key] = _traced_featurize(masking, seeds, spec, max_seq_length)
      while len(_TRACED) > _TRACED_KEEP:
        _TRACED.popitem(last=False)
    self._fn = _TRACED[key]

  def __call__(self, rows: dict) -> dict:
    """rows: ROW_FIELDS, and `step` int64[N] (each row's batch: data.mask_rate_schedule's rate; 0 without)."""
    steps = rows.get("step", np.zeros(len(rows["length"]), np.int64))
    out = self._fn(*(rows[name] for name in ROW_FIELDS), rates_at(self._masking, steps))
    labels = {name: rows[name] for name in ERNIE_FEATURES if name in self._spec}  # built with the rows
    return {name: np.asarray(value) for name, value in {**out, **labels}.items()}
