"""The package's import layers: every import goes to the importer's floor or below, there is
no import circle, and no module is over 500 lines. The floors are docs/design.md's module
map, so the design page stays true."""

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "specdec_jax"
MAX_LINES = 500


def floors() -> dict[str, int]:
  """{path prefix: floor} from the rows of docs/design.md's module map."""
  table = {}
  text = (ROOT / "docs" / "design.md").read_text()
  section = text.split("## Module map", 1)[1].split("\n## ", 1)[0]
  for line in section.splitlines():
    match = re.match(r"\|\s*(\d+)\s*\|([^|]*)\|", line)
    if match:
      for path in re.findall(r"`(specdec_jax/[^`]*)`", match.group(2)):
        table[path] = int(match.group(1))
  return table


def module_name(path: pathlib.Path) -> str:
  parts = path.relative_to(ROOT).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def floor_of(path: pathlib.Path, table: dict[str, int]) -> int:
  rel = path.relative_to(ROOT).as_posix()
  matches = [prefix for prefix in table if rel == prefix or (prefix.endswith("/")
                                                               and rel.startswith(prefix))]
  if not matches:
    raise AssertionError(f"{rel} is on no floor of docs/design.md's module map")
  return table[max(matches, key=len)]


def imports(path: pathlib.Path) -> set[str]:
  """The package modules `path` imports, anywhere in it (functions included)."""
  found = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
      # `from pkg import sub` imports the module pkg.sub; `from pkg import name`, pkg
      names = [f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in MODULES
               else node.module for alias in node.names]
    else:
      continue
    found |= {name for name in names if name in MODULES}
  return found - {module_name(path)}


GRAPH = {name: imports(path) for name, path in MODULES.items()}


def test_every_module_has_a_floor():
  table = floors()
  assert table, "docs/design.md has no module map"
  for path in MODULES.values():
    floor_of(path, table)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_upward_import(name):
  table = floors()
  own = floor_of(MODULES[name], table)
  upward = {other: floor_of(MODULES[other], table) for other in GRAPH[name]
            if floor_of(MODULES[other], table) > own}
  assert not upward, f"{name} (floor {own}) imports from higher floors: {upward}"


def test_no_import_circle():
  state: dict[str, int] = {}  # 1 on the current path, 2 done

  def visit(name, path):
    state[name] = 1
    for other in sorted(GRAPH[name]):
      if state.get(other) == 1:
        cycle = path[path.index(other):] + [other]
        raise AssertionError("import circle: " + " -> ".join(cycle))
      if other not in state:
        visit(other, path + [other])
    state[name] = 2

  for name in sorted(GRAPH):
    if name not in state:
      visit(name, [name])


def test_no_module_over_500_lines():
  long = {name: n for name, path in MODULES.items()
          if (n := len(path.read_text().splitlines())) > MAX_LINES}
  assert not long, f"modules over {MAX_LINES} lines: {long}"
