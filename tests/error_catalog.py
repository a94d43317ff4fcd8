"""The troubleshooting page's catalog: every one-line error (`raise UserError(...)`) bert_jax can stop with,
read from the source, grouped by the module that raises it. Each message names the problem and the fix.

`python3 tests/error_catalog.py docs/troubleshooting.md` rewrites the block between START and END;
tests/test_docs_site.py checks the page is up to date, so a new error shows up there or fails the test.
"""
import ast
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = ("bert_jax", "configs", "data_pipelines")
START = "<!-- error catalog: start (python3 tests/error_catalog.py docs/troubleshooting.md) -->"
END = "<!-- error catalog: end -->"


def _text(node: ast.AST) -> str | None:
  """The message template: literal text as written, each f-string field as {expression}."""
  if isinstance(node, ast.Constant) and isinstance(node.value, str):
    return node.value
  if isinstance(node, ast.JoinedStr):
    return "".join(_text(v) if isinstance(v, ast.Constant) else "{" + ast.unparse(v.value) + "}"
                   for v in node.values)
  if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
    left, right = _text(node.left), _text(node.right)
    return None if left is None and right is None else (left or "{...}") + (right or "{...}")
  if isinstance(node, ast.IfExp):
    return _text(node.body) or _text(node.orelse)
  return None


def _is_user_error(call: ast.Call) -> bool:
  f = call.func
  return (isinstance(f, ast.Name) and f.id == "UserError") or (isinstance(f, ast.Attribute) and f.attr == "UserError")


def messages(path: str) -> list[str]:
  tree = ast.parse(open(path, encoding="utf-8").read(), path)
  found = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Call) and _is_user_error(node) and node.args:
      text = _text(node.args[0])
      found.append((node.lineno, " ".join(text.split()) if text else "{a message built at run time}"))
  return [text for _, text in sorted(found)]


def catalog() -> dict[str, list[str]]:
  """{module path: its messages in source order}, every module of SOURCES that raises UserError."""
  out = {}
  for top in SOURCES:
    for folder, dirs, files in os.walk(os.path.join(ROOT, top)):
      dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__")) and
                       not os.path.islink(os.path.join(folder, d)))
      for name in sorted(files):
        if name.endswith(".py"):
          path = os.path.join(folder, name)
          found = messages(path)
          if found:
            out[os.path.relpath(path, ROOT)] = found
  return out


def _escape(text: str) -> str:
  return text.replace("`", "'").replace("|", "\\|")


def markdown() -> str:
  lines = []
  for module, found in sorted(catalog().items()):
    lines += [f"### `{module}`", ""] + [f"- `{_escape(m)}`" for m in found] + [""]
  return "\n".join(lines).rstrip()


def with_catalog(page: str) -> str:
  pattern = re.compile(re.escape(START) + ".*?" + re.escape(END), re.S)
  if not pattern.search(page):
    raise SystemExit(f"the page has no {START} ... {END} block")
  return pattern.sub(lambda _: f"{START}\n{markdown()}\n{END}", page)


if __name__ == "__main__":
  target = sys.argv[1]
  with open(target, encoding="utf-8") as f:
    text = with_catalog(f.read())
  with open(target, "w", encoding="utf-8") as f:
    f.write(text)
