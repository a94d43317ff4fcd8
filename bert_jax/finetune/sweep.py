"""Hyper-parameter sweeps: the grid lr x batch x epochs, each configuration run with several seeds,
searched by successive halving ("start many, stop early, continue some"; Jamieson and Talwalkar 2016,
as Dodge et al. 2020 recommend for fine-tuning seeds).

Rung k trains every surviving run to min_fraction * eta^k of its own schedule (the learning-rate
schedule is always the full run's, so a continued run is exactly the run that was never stopped), ranks
configurations by their mean best dev score over seeds, and keeps the best 1/eta for the next rung.
The report gives per configuration the mean, median, standard deviation and maximum over seeds, and a
Welch t-test and a permutation test between the two best configurations that reached the last rung.
"""
from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import math
import os

import ml_collections
import numpy as np

from bert_jax.errors import UserError
from bert_jax.finetune.trainer import Run, validate


@dataclasses.dataclass(frozen=True)
class Setting:
  learning_rate: float
  batch_size: int
  epochs: float

  @property
  def name(self) -> str:
    return f"lr{self.learning_rate:g}_bs{self.batch_size}_ep{self.epochs:g}"


def rung_fractions(min_fraction: float, eta: int) -> list[float]:
  if not 0 < min_fraction <= 1 or eta < 2:
    raise UserError(f"sweep.min_fraction={min_fraction} must be in (0, 1] and sweep.eta={eta} >= 2")
  fractions = [min_fraction]
  while fractions[-1] < 1:
    fractions.append(min(fractions[-1] * eta, 1.0))
  return fractions


def run_config(config: ml_collections.ConfigDict, setting: Setting, seed: int) -> ml_collections.ConfigDict:
  c = copy.deepcopy(config)
  c.optimizer.learning_rate = setting.learning_rate
  c.train.batch_size, c.train.epochs, c.train.seed = setting.batch_size, setting.epochs, seed
  return c


def _train_rung(config, workdir: str, setting: Setting, seed: int, fraction: float) -> float:
  run = Run(run_config(config, setting, seed), os.path.join(workdir, setting.name, f"seed{seed}"))
  best = run.advance(math.ceil(fraction * run.setup.num_steps))
  if run.finished:
    run.finish()
  else:
    run.pause()
  return best


def successive_halving(config: ml_collections.ConfigDict, workdir: str
                       ) -> dict[Setting, dict]:
  """{setting: {"scores": best dev score per seed, "fraction": the last rung it ran}}."""
  s = config.sweep
  settings = [Setting(float(lr), int(b), float(e))
              for lr, b, e in itertools.product(s.learning_rates, s.batch_sizes, s.epochs)]
  results, alive = {}, settings
  for fraction in rung_fractions(s.min_fraction, s.eta):
    for setting in alive:
      scores = [_train_rung(config, workdir, setting, seed, fraction) for seed in s.seeds]
      results[setting] = {"scores": scores, "fraction": fraction}
      print(f"rung {fraction:g}: {setting.name} mean dev score {np.mean(scores):.4f}", flush=True)
    alive = sorted(alive, key=lambda x: -np.mean(results[x]["scores"]))[:max(1, math.ceil(len(alive) / s.eta))]
  return results


def summarize(results: dict[Setting, dict]) -> list[dict]:
  """One row per setting, the furthest-trained first, then by mean score."""
  rows = []
  for setting, r in results.items():
    scores = np.asarray(r["scores"], np.float64)
    rows.append({"setting": setting.name, "fraction": r["fraction"], "seeds": len(scores),
                 "mean": float(scores.mean()), "median": float(np.median(scores)),
                 "std": float(scores.std(ddof=1)) if len(scores) > 1 else 0.0, "max": float(scores.max()),
                 "scores": scores.tolist()})
  return sorted(rows, key=lambda row: (-row["fraction"], -row["mean"]))


def compare(a: list[float], b: list[float], seed: int = 0) -> dict[str, float]:
  """Two-sided p-values for "same mean": Welch's t-test and an exact/sampled permutation test."""
  from scipy import stats  # pylint: disable=import-outside-toplevel
  if len(a) < 2 or len(b) < 2:
    return {}
  welch = stats.ttest_ind(a, b, equal_var=False)
  permutation = stats.permutation_test((a, b), lambda x, y: np.mean(x) - np.mean(y), n_resamples=9999,
                                       alternative="two-sided", random_state=seed)
  return {"welch_t": float(welch.statistic), "welch_p": float(welch.pvalue),
          "permutation_p": float(permutation.pvalue)}


def format_table(rows: list[dict], test: dict[str, float]) -> str:
  lines = [f"{'setting':<28}{'trained':>8}{'seeds':>6}{'mean':>9}{'median':>9}{'std':>9}{'max':>9}"]
  lines += [f"{r['setting']:<28}{r['fraction']:>8.2f}{r['seeds']:>6}{r['mean']:>9.4f}{r['median']:>9.4f}"
            f"{r['std']:>9.4f}{r['max']:>9.4f}" for r in rows]
  if test:
    lines.append(f"{rows[0]['setting']} vs {rows[1]['setting']}: Welch t={test['welch_t']:.3f} "
                 f"p={test['welch_p']:.4f}; permutation p={test['permutation_p']:.4f}")
  else:
    lines.append("significance test: needs two settings at the last rung with at least 2 seeds each")
  return "\n".join(lines)


def sweep(config: ml_collections.ConfigDict, workdir: str) -> str:
  """Runs the sweep, writes WORKDIR/sweep_results.json, returns the table."""
  validate(config)
  results = successive_halving(config, workdir)
  rows = summarize(results)
  finalists = [r for r in rows if r["fraction"] == rows[0]["fraction"]]
  test = compare(finalists[0]["scores"], finalists[1]["scores"]) if len(finalists) > 1 else {}
  with open(os.path.join(workdir, "sweep_results.json"), "w", encoding="utf-8") as f:
    json.dump({"settings": rows, "test": test}, f, indent=1)
  return format_table(rows, test)
