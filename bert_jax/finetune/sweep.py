"""Hyper-parameter sweeps: the grid lr x batch x epochs, each configuration run with several seeds,
searched by successive halving ("start many, stop early, continue some"; Jamieson and Talwalkar 2016,
as Dodge et al. 2020 recommend for fine-tuning seeds).

Rung k trains every surviving run to min_fraction * eta^k of its own schedule (the learning-rate
schedule is always the full run's, so a continued run is exactly the run that was never stopped), ranks
configurations by their mean best dev score over seeds, and keeps the best 1/eta for the next rung.
Ties (early rungs often leave every run at the majority class) are broken by the mean dev loss at
those best evaluations, and settings still tied (or tasks without a dev loss: SQuAD, NER) are kept so
that they spread over the grid, rather than in grid order.
The report gives per configuration the mean, median, standard deviation and maximum over seeds, the
expected best dev score of n runs for n = 1..seeds (Dodge et al. 2019, "Show your work": the expected
maximum of n draws from the seeds' scores), and a Welch t-test and a permutation test between the two
best configurations that reached the last rung. `sweep.vary_seed` picks the seed the sweep's seeds
set: all three streams (train.seed), or only the head's, the data order's or dropout's.
"""
from __future__ import annotations

import copy
import dataclasses
import itertools
import math

import ml_collections
import numpy as np

from bert_jax import pretrained, workdir as workdir_lib
from bert_jax.errors import UserError
from bert_jax.finetune.trainer import start, validate
from bert_jax.training import loop


@dataclasses.dataclass(frozen=True)
class Setting:
  learning_rate: float
  batch_size: int
  epochs: float

  @property
  def name(self) -> str:
    return f"lr{self.learning_rate:g}_bs{self.batch_size}_ep{self.epochs:g}"


def rung_fractions(min_fraction: float, eta: int) -> list[float]:
  """sweep.min_fraction in (0, 1] and sweep.eta >= 2 (the schema's ranges)."""
  fractions = [min_fraction]
  while fractions[-1] < 1:
    fractions.append(min(fractions[-1] * eta, 1.0))
  return fractions


SEED_KINDS = ("all", "head", "data", "dropout")


def run_config(config: ml_collections.ConfigDict, setting: Setting, seed: int) -> ml_collections.ConfigDict:
  """The run of `setting` and `seed`: the learning rate goes where train.mode reads it."""
  c = copy.deepcopy(config)
  rate_key = "learning_rate" if c.train.mode == "finetune" else "frozen_learning_rate"
  c.optimizer[rate_key] = setting.learning_rate
  c.train.batch_size, c.train.epochs = setting.batch_size, setting.epochs
  c.train["seed" if c.sweep.vary_seed == "all" else f"{c.sweep.vary_seed}_seed"] = seed
  return c


def expected_max(scores, n: int) -> float:
  """E[max of n draws with replacement from `scores`] (Dodge et al. 2019, eq. 1): with v_1 <= ... <= v_N,
  sum_i v_i ((i / N)^n - ((i - 1) / N)^n)."""
  v = np.sort(np.asarray(scores, np.float64))
  i = np.arange(1, len(v) + 1) / len(v)
  return float(np.sum(v * (i ** n - (i - 1 / len(v)) ** n)))


def _train_rung(config, workdir: str, setting: Setting, seed: int, fraction: float,
                signals: loop.StopRequests) -> tuple[float, float] | None:
  """(best dev score, dev loss at that evaluation) after training to `fraction` of the run (a run that
  finished at an earlier rung, by early stopping, as it finished); None when a signal stopped it."""
  location = workdir_lib.path(workdir) / setting.name / f"seed{seed}"
  finished = loop.read_finished(location)
  if finished is not None:
    return finished["best_score"], finished["best_loss"]
  run = start(run_config(config, setting, seed), location, signals=signals)
  best = run.advance(math.ceil(fraction * run.setup.num_steps))
  if run.stopped_by:
    return None
  if run.finished:
    run.finish()
  else:
    run.pause()
  return best, run.progress.best_loss


def _grid_position(settings: list[Setting]) -> dict[Setting, np.ndarray]:
  """Each setting as (log lr, log batch, epochs), every axis scaled to [0, 1] over the grid."""
  raw = np.array([[math.log(s.learning_rate), math.log(s.batch_size), s.epochs] for s in settings])
  span = raw.max(axis=0) - raw.min(axis=0)
  scaled = (raw - raw.min(axis=0)) / np.where(span > 0, span, 1.0)
  return dict(zip(settings, scaled))


def survivors(results: dict[Setting, dict], alive: list[Setting], keep: int) -> list[Setting]:
  """The `keep` best of `alive`: by mean dev score, then by lower mean dev loss; among settings still
  tied, each next one is the farthest (on the grid) from those already kept, the first the farthest
  from the tied group's centre; exact equals go in grid order."""
  def rank(setting):
    loss = np.mean(results[setting]["losses"])
    return -np.mean(results[setting]["scores"]), loss if np.isfinite(loss) else math.inf

  position, kept = _grid_position(alive), []
  for _, group in itertools.groupby(sorted(alive, key=rank), key=rank):
    group = list(group)
    centre = np.mean([position[s] for s in group], axis=0)
    while group and len(kept) < keep:
      anchors = [position[k] for k in kept] or [centre]
      pick = max(group, key=lambda s: min(np.linalg.norm(position[s] - a) for a in anchors))
      kept.append(pick)
      group.remove(pick)
  return kept


