"""Coverage of unchanged lines: which lines both trees share, and which of them the suite ran before and not after.

Two coverage databases of the whole suite, one per tree (a checkout of the earlier commit and of the later one,
each measured the same way), and the git commits they were taken at. A line is *unchanged* when it stands in
the same file (same path) in both commits, inside a run of lines `difflib` matches between the two versions.
An unchanged line the earlier suite executed and the later one did not is *lost*; one the later suite
executes and the earlier did not is *gained*. Prints one line of totals and then each lost line
(`path:line (earlier line)  text`), or `--json` for the figures.

    python3 benchmarks/unchanged_coverage.py --before /work/cov/before/.coverage --before-rev f3b2173 \
        --after /work/cov/after/.coverage --after-rev HEAD --json

Files are matched by their path below the tree's root (the databases hold absolute paths; the root is the
directory that holds `bert_jax/`). Each database as issue 50's figures were taken (2026-11-29), in a checkout
of each commit, with a coverage rc file holding `[run] parallel = true`, `patch = subprocess` and
`source = bert_jax, data_pipelines`:

    COVERAGE_RCFILE=cov.rc COVERAGE_FILE=$OUT/.coverage PYTHONPATH=. python3 -m pytest -q -n 2 --dist loadfile \
        --cov --cov-config=cov.rc --cov-context=test --cov-report= tests
    cd $OUT && COVERAGE_FILE=$OUT/.coverage coverage combine --append --rcfile=cov.rc

(`--append`: the subprocesses' files join the suite's; without it, combine replaces the suite's data.)
"""
from __future__ import annotations

import argparse
import difflib
import json
import subprocess
import sys

import coverage

PACKAGES = ("bert_jax/", "data_pipelines/")


def _relative(path: str) -> str | None:
  for package in PACKAGES:
    at = path.rfind("/" + package)
    if at >= 0:
      return path[at + 1:]
  return None


def executed(data_file: str) -> dict[str, set[int]]:
  """Relative path -> the line numbers the suite executed."""
  data = coverage.CoverageData(basename=data_file)
  data.read()
  lines: dict[str, set[int]] = {}
  for path in data.measured_files():
    rel = _relative(path)
    if rel is not None:
      lines.setdefault(rel, set()).update(data.lines(path) or ())
  return lines


def source(rev: str, path: str) -> list[str] | None:
  shown = subprocess.run(["git", "show", f"{rev}:{path}"], capture_output=True, text=True)
  return shown.stdout.splitlines() if shown.returncode == 0 else None


def unchanged(old: list[str], new: list[str]) -> dict[int, int]:
  """1-based old line -> new line, for the lines inside matching runs."""
  matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
  mapping = {}
  for a, b, size in matcher.get_matching_blocks():
    for k in range(size):
      mapping[a + k + 1] = b + k + 1
  return mapping


def compare(before: dict[str, set[int]], before_rev: str, after: dict[str, set[int]], after_rev: str) -> dict:
  lost, gained, kept, shared_files, unchanged_lines = [], 0, 0, 0, 0
  for path in sorted(set(before) | set(after)):
    old, new = source(before_rev, path), source(after_rev, path)
    if old is None or new is None:
      continue
    shared_files += 1
    ran_before, ran_after = before.get(path, set()), after.get(path, set())
    for old_line, new_line in unchanged(old, new).items():
      unchanged_lines += 1
      if old_line in ran_before and new_line not in ran_after:
        lost.append({"path": path, "line": new_line, "before_line": old_line, "text": new[new_line - 1].strip()})
      elif old_line in ran_before:
        kept += 1
      elif new_line in ran_after:
        gained += 1
  return {"files_in_both": shared_files, "unchanged_lines": unchanged_lines, "executed_before_and_after": kept,
          "lost": len(lost), "gained": gained, "lost_lines": lost}


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--before", required=True, help="the earlier tree's combined .coverage file")
  parser.add_argument("--before-rev", required=True, help="the commit the earlier tree was at")
  parser.add_argument("--after", required=True, help="the later tree's combined .coverage file")
  parser.add_argument("--after-rev", default="HEAD", help="the commit the later tree was at")
  parser.add_argument("--json", action="store_true")
  args = parser.parse_args(argv)
  result = compare(executed(args.before), args.before_rev, executed(args.after), args.after_rev)
  if args.json:
    print(json.dumps(result, indent=1))
    return 0
  print(f"{result['files_in_both']} files in both, {result['unchanged_lines']} unchanged lines: "
        f"{result['executed_before_and_after']} executed before and after, {result['lost']} lost, "
        f"{result['gained']} gained")
  for row in result["lost_lines"]:
    print(f"{row['path']}:{row['line']} (was {row['before_line']})  {row['text']}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
