"""Test functions that build the whole main window, and the budget they are kept within.

Run from the repository root (``packaging/test.sh`` does, before pytest)::

    python packaging/window_tests.py            # the count, the budget, exit 1 over it
    python packaging/window_tests.py --files    # and the count per test file

A feature is tested at the seam it uses (its controller, dialog or widget on ``AppServices``, docs/testing.md);
the whole ``MainWindow`` is for what is about the window. A test function counts when it builds one: in its own
body, through a fixture it takes (by parameter or ``usefixtures``, its module's ``pytestmark`` included), or
through a function of its own file that does, each followed to the end. Fixtures are matched by name, so a
helper's parameter that shares a window fixture's name counts too: name such parameters otherwise. Children
run as separate processes (``child_*.py``) are not test functions and do not count.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUDGET = 60
WINDOW = "MainWindow"


@dataclass
class _Function:
    """A function of a test file: the names it takes (parameters and ``usefixtures``), the functions of its own
    file it calls, and whether its body builds the window itself."""

    takes: set[str]
    calls: set[tuple[str, str]]
    builds: bool
    is_fixture: bool
    is_test: bool
    where: tuple[str, str]


def _used_fixtures(node: ast.AST) -> set[str]:
    """The names in ``pytest.mark.usefixtures(...)`` calls under ``node``."""
    if "usefixtures" not in ast.unparse(node):
        return set()
    return {c.value for c in ast.walk(node) if isinstance(c, ast.Constant) and isinstance(c.value, str)}


def _functions(path: Path, root: Path) -> list[_Function]:
    text = path.read_text()
    tree = ast.parse(text)
    rel = path.relative_to(root).as_posix()
    marked: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in node.targets):
            marked |= _used_fixtures(node.value)
    local = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef):
            continue
        takes = {a.arg for a in node.args.args} | {a.arg for a in node.args.kwonlyargs}
        for decorator in node.decorator_list:
            takes |= _used_fixtures(decorator)
        is_fixture = any(
            ast.unparse(d).split("(")[0] in ("pytest.fixture", "fixture") for d in node.decorator_list
        )
        is_test = node.name.startswith("test_") and not is_fixture
        if is_test:
            takes |= marked
        calls = {
            (rel, c.func.id)
            for c in ast.walk(node)
            if isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id in local
        }
        builds = any(
            isinstance(c, ast.Call) and getattr(c.func, "id", getattr(c.func, "attr", "")) == WINDOW
            for c in ast.walk(node)
        )
        found.append(_Function(takes, calls, builds, is_fixture, is_test, (rel, node.name)))
    return found


def window_tests(root: Path = ROOT) -> list[tuple[str, str]]:
    """(file, test function) of every test function under ``root``/tests that builds the whole main window."""
    functions = [f for path in sorted((root / "tests").rglob("*.py")) for f in _functions(path, root)]
    fixtures: dict[str, list[_Function]] = {}
    helpers: dict[tuple[str, str], _Function] = {}
    for function in functions:
        if function.is_fixture:
            fixtures.setdefault(function.where[1], []).append(function)
        elif not function.is_test:
            helpers[function.where] = function
    window_fixtures: set[str] = set()
    window_helpers: set[tuple[str, str]] = set()

    def reaches(function: _Function) -> bool:
        return (
            function.builds or bool(function.calls & window_helpers) or bool(function.takes & window_fixtures)
        )

    changed = True
    while changed:  # until no fixture or helper newly reaches a window
        changed = False
        for where, helper in helpers.items():
            if where not in window_helpers and reaches(helper):
                window_helpers.add(where)
                changed = True
        for name, defined in fixtures.items():
            if name not in window_fixtures and any(reaches(f) for f in defined):
                window_fixtures.add(name)
                changed = True
    return [f.where for f in functions if f.is_test and reaches(f)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", action="store_true", help="the count per test file")
    args = parser.parse_args(argv)
    found = window_tests()
    if args.files:
        for path, count in Counter(path for path, _ in found).most_common():
            print(f"{count:4d} {path}")
    verdict = "within" if len(found) <= BUDGET else "OVER"
    print(f"{len(found)} test functions build the whole main window ({verdict} the budget of {BUDGET})")
    return 0 if len(found) <= BUDGET else 1


if __name__ == "__main__":
    sys.exit(main())
