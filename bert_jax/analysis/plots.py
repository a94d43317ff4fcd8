"""The PNG figures of the analyses (matplotlib with the Agg backend: no display needed), drawn the way
the papers draw them: layers and heads numbered from 1 (layer 1 next to the embeddings), a colour bar
with its unit on every heatmap, pruned heads in grey, shared scales where quantities compare.

matplotlib is the `analysis` extra: only these figures need it, so pretraining installs stay lean.
`pyplot()` is called before a long analysis starts, so a missing install fails at once, not at the end.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from bert_jax import workdir
from bert_jax.errors import require

_MISSING = "lightgrey"  # NaN cells: pruned heads
_MAX_TOKEN_LABELS = 40  # longer inputs label every k-th token


def pyplot():
  matplotlib = require("matplotlib", "analysis", "bert-jax analyze (its PNG plots)")
  matplotlib.use("Agg")
  return require("matplotlib.pyplot", "analysis", "bert-jax analyze (its PNG plots)")


def _save(fig, path: str) -> None:
  with workdir.atomic_path(path) as staged:
    fig.savefig(staged, dpi=100, format="png")
  pyplot().close(fig)


def _numbered(ax, axis: str, count: int, label: str) -> None:
  """Integer ticks 1..count (at most ~12 labelled) on `axis` of an image whose cells sit at 0..count-1."""
  step = max(1, -(-count // 12))
  positions = list(range(0, count, step))
  getattr(ax, f"set_{axis}ticks")(positions)
  getattr(ax, f"set_{axis}ticklabels")([str(p + 1) for p in positions], fontsize=7)
  getattr(ax, f"set_{axis}label")(label)


def _integer_layers(ax, num_layers: int) -> None:
  """x axis of a per-layer line plot: layers 1..L as integers."""
  step = max(1, -(-num_layers // 12))
  ax.set_xticks(list(range(1, num_layers + 1, step)))
  ax.set_xlim(0.5, num_layers + 0.5)
  ax.set_xlabel("layer")


def heatmaps(tables: dict[str, np.ndarray], path: str, title: str,
             limits: dict[str, tuple[float, float]] | None = None, units: dict[str, str] | None = None) -> None:
  """One [L, N] heatmap per table (layers down from 1, heads across from 1), side by side, each with a
  colour bar; `limits` fixes a table's colour range (shares and attention mass: 0..1), `units` labels it."""
  plt = pyplot()
  limits, units = limits or {}, units or {}
  fig, axes = plt.subplots(1, len(tables), figsize=(3.3 * len(tables), 3.8), squeeze=False)
  cmap = plt.get_cmap("viridis").with_extremes(bad=_MISSING)
  for ax, (name, table) in zip(axes[0], tables.items()):
    table = np.asarray(table, float)
    vmin, vmax = limits.get(name, (None, None))
    image = ax.imshow(table, cmap=cmap, aspect="auto", vmin=vmin, vmax=vmax, interpolation="nearest")
    ax.set_title(name, fontsize=10)
    _numbered(ax, "x", table.shape[1], "head")
    _numbered(ax, "y", table.shape[0], "layer")
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04).set_label(units.get(name, ""), fontsize=8)
  caption = f"{title}  (grey: pruned head)" if any(np.isnan(np.asarray(t, float)).any() for t in tables.values()) else title
  fig.suptitle(caption)
  fig.tight_layout()
  _save(fig, path)


def per_layer(per_head: dict[str, np.ndarray], path: str, title: str, ylabel: str) -> None:
  """Clark et al.'s Fig. 2: for each series, one dot per head (its mean over the inputs) at its layer,
  spread a little sideways, and the layer's mean over its heads as a line. per_head: {name: [L, N]}."""
  plt = pyplot()
  fig, ax = plt.subplots(figsize=(5.6, 3.8))
  num_layers = 0
  for k, (name, table) in enumerate(per_head.items()):
    table = np.asarray(table, float)
    num_layers, heads = table.shape
    layers = np.arange(1, num_layers + 1)
    spread = (np.arange(heads) - (heads - 1) / 2) / max(heads, 1) * 0.3 + (k - (len(per_head) - 1) / 2) * 0.08
    color = f"C{k}"
    ax.scatter((layers[:, None] + spread[None, :]).ravel(), table.ravel(), s=9, alpha=0.45, color=color,
               linewidths=0)
    ax.plot(layers, np.nanmean(table, axis=1), marker="o", color=color, label=name)
  _integer_layers(ax, num_layers)
  ax.set_ylim(bottom=0)
  ax.set_ylabel(ylabel)
  ax.set_title(title, fontsize=10)
  ax.legend(fontsize=7, title="line: layer mean; dots: heads", title_fontsize=7)
  fig.tight_layout()
  _save(fig, path)


