"""`bert-jax analyze change`: how much each layer changed from a pretrained to a fine-tuned checkpoint
(Kovaleva et al. 2019 found most of the change in the last layers).

Per layer:
  attention  the mean over inputs and heads of the cosine distance 1 - <A, A'> / (|A| |A'|) between
             the two models' attention maps of the same input (real tokens only)
  weights    the cosine distance between the layer's parameters, all of them flattened into one vector
Writes change.json and change.png.
"""
from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax import workdir
from bert_jax.analysis import inputs, plots
from bert_jax.errors import UserError


def cosine_distance(a: np.ndarray, b: np.ndarray) -> float:
  a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
  return float(1.0 - a @ b / max(np.linalg.norm(a) * np.linalg.norm(b), 1e-30))


def flat(tree) -> np.ndarray:
  return np.concatenate([np.ravel(np.asarray(x)) for x in jax.tree.leaves(tree)])


@jax.jit
def attention_distance(a: jax.Array, b: jax.Array, attention_mask: jax.Array, example_weight: jax.Array
                       ) -> jax.Array:
  """Summed over the batch's examples and heads, per layer: [L]; a, b: [L, B, N, T, T]."""
  w = (attention_mask[:, :, None] * attention_mask[:, None, :]).astype(jnp.float32)[None, :, None]
  dot = jnp.sum(a * b * w, axis=(-2, -1))
  norms = jnp.sqrt(jnp.sum(a * a * w, axis=(-2, -1)) * jnp.sum(b * b * w, axis=(-2, -1)))
  distance = 1.0 - dot / jnp.maximum(norms, 1e-30)
  return jnp.einsum("lbn,b->l", distance, example_weight)


def _check_same(a: inputs.Subject, b: inputs.Subject) -> None:
  keys = ("num_layers", "num_heads", "hidden_size", "share_layers", "pruned_heads")
  diffs = [f"{k}: {getattr(a.config, k)!r} vs {getattr(b.config, k)!r}" for k in keys
           if getattr(a.config, k) != getattr(b.config, k)]
  if diffs:
    raise UserError(f"{a.path} and {b.path} are different architectures ({'; '.join(diffs)})")


def analyze_change(pretrained: str, fine_tuned: str, text: str, out_dir: str, *, max_inputs: int = 200,
                   max_length: int = 128, batch_size: int = 16) -> dict:
  plots.pyplot()
  before, after = inputs.load_subject(pretrained), inputs.load_subject(fine_tuned)
  _check_same(before, after)
  inputs.check_length(max_length, after.config)
  rows = inputs.read_lines(text, max_inputs)
  total = 0.0
  for batch in inputs.batches(inputs.encode(after.tokenizer, rows, max_length), batch_size):
    batch = inputs.as_jnp(batch)
    a = inputs.run(before.config, before.params, batch).attentions
    b = inputs.run(after.config, after.params, batch).attentions
    total = total + np.asarray(attention_distance(a, b, batch["attention_mask"], batch["example_weight"]))
  heads = np.array([len(after.config.kept_heads(i)) for i in range(after.config.num_layers)])
  layers = range(after.config.num_layers)
  report = {
      "pretrained": pretrained, "fine_tuned": fine_tuned, "inputs": len(rows),
      # Pruned heads are all-zero maps in both models: they are left out of the mean.
      "attention_cosine_distance": (total / (len(rows) * heads) - (after.config.num_heads - heads) /
                                    heads).tolist(),
      "weight_cosine_distance": [cosine_distance(flat(inputs.layer_params(before.params, before.config, i)),
                                                 flat(inputs.layer_params(after.params, after.config, i)))
                                 for i in layers],
      "embeddings_weight_cosine_distance": cosine_distance(flat(before.params["embeddings"]),
                                                           flat(after.params["embeddings"])),
  }
  workdir.create(out_dir, "--out")
  workdir.write_text(os.path.join(out_dir, "change.json"), json.dumps(report, indent=1))
  plots.lines([i + 1 for i in layers], {"attention maps": report["attention_cosine_distance"],
                             "weights": report["weight_cosine_distance"]},
              os.path.join(out_dir, "change.png"), "layer", "cosine distance", "pretrained -> fine-tuned")
  return report
