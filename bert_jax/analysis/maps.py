"""`bert-jax analyze attention`: what each head attends to, over the inputs of a text file.

Writes to the output directory:
  attention.json          Clark et al.'s per-head statistics (statistics.py) and their per-layer means,
                          Kovaleva et al.'s pattern classes (patterns.py: the rule, each head's share of
                          inputs per class, its majority class) and Brunner et al.'s effective attention
                          (effective.py: Pearson correlation with raw attention by token length and layer)
  statistics.png          heatmaps [layer x head] of the statistics (attention mass on a 0..1 scale)
  special_tokens.png      attention to [CLS], [SEP] and punctuation by layer, each head a dot and the
                          layer mean a line (Clark et al.'s Fig. 2)
  patterns.png            each layer's mix of pattern classes, and each class's share per head
  effective_attention.png correlation of effective and raw attention against input length, per layer,
                          with the head dimension marked (below it the two are equal)
  attention_maps.png      every head's map for one sentence (--sentence, else the first input), tokens on
                          the axes
Figures number layers and heads from 1, as the papers do; the JSON's lists are indexed from 0.
Pruned heads (model.pruned_heads) are null in the JSON.
"""
from __future__ import annotations

import json
import os
from typing import Any

import jax.numpy as jnp
import numpy as np

from bert_jax import workdir
from bert_jax.analysis import effective, inputs, patterns, plots, statistics
from bert_jax.training import prune


def tolist(array: Any) -> Any:
  """A JSON-ready nested list, NaN as null."""
  return [tolist(x) for x in array] if np.ndim(array) else (None if np.isnan(array) else float(array))


def effective_correlations(subject: inputs.Subject, out, batch: dict) -> np.ndarray:
  """float[B, L, N]: correlation of each head's effective and raw attention (NaN for pruned heads)."""
  config, mask = subject.config, batch["attention_mask"]
  result = np.full((mask.shape[0], config.num_layers, config.num_heads), np.nan)
  for layer in range(config.num_layers):
    kept = np.asarray(config.kept_heads(layer))
    raw = out.attentions[layer][:, kept]
    eff = effective.effective_attention(raw, out.hidden_states[layer], mask,
                                        inputs.layer_params(subject.params, config, layer)["attention"])
    result[:, layer, kept] = np.asarray(effective.correlation(raw, eff, mask))
  return result