def class_shares(shares: dict[str, np.ndarray], path: str, title: str) -> None:
  """Kovaleva et al.'s pattern classes: each layer's mix of classes (stacked bars, the mean share over
  its heads), then one heatmap per class of each head's share of inputs, all on the same 0..1 scale."""
  plt = pyplot()
  names = list(shares)
  tables = [np.asarray(shares[c], float) for c in names]
  fig, axes = plt.subplots(1, len(names) + 1, figsize=(3.0 * (len(names) + 1), 4.2), squeeze=False,
                           layout="constrained")
  bars = axes[0][0]
  num_layers = tables[0].shape[0]
  bottom = np.zeros(num_layers)
  for k, (name, table) in enumerate(zip(names, tables)):
    share = np.nan_to_num(np.nanmean(table, axis=1))
    bars.bar(np.arange(1, num_layers + 1), share, bottom=bottom, color=f"C{k}", label=name)
    bottom += share
  _integer_layers(bars, num_layers)
  bars.set_ylim(0, 1)
  bars.set_ylabel("share of maps")
  bars.set_title("classes by layer", fontsize=10)
  cmap = plt.get_cmap("viridis").with_extremes(bad=_MISSING)
  for k, (ax, name, table) in enumerate(zip(axes[0][1:], names, tables)):
    image = ax.imshow(table, cmap=cmap, aspect="auto", vmin=0, vmax=1, interpolation="nearest")
    ax.set_title(name, fontsize=10, color=f"C{k}")
    _numbered(ax, "x", table.shape[1], "head")
    _numbered(ax, "y", table.shape[0], "layer")
  fig.colorbar(image, ax=list(axes[0][1:]), fraction=0.02, pad=0.02).set_label("share of inputs", fontsize=8)
  fig.legend(*bars.get_legend_handles_labels(), loc="outside lower center", ncols=len(names), fontsize=8)
  fig.suptitle(title)
  _save(fig, path)


def effective_by_length(bins: list[dict], head_dim: int, path: str) -> None:
  """Brunner et al.'s identifiability plot: Pearson r between effective and raw attention against the
  input's length, one line per layer and their mean, with the head dimension marked: inputs no longer
  than it leave the value vectors' null space empty, so effective attention equals raw (r = 1)."""
  plt = pyplot()
  fig, ax = plt.subplots(figsize=(5.6, 3.8))
  lengths = [b["lengths"][1] for b in bins]
  by_layer = np.asarray([b["by_layer"] for b in bins], float)  # [bins, L]
  for layer in range(by_layer.shape[1]):
    ax.plot(lengths, by_layer[:, layer], color="C0", alpha=0.25 + 0.6 * layer / max(by_layer.shape[1] - 1, 1),
            linewidth=1, label=f"layer {layer + 1}" if by_layer.shape[1] <= 6 else None)
  ax.plot(lengths, [b["correlation"] for b in bins], color="k", marker="o", label="all layers")
  ax.axvline(head_dim, color="grey", linestyle="--", linewidth=1)
  ax.text(head_dim, 0.02, f"head dimension {head_dim}: shorter\ninputs have r = 1 (identifiable) ", fontsize=7,
          color="grey", va="bottom", ha="right")
  ax.set_xlim(0, max(lengths + [head_dim]) * 1.05)
  ax.set_ylim(min(0.0, float(np.nanmin(by_layer)) - 0.05), 1.05)
  ax.ticklabel_format(axis="y", useOffset=False)
  ax.set_xlabel("input length in tokens (end of each bin)")
  ax.set_ylabel("Pearson r (effective, raw)")
  ax.set_title("effective vs raw attention", fontsize=10)
  ax.legend(fontsize=7, loc="lower left")
  fig.tight_layout()
  _save(fig, path)


def _token_ticks(ax, axis: str, tokens: Sequence[str]) -> None:
  step = max(1, -(-len(tokens) // _MAX_TOKEN_LABELS))
  positions = list(range(0, len(tokens), step))
  getattr(ax, f"set_{axis}ticks")(positions)
  getattr(ax, f"set_{axis}ticklabels")([tokens[p] for p in positions], fontsize=5,
                                       rotation=90 if axis == "x" else 0)


def attention_grid(maps: np.ndarray, tokens: Sequence[str], path: str) -> None:
  """Every head's map for one input: maps [L, N, n, n] (rows: the attending token, columns: the token it
  attends to), a grid of layers (down, from 1) x heads (across), the tokens on the outer axes, and one
  colour bar for the attention weights (0..1)."""
  plt = pyplot()
  layers, heads = maps.shape[:2]
  side = 1.2 + 0.045 * len(tokens)
  fig, axes = plt.subplots(layers, heads, figsize=(side * heads + 1.2, side * layers + 0.8), squeeze=False)
  for i in range(layers):
    for h in range(heads):
      ax = axes[i][h]
      image = ax.imshow(maps[i, h], cmap="Blues", vmin=0, vmax=1, interpolation="nearest")
      ax.set_title(f"layer {i + 1}, head {h + 1}", fontsize=7)
      if h == 0:
        _token_ticks(ax, "y", tokens)
      else:
        ax.set_yticks([])
      if i == layers - 1:
        _token_ticks(ax, "x", tokens)
      else:
        ax.set_xticks([])
  fig.colorbar(image, ax=axes.ravel().tolist(), fraction=0.02, pad=0.01).set_label("attention weight", fontsize=8)
  fig.suptitle(" ".join(tokens)[:160] + "\nrows: the attending token; columns: the token it attends to", fontsize=8)
  _save(fig, path)


def lines(x: Sequence[float], series: dict[str, Sequence[float]], path: str, xlabel: str, ylabel: str,
          title: str) -> None:
  """Series against x; x = layers 1..L gets integer ticks."""
  plt = pyplot()
  fig, ax = plt.subplots(figsize=(5, 3.6))
  for name, y in series.items():
    ax.plot(list(x), [np.nan if v is None else v for v in y], marker="o", label=name)
  if xlabel == "layer":
    _integer_layers(ax, len(x))
  ax.set_xlabel(xlabel)
  ax.set_ylabel(ylabel)
  ax.set_title(title, fontsize=10)
  if len(series) > 1:
    ax.legend(fontsize=7)
  fig.tight_layout()
  _save(fig, path)