def successive_halving(config: ml_collections.ConfigDict, workdir: str, signals: loop.StopRequests
                       ) -> dict[Setting, dict] | None:
  """{setting: {"scores": best dev score per seed, "losses": dev loss there, "fraction": the last rung}};
  None when a signal stopped a run (its state saved: the same command continues the sweep)."""
  s = config.sweep
  settings = [Setting(float(lr), int(b), float(e))
              for lr, b, e in itertools.product(s.learning_rates, s.batch_sizes, s.epochs)]
  results, alive = {}, settings
  for rung, fraction in enumerate(rung_fractions(s.min_fraction, s.eta)):
    for index, setting in enumerate(alive):
      print(f"sweep rung {rung + 1} ({fraction:g} of each run): setting {index + 1}/{len(alive)} "
            f"{setting.name}, {len(s.seeds)} seeds", flush=True)
      runs = []
      for seed in s.seeds:
        runs.append(_train_rung(config, workdir, setting, seed, fraction, signals))
        if runs[-1] is None:
          return None
      scores, losses = zip(*runs)
      results[setting] = {"scores": list(scores), "losses": list(losses), "fraction": fraction}
      loss = f", dev loss {np.mean(losses):.4f}" if np.isfinite(np.mean(losses)) else ""
      print(f"rung {fraction:g}: {setting.name} mean dev score {np.mean(scores):.4f}{loss}", flush=True)
    alive = survivors(results, alive, max(1, math.ceil(len(alive) / s.eta)))
  return results


def summarize(results: dict[Setting, dict]) -> list[dict]:
  """One row per setting, the furthest-trained first, then by mean score."""
  rows = []
  for setting, r in results.items():
    scores = np.asarray(r["scores"], np.float64)
    loss = float(np.mean(r.get("losses", [math.nan])))
    rows.append({"setting": setting.name, "fraction": r["fraction"], "seeds": len(scores),
                 "mean": float(scores.mean()), "median": float(np.median(scores)),
                 "std": float(scores.std(ddof=1)) if len(scores) > 1 else 0.0, "max": float(scores.max()),
                 "dev_loss": loss if math.isfinite(loss) else None, "scores": scores.tolist(),
                 "expected_max": [expected_max(scores, n) for n in range(1, len(scores) + 1)]})
  return sorted(rows, key=lambda row: (-row["fraction"], -row["mean"]))


def _welch(a: list[float], b: list[float]) -> dict:
  """Welch's t and p; on scores without variance in either setting the test is undefined (its standard
  error is 0; scipy answers nan), and the result says so instead of a number."""
  from scipy import stats  # pylint: disable=import-outside-toplevel
  if np.var(a) == 0 and np.var(b) == 0:
    same = "the same score" if np.mean(a) == np.mean(b) else "one score each"
    return {"welch_t": None, "welch_p": None,
            "welch_undefined": f"every seed gives {same} ({np.mean(a):g} vs {np.mean(b):g}): no variance, "
                               "so the t statistic divides by a zero standard error"}
  welch = stats.ttest_ind(a, b, equal_var=False)
  return {"welch_t": float(welch.statistic), "welch_p": float(welch.pvalue)}


def compare(a: list[float], b: list[float], seed: int = 0) -> dict:
  """Two-sided p-values for "same mean": Welch's t-test and an exact/sampled permutation test."""
  from scipy import stats  # pylint: disable=import-outside-toplevel
  if len(a) < 2 or len(b) < 2:
    return {}
  permutation = stats.permutation_test((a, b), lambda x, y: np.mean(x) - np.mean(y), n_resamples=9999,
                                       alternative="two-sided", random_state=seed)
  return {**_welch(a, b), "permutation_p": float(permutation.pvalue)}


def format_table(rows: list[dict], test: dict) -> str:
  lines = [f"{'setting':<28}{'trained':>8}{'seeds':>6}{'mean':>9}{'median':>9}{'std':>9}{'max':>9}"]
  lines += [f"{r['setting']:<28}{r['fraction']:>8.2f}{r['seeds']:>6}{r['mean']:>9.4f}{r['median']:>9.4f}"
            f"{r['std']:>9.4f}{r['max']:>9.4f}" for r in rows]
  lines.append("expected best dev score of n runs (n = 1, 2, ...): " + rows[0]["setting"] + " "
               + " ".join(f"{v:.4f}" for v in rows[0]["expected_max"]))
  if test:
    welch = (f"Welch t={test['welch_t']:.3f} p={test['welch_p']:.4f}" if test["welch_p"] is not None
             else f"Welch's t-test undefined: {test['welch_undefined']}")
    lines.append(f"{rows[0]['setting']} vs {rows[1]['setting']}: {welch}; "
                 f"permutation p={test['permutation_p']:.4f}")
  else:
    lines.append("significance test: needs two settings at the last rung with at least 2 seeds each")
  return "\n".join(lines)


def sweep(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Runs the sweep, which holds `workdir` locked, and writes WORKDIR/sweep_results.json; returns
  {"table": the report, "stopped_by": None} or, when SIGTERM or Ctrl-C stopped one of its runs (saved:
  the same command continues), {"table": None, "stopped_by": "SIGTERM" or "Ctrl-C"}."""
  validate(config)
  if config.sweep.vary_seed not in SEED_KINDS:
    raise UserError(f"sweep.vary_seed={config.sweep.vary_seed!r} is not one of {SEED_KINDS}")
  pretrained.check_init_from(config)
  with loop.hold(workdir) as (run_dir, signals):
    results = successive_halving(pretrained.native_init_from(config, run_dir), workdir, signals)
    if results is None:
      return {"table": None, "stopped_by": signals.name}
    rows = summarize(results)
    finalists = [r for r in rows if r["fraction"] == rows[0]["fraction"]]
    test = compare(finalists[0]["scores"], finalists[1]["scores"]) if len(finalists) > 1 else {}
    workdir_lib.write_json(run_dir / "sweep_results.json", {"settings": rows, "test": test}, indent=1)
  return {"table": format_table(rows, test), "stopped_by": None}
