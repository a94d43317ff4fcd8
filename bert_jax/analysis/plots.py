"""The PNG figures of the analyses (matplotlib with the Agg backend: no display needed).

matplotlib is the `analysis` extra: only these figures need it, so pretraining installs stay lean.
`pyplot()` is called before a long analysis starts, so a missing install fails at once, not at the end.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from bert_jax import workdir
from bert_jax.errors import require


def pyplot():
  matplotlib = require("matplotlib", "analysis", "bert-jax analyze (its PNG plots)")
  matplotlib.use("Agg")
  return require("matplotlib.pyplot", "analysis", "bert-jax analyze (its PNG plots)")


def _save(fig, path: str) -> None:
  with workdir.atomic_path(path) as staged:
    fig.savefig(staged, dpi=100, format="png")


def heatmaps(tables: dict[str, np.ndarray], path: str, title: str) -> None:
  """One [L, N] heatmap per table (layers down, heads across), side by side."""
  plt = pyplot()
  fig, axes = plt.subplots(1, len(tables), figsize=(3.2 * len(tables), 3.6), squeeze=False)
  for ax, (name, table) in zip(axes[0], tables.items()):
    image = ax.imshow(np.asarray(table, float), cmap="viridis", aspect="auto")
    ax.set_title(name)
    ax.set_xticks(range(np.shape(table)[1]))
    ax.set_yticks(range(np.shape(table)[0]))
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    fig.colorbar(image, ax=ax, fraction=0.046)
  fig.suptitle(title)
  fig.tight_layout()
  _save(fig, path)
  plt.close(fig)


def attention_grid(maps: np.ndarray, tokens: Sequence[str], path: str) -> None:
  """Every head's map for one input: maps [L, N, n, n], a grid of layers x heads."""
  plt = pyplot()
  layers, heads = maps.shape[:2]
  fig, axes = plt.subplots(layers, heads, figsize=(1.6 * heads, 1.6 * layers), squeeze=False)
  for i in range(layers):
    for h in range(heads):
      ax = axes[i][h]
      ax.imshow(maps[i, h], cmap="Blues", vmin=0, vmax=1)
      ax.set_xticks([])
      ax.set_yticks([])
      if i == 0:
        ax.set_title(f"head {h}", fontsize=7)
      if h == 0:
        ax.set_ylabel(f"layer {i}", fontsize=7)
  fig.suptitle(" ".join(tokens)[:160], fontsize=8)
  fig.tight_layout()
  _save(fig, path)
  plt.close(fig)


def lines(x: Sequence[float], series: dict[str, Sequence[float]], path: str, xlabel: str, ylabel: str,
          title: str) -> None:
  plt = pyplot()
  fig, ax = plt.subplots(figsize=(5, 3.6))
  for name, y in series.items():
    ax.plot(list(x), [np.nan if v is None else v for v in y], marker="o", label=name)
  ax.set_xlabel(xlabel)
  ax.set_ylabel(ylabel)
  ax.set_title(title)
  if len(series) > 1:
    ax.legend(fontsize=7)
  fig.tight_layout()
  _save(fig, path)
  plt.close(fig)
