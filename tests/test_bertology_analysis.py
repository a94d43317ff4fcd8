"""The analyses' numbers against independent references: finite differences for head importance, a
NumPy SVD null-space projection for effective attention, hand-made maps for statistics and patterns."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.analysis import effective, finetuned, inputs, patterns, statistics
from bert_jax.finetune import heads, tasks
from bert_jax.finetune.objective import FinetuneObjective
from bert_jax.models.bert import BertModel
from bert_jax.models.config import ModelConfig

CONFIG = ModelConfig(vocab_size=60, hidden_size=16, num_layers=2, num_heads=4, intermediate_size=24,
                     max_position_embeddings=16, hidden_dropout=0.0, attention_dropout=0.0,
                     initializer_range=0.2, use_pooler=False, mlm_head=False, sentence_head="none")


def rows(n=6, t=12, seed=0):
  rng = np.random.RandomState(seed)
  lengths = rng.randint(6, t + 1, n)
  lengths[0] = t
  mask = (np.arange(t)[None] < lengths[:, None]).astype(np.int32)
  return {"input_ids": (rng.randint(5, 60, (n, t)) * mask).astype(np.int32), "attention_mask": mask,
          "token_type_ids": ((np.arange(t)[None] >= lengths[:, None] // 2) * mask).astype(np.int32),
          "example_weight": np.r_[np.ones(n - 1), 0.0].astype(np.float32),
          "label": rng.randint(0, 3, n).astype(np.int32)}


def init_like(model, seed, *args):
  """The init's distribution at the init's shapes, drawn by NumPy (N(0, initializer_range) weights, zero biases,
  unit LayerNorm scales): the init itself, run eagerly, compiled each of its many RNG ops on its own (~5 s)."""
  abstract = nn.meta.unbox(jax.eval_shape(model.init, jax.random.key(seed), *args)["params"])
  rng = np.random.default_rng(seed)

  def draw(path, x):
    name = jax.tree_util.keystr(path)
    if name.endswith("['bias']") or name.endswith("['scale']"):
      return np.full(x.shape, float(name.endswith("['scale']")), x.dtype)
    return (CONFIG.initializer_range * rng.standard_normal(x.shape)).astype(x.dtype)
  return jax.tree_util.tree_map_with_path(draw, abstract)


def fine_tuned():
  config = CONFIG.replace(use_pooler=True)
  model = heads.FinetuneModel(config, "classification", 3, "pooled", 0.0)
  features = rows()
  params = init_like(model, 0, *(jnp.asarray(features[k]) for k in ("input_ids", "attention_mask", "token_type_ids")))
  dev = tasks.EvalSet("dev", features, lambda out: {}, lambda directory, out: None)
  task = tasks.Task("toy", "classification", 3, None, [dev], [], ("accuracy",))
  return finetuned.FineTuned("toy", config, FinetuneObjective(model), params, task, batch_size=3)


def test_importance_matches_finite_differences():
  ft = fine_tuned()
  mask = np.ones((2, 4))
  mask[1, 2] = 0.0  # the derivative is also taken for a masked head
  got = finetuned.mean_abs_gradient(ft, mask)
  features, eps = ft.dev.features, 1e-2

  @jax.jit
  def losses(m):  # each example's cross-entropy, one example at a time, from the model's logits
    def one(row):
      logits = ft.objective.model.apply({"params": ft.params}, row["input_ids"][None], row["attention_mask"][None],
                                        row["token_type_ids"][None], head_mask=m)["logits"][0]
      return jax.nn.logsumexp(logits) - logits[row["label"]]
    return jax.lax.map(one, {k: jnp.asarray(v[:5]) for k, v in features.items()})

  want = np.zeros((2, 4))
  for layer in range(2):
    for head in range(4):
      step = np.zeros((2, 4))
      step[layer, head] = eps
      # The loss is smooth in the mask: central differences, one example at a time, then |.| and mean.
      per_example = (np.asarray(losses(mask + step), np.float64) - np.asarray(losses(mask - step))) / (2 * eps)
      want[layer, head] = np.mean(np.abs(per_example))
  print(got, want)
  np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-4)
  assert want.min() > 1e-3  # every head matters to this loss


def numpy_effective(a, e, wv, bv, wo, n):
  """A - A P_null(T) with T = (E W^V + b^V) W^O for one head, on the n real tokens, in float64."""
  t = (e[:n].astype(np.float64) @ wv + bv) @ wo
  u, s, _ = np.linalg.svd(t)
  rank = np.linalg.matrix_rank(t)
  null = u[:, rank:]
  a = a[:n, :n].astype(np.float64)
  return a - a @ null @ null.T, t


def test_effective_attention_matches_numpy_null_space():
  batch = {k: jnp.asarray(v) for k, v in rows(n=4, t=12, seed=2).items()}
  params = init_like(BertModel(CONFIG), 3, batch["input_ids"])
  out = inputs.run(CONFIG, params, batch)
  layer = 1
  attention = inputs.layer_params(params, CONFIG, layer)["attention"]
  got = np.asarray(effective.effective_attention(out.attentions[layer], out.hidden_states[layer],
                                                 batch["attention_mask"], attention))
  correlations = np.asarray(effective.correlation(out.attentions[layer], jnp.asarray(got), batch["attention_mask"]))
  e = np.asarray(out.hidden_states[layer])
  for b in range(4):
    n = int(batch["attention_mask"][b].sum())
    for h in range(4):
      a = np.asarray(out.attentions[layer, b, h])
      want, t = numpy_effective(a, e[b], np.asarray(attention["value"]["kernel"])[:, h],
                                np.asarray(attention["value"]["bias"])[h], np.asarray(attention["out"]["kernel"])[h], n)
      np.testing.assert_allclose(got[b, h, :n, :n], want, atol=2e-5)
      assert n == 12 or np.abs(got[b, h, :, n:]).max() == 0  # padding keys get nothing
      np.testing.assert_allclose(want @ t, a[:n, :n] @ t, atol=1e-4)  # same head output
      assert np.abs(want - a[:n, :n]).max() > 1e-3  # n > head dim 4: A is not identifiable
      np.testing.assert_allclose(correlations[b, h], np.corrcoef(a[:n, :n].ravel(), want.ravel())[0, 1], atol=1e-5)


def hand_made(kind, t=10):
  """One [T, T] map: [CLS] at 0, [SEP] at 5 and 9, segments 0..5 and 6..9."""
  special = np.isin(np.arange(t), [0, 5, 9])
  types = (np.arange(t) >= 6).astype(np.int32)
  a = np.zeros((t, t))
  for i in range(t):
    if kind == "vertical":
      a[i, [0, 5, 9]] = 1
    elif kind == "diagonal":
      a[i, max(i - 1, 0)] = 1
    elif kind == "vertical+diagonal":  # 0.4 to [CLS], 0.6 to itself
      a[i, 0] += 0.4
      a[i, i] += 0.6
    elif kind == "block":  # inside its segment, away from the diagonal
      keys = [j for j in range(t) if types[j] == types[i] and not special[j] and abs(i - j) > 1]
      a[i, keys or [i]] = 1
    else:  # spread over the other segment's words
      a[i, [j for j in range(t) if types[j] != types[i] and not special[j]]] = 1
  return a / a.sum(axis=1, keepdims=True), special, types


def test_pattern_classes_on_hand_made_maps():
  for kind in patterns.CLASSES:
    a, special, types = hand_made(kind)
    s, d, b = patterns.pattern_features(jnp.asarray(a, jnp.float32)[None, None, None], jnp.ones((1, 10), jnp.int32),
                                        jnp.asarray(types)[None], jnp.asarray(special)[None])
    assert patterns.CLASSES[int(patterns.classify(s, d, b).ravel()[0])] == kind, (kind, s, d, b)
  # A single-segment input has no block mass: the same map with one segment is heterogeneous.
  a, special, _ = hand_made("block")
  s, d, b = patterns.pattern_features(jnp.asarray(a, jnp.float32)[None, None, None], jnp.ones((1, 10), jnp.int32),
                                      jnp.zeros((1, 10), jnp.int32), jnp.asarray(special)[None])
  assert float(b.ravel()[0]) == 0 and patterns.CLASSES[int(patterns.classify(s, d, b).ravel()[0])] == "heterogeneous"


class _Vocab:
  special_ids = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4}
  vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", ".", "##,", "cat", "!?"]
  vocab_size = len(vocab)

  def id_to_token(self, i):
    return self.vocab[i]


def test_clark_statistics_on_hand_made_maps():
  table = statistics.punctuation_table(_Vocab())
  assert table.tolist() == [False] * 6 + [True, True, False, True]
  ids = np.array([[2, 5, 6, 8, 7, 3, 0, 0], [2, 8, 9, 3, 5, 8, 3, 0]], np.int32)
  mask = (ids > 0).astype(np.int32)
  n = mask.sum(axis=1)
  uniform = mask[:, None, :] / n[:, None, None] * np.ones((1, 8, 1))
  previous = np.stack([np.eye(8, k=-1) for _ in range(2)])
  previous[:, 0, 0] = 1
  attentions = np.stack([uniform, previous], axis=1)[None].astype(np.float32)  # [1, 2 examples, 2 heads, 8, 8]
  sums = statistics.head_sums(jnp.asarray(attentions), ids, mask, jnp.ones(2), jnp.asarray(ids == 2),
                              jnp.asarray(ids == 3), jnp.asarray(table))
  got = statistics.means(jax.device_get(sums))
  tokens = n.sum()
  np.testing.assert_allclose(got["cls"][0], [2 / tokens, 4 / tokens], rtol=1e-6)
  np.testing.assert_allclose(got["sep"][0, 0], (6 * 1 / 6 + 7 * 2 / 7) / tokens, rtol=1e-6)
  np.testing.assert_allclose(got["punctuation"][0, 0], (6 * 2 / 6 + 7 * 1 / 7) / tokens, rtol=1e-6)
  np.testing.assert_allclose(got["previous"][0], [(5 / 6 + 6 / 7) / 11, 1.0], rtol=1e-6)
  np.testing.assert_allclose(got["next"][0], [(5 / 6 + 6 / 7) / 11, 0.0], rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(got["self"][0], [(1 + 1) / tokens, 2 / tokens], rtol=1e-6)
  np.testing.assert_allclose(got["entropy"][0], [(6 * np.log(6) + 7 * np.log(7)) / tokens, 0.0], rtol=1e-6,
                             atol=1e-7)


@pytest.fixture
def figures(monkeypatch):
  """The figures the plots draw, kept open instead of written (matplotlib's Agg backend)."""
  pytest.importorskip("matplotlib")
  from bert_jax.analysis import plots
  drawn = []
  monkeypatch.setattr(plots, "_save", lambda fig, path: drawn.append(fig))
  yield plots, drawn
  plots.pyplot().close("all")


def _labels(ax, axis):
  return [t.get_text() for t in getattr(ax, f"get_{axis}ticklabels")()]


def test_figures_read_like_the_papers(figures):
  """Layers and heads numbered from 1 in whole numbers, colour bars with units, the tokens on the maps,
  dots that the legend explains, and the head dimension marked on the effective-attention plot."""
  plots, drawn = figures
  table = np.arange(12.0).reshape(3, 4) / 12
  table[1, 2] = np.nan  # a pruned head
  plots.heatmaps({"[CLS]": table, "entropy": 3 * table}, "unused.png", "title", limits={"[CLS]": (0, 1)},
                 units={"[CLS]": "attention mass", "entropy": "nats"})
  heat = drawn.pop()
  main_axes = [ax for ax in heat.axes if ax.get_title()]
  assert [ax.get_title() for ax in main_axes] == ["[CLS]", "entropy"]
  assert _labels(main_axes[0], "x") == ["1", "2", "3", "4"] and _labels(main_axes[0], "y") == ["1", "2", "3"]
  bars = [ax for ax in heat.axes if ax not in main_axes]
  assert [b.get_ylabel() for b in bars] == ["attention mass", "nats"] and bars[0].get_ylim() == (0, 1)
  assert "grey: pruned head" in heat._suptitle.get_text()  # pylint: disable=protected-access

  plots.per_layer({"[CLS]": table, "[SEP]": table / 2}, "unused.png", "special", "mean attention")
  ax = drawn.pop().axes[0]
  assert [t for t in ax.get_xticks()] == [1, 2, 3] and ax.get_xlim() == (0.5, 3.5)
  assert ax.get_legend().get_title().get_text() == "line: layer mean; dots: heads"
  assert len(ax.collections) == 2 and len(ax.collections[0].get_offsets()) == 12  # one dot per head

  tokens = ["[CLS]", "the", "cat", "[SEP]"]
  maps = np.full((2, 3, 4, 4), 0.25)
  plots.attention_grid(maps, tokens, "unused.png")
  grid = drawn.pop()
  panels = [ax for ax in grid.axes if ax.get_title()]
  assert len(panels) == 6 and panels[0].get_title() == "layer 1, head 1" and panels[-1].get_title() == "layer 2, head 3"
  assert _labels(panels[0], "y") == tokens and _labels(panels[3], "x") == tokens and _labels(panels[1], "y") == []
  assert [ax.get_ylabel() for ax in grid.axes if not ax.get_title()] == ["attention weight"]

  bins = [{"lengths": [1, 8], "by_layer": [1.0, 1.0], "correlation": 1.0},
          {"lengths": [65, 72], "by_layer": [0.7, 0.5], "correlation": 0.6}]
  plots.effective_by_length(bins, 64, "unused.png")
  ax = drawn.pop().axes[0]
  assert [line.get_xdata()[0] for line in ax.lines if line.get_linestyle() == "--"] == [64]
  assert "head dimension 64" in ax.texts[0].get_text() and ax.get_ylim() == (0.0, 1.05)