class _Totals:
  """Sums over batches: statistics, class counts, and correlations per length bin."""

  def __init__(self, subject: inputs.Subject, length_bin: int):
    self.subject, self.length_bin = subject, length_bin
    self.punctuation = jnp.asarray(statistics.punctuation_table(subject.tokenizer))
    self.stats, self.classes = None, 0.0
    self.bins: dict[int, list] = {}

  def add(self, batch: dict) -> None:
    out = inputs.run(self.subject.config, self.subject.params, batch)
    special = inputs.special_positions(batch["input_ids"], self.subject.tokenizer)
    self.stats = statistics.add(self.stats, statistics.head_sums(
        out.attentions, batch["input_ids"], batch["attention_mask"], batch["example_weight"], special["cls"],
        special["sep"], self.punctuation))
    features = patterns.pattern_features(out.attentions, batch["attention_mask"], batch["token_type_ids"],
                                         special["cls"] | special["sep"])
    weight = np.asarray(batch["example_weight"])
    self.classes = self.classes + patterns.class_counts(patterns.classify(*features), weight)
    correlations = effective_correlations(self.subject, out, batch)
    lengths = np.asarray(batch["attention_mask"]).sum(axis=1)
    for row in np.flatnonzero(weight > 0):
      self.bins.setdefault(int((lengths[row] - 1) // self.length_bin), []).append(correlations[row])

  def effective_report(self) -> list[dict]:
    report = []
    for b in sorted(self.bins):
      rows = np.stack(self.bins[b])
      report.append({"lengths": [b * self.length_bin + 1, (b + 1) * self.length_bin], "inputs": len(rows),
                     "correlation": float(np.nanmean(rows)),
                     "by_layer": tolist(np.nanmean(rows, axis=(0, 2)))})
    return report


def _report(subject: inputs.Subject, totals: _Totals, count: int) -> dict:
  pruned = ~prune.active_heads(subject.config)
  stats = {k: np.where(pruned, np.nan, v) for k, v in statistics.means(totals.stats).items()}
  shares = totals.classes / max(count, 1)
  majority = np.asarray(patterns.CLASSES)[np.argmax(shares, axis=0)].astype(object)
  majority[pruned] = None
  return {
      "checkpoint": subject.path, "inputs": count,
      "statistics": {k: tolist(v) for k, v in stats.items()},
      "statistics_by_layer": {k: tolist(np.nanmean(v, axis=1)) for k, v in stats.items()},
      "patterns": {"rule": patterns.RULE,
                   "shares": {c: tolist(np.where(pruned, np.nan, shares[i])) for i, c in enumerate(patterns.CLASSES)},
                   "majority": majority.tolist(),
                   "overall": {c: float(shares[i][~pruned].mean()) for i, c in enumerate(patterns.CLASSES)}},
      "effective_attention": {"by_length": totals.effective_report()},
  }


_STATISTIC_TITLES = {"cls": "[CLS]", "sep": "[SEP]", "punctuation": "punctuation", "previous": "previous token",
                     "next": "next token", "self": "the token itself", "entropy": "entropy"}


def _plot(report: dict, subject: inputs.Subject, sentence_row: dict, out_dir: str) -> None:
  stats = {_STATISTIC_TITLES[k]: np.asarray(report["statistics"][k], float) for k in statistics.STATISTICS}
  masses = {name: (0.0, 1.0) for name in stats if name != "entropy"}  # shares of a query's attention
  plots.heatmaps(stats, os.path.join(out_dir, "statistics.png"), "what each head attends to (mean over inputs)",
                 limits=masses, units={**{name: "attention mass" for name in masses}, "entropy": "nats"})
  plots.per_layer({_STATISTIC_TITLES[k]: np.asarray(report["statistics"][k], float)
                   for k in ("cls", "sep", "punctuation")},
                  os.path.join(out_dir, "special_tokens.png"), "attention to special tokens", "mean attention")
  plots.class_shares({k: np.asarray(v, float) for k, v in report["patterns"]["shares"].items()},
                     os.path.join(out_dir, "patterns.png"), "attention pattern classes (patterns.RULE)")
  plots.effective_by_length(report["effective_attention"]["by_length"], subject.config.head_dim,
                            os.path.join(out_dir, "effective_attention.png"))
  out = inputs.run(subject.config, subject.params, inputs.as_jnp(sentence_row))
  n = int(sentence_row["attention_mask"][0].sum())
  tokens = [subject.tokenizer.id_to_token(int(i)) for i in sentence_row["input_ids"][0][:n]]
  plots.attention_grid(np.asarray(out.attentions[:, 0, :, :n, :n]), tokens,
                       os.path.join(out_dir, "attention_maps.png"))


def analyze_attention(checkpoint: str, text: str, out_dir: str, *, max_inputs: int = 1000,
                      max_length: int = 128, batch_size: int = 16, sentence: str = "",
                      length_bin: int = 8) -> dict:
  """Runs the three analyses over `text` and writes attention.json and the plots into `out_dir`."""
  plots.pyplot()
  subject = inputs.load_subject(checkpoint)
  inputs.check_length(max_length, subject.config)
  rows = inputs.read_lines(text, max_inputs)
  features = inputs.encode(subject.tokenizer, rows, max_length)
  totals = _Totals(subject, length_bin)
  num_batches = -(-len(rows) // batch_size)
  for i, batch in enumerate(inputs.batches(features, batch_size)):
    totals.add(inputs.as_jnp(batch))
    if (i + 1) % 10 == 0 or i + 1 == num_batches:
      print(f"analyze attention: batch {i + 1}/{num_batches}", flush=True)
  report = _report(subject, totals, len(rows))
  workdir.create(out_dir, "--out")
  row = inputs.encode(subject.tokenizer, [(sentence, None)] if sentence else rows[:1], max_length)
  _plot(report, subject, row, out_dir)
  workdir.write_text(os.path.join(out_dir, "attention.json"), json.dumps({"text": text, **report}, indent=1))
  return report
