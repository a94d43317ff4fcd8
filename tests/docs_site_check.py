"""Checks a built documentation site (`mkdocs build --strict --site-dir SITE`): at least MIN_PAGES pages, every
page of mkdocs.yml's nav among them, and the API page naming every member of `bert_jax.__all__`.

Runs with only the docs extra installed (.ci/run builds the site in such an environment): it reads
`bert_jax.__all__` and the nav from the files, importing neither bert_jax nor yaml.

    python3 tests/docs_site_check.py SITE
"""
import ast
import html
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIN_PAGES = 12
API_PAGE = os.path.join("reference", "api", "index.html")


def public_api() -> list[str]:
  """`bert_jax.__all__`, read from bert_jax/__init__.py without importing it."""
  tree = ast.parse(open(os.path.join(ROOT, "bert_jax", "__init__.py"), encoding="utf-8").read())
  for node in tree.body:
    if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
      return list(ast.literal_eval(node.value))
  raise AssertionError("bert_jax/__init__.py has no __all__")


def nav_pages() -> list[str]:
  """The .md files mkdocs.yml's nav names (its `Title: path.md` lines)."""
  text = open(os.path.join(ROOT, "mkdocs.yml"), encoding="utf-8").read()
  nav = text[text.index("\nnav:"):]
  return re.findall(r"^\s*- [^:\n]+: (\S+\.md)\s*$", nav, re.M)


def built_page(site: str, page: str) -> str:
  """The HTML file mkdocs writes for a docs page (directory URLs: guides/x.md -> guides/x/index.html)."""
  stem = page[:-3]
  return os.path.join(site, "index.html" if stem == "index" else os.path.join(stem, "index.html"))


def problems(site: str) -> list[str]:
  found = []
  pages = [os.path.join(d, f) for d, _, files in os.walk(site) for f in files if f == "index.html"
           and not os.path.relpath(d, site).startswith(("search", "assets"))]
  if len(pages) < MIN_PAGES:
    found.append(f"{len(pages)} pages built, fewer than {MIN_PAGES}")
  found += [f"the nav's {page} was not built" for page in nav_pages()
            if not os.path.exists(built_page(site, page))]
  api = os.path.join(site, API_PAGE)
  if not os.path.exists(api):
    return found + [f"no API page ({API_PAGE})"]
  text = html.unescape(re.sub(r"<[^>]+>", " ", open(api, encoding="utf-8").read()))
  for name in public_api():
    # its heading (an id mkdocs gave it) and its rendered docstring: the name and more than the table's line
    if not re.search(rf'id="{name.lower()}"', open(api, encoding="utf-8").read()) or text.count(name) < 3:
      found.append(f"the API page does not document bert_jax.{name}")
  return found


if __name__ == "__main__":
  failed = problems(sys.argv[1])
  for line in failed:
    print("FAIL", line)
  print(f"{'FAIL' if failed else 'ok  '} the site in {sys.argv[1]}: {len(nav_pages())} nav pages, "
        f"API page naming {', '.join(public_api())}")
  sys.exit(1 if failed else 0)
