"""Private reaches into the vault and import cycles among the vault's modules, counted from the source.

Run from the repository root::

    python packaging/structure/vault_reaches.py            # the working tree
    python packaging/structure/vault_reaches.py --rev REV  # a commit (files read with ``git show REV:path``)
    python packaging/structure/vault_reaches.py --json     # the same numbers as JSON

What counts as a *private reach* (the rule, applied to the AST of every module of ``engine/vault`` except
the modules that own the objects, ``store.py`` for ``Vault`` and ``state.py`` for ``VaultState``, and,
counted apart, to ``engine/`` outside the vault, ``app/`` and ``tests/``): an attribute access
``OBJ._name`` (one leading underscore, not a dunder) whose object ``OBJ`` is a vault object, that is

* a name or an attribute chain ending in a vault name: ``vault``, ``target``, ``staged``, ``state``, or any
  name that ends in ``vault`` or ``_state`` (``vault._index``, ``self._vault._keys``,
  ``target._audit``); or
* a name annotated as ``Vault`` or ``VaultState`` (a parameter or an annotated assignment), or assigned
  from a call of one (``Vault(path)``, ``Vault.create(...)``, ``VaultState.open(path)``), in the enclosing
  function or module (``v: Vault`` or ``v = Vault(p)`` makes ``v._keys`` a reach).

Each access is one reach (``vault._audit._lock`` is one: the object of ``._lock`` is ``vault._audit``,
which is not a vault name). A module of the vault reading its *own* private names (``self._x`` in a class
it defines, a module-private function ``_copy_items``) is not a reach.

*Import cycles* are read from the graph of imports among ``engine.vault`` modules (``import
engine.vault.x``, ``from engine.vault.x import y``, ``from engine.vault import x`` where ``x`` is a module
of the package; the package ``__init__`` is left out, as it imports only to re-export). Each import is
``module`` (at module level), ``function`` (inside a function: runs when called) or ``typing`` (under ``if
TYPE_CHECKING:``: never runs).

* *runtime cycles*: the elementary cycles of the graph of ``module`` and ``function`` imports, the ones
  that can bite at run time (an import order that works only by accident, a partially initialised module);
* *the circle*: the strongly connected components (more than one module) of the graph of all imports,
  ``typing`` included: a change in one of their modules may need any other.
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "engine.vault"
PACKAGE_DIR = "engine/vault"
#: The modules that own the vault's objects: their own private names are not reaches.
OWNERS = {"engine/vault/store.py", "engine/vault/state.py"}
VAULT_NAMES = {"vault", "target", "staged", "state"}
VAULT_TYPES = {"Vault", "VaultState"}
ELSEWHERE = ("engine", "app", "tests")


# -- reading sources ------------------------------------------------------------------------------------
def _list_files(rev: str | None, folder: str) -> list[str]:
    if rev is None:
        base = ROOT / folder
        return sorted(str(p.relative_to(ROOT)) for p in base.rglob("*.py")) if base.is_dir() else []
    out = subprocess.run(
        ["git", "-C", str(ROOT), "ls-tree", "-r", "--name-only", rev, "--", folder],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return sorted(line for line in out.splitlines() if line.endswith(".py"))


def _read(rev: str | None, path: str) -> str:
    if rev is None:
        return (ROOT / path).read_text(encoding="utf-8")
    return subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{rev}:{path}"], check=True, capture_output=True, text=True
    ).stdout


# -- private reaches -------------------------------------------------------------------------------------
def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _is_vault_name(name: str) -> bool:
    return name in VAULT_NAMES or name.endswith("vault") or name.endswith("_state")


def _annotation_names(node: ast.expr | None) -> set[str]:
    if node is None:
        return set()
    if isinstance(node, ast.Constant) and isinstance(node.value, str):  # "Vault" as a string annotation
        try:
            node = ast.parse(node.value, mode="eval").body
        except SyntaxError:
            return set()
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)
    }


class _Reaches(ast.NodeVisitor):
    """Collects (line, attribute) of every private reach into a vault object."""

    def __init__(self) -> None:
        self.found: list[tuple[int, str]] = []
        self._typed: list[set[str]] = [set()]  # names annotated as a vault type, per function scope

    def _typed_here(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
        args = node.args
        every = args.posonlyargs + args.args + args.kwonlyargs + [a for a in (args.vararg, args.kwarg) if a]
        return {a.arg for a in every if _annotation_names(a.annotation) & VAULT_TYPES}

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self._typed.append(self._typed[-1] | self._typed_here(node))
        self.generic_visit(node)
        self._typed.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Assign(self, node: ast.Assign) -> None:
        call = node.value
        if isinstance(call, ast.Call):
            func = call.func.value if isinstance(call.func, ast.Attribute) else call.func
            if isinstance(func, ast.Name) and func.id in VAULT_TYPES:
                self._typed[-1].update(t.id for t in node.targets if isinstance(t, ast.Name))
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if isinstance(node.target, ast.Name) and _annotation_names(node.annotation) & VAULT_TYPES:
            self._typed[-1].add(node.target.id)
        self.generic_visit(node)

    def _is_vault_object(self, node: ast.expr) -> bool:
        if isinstance(node, ast.Name):
            return _is_vault_name(node.id) or node.id in self._typed[-1]
        if isinstance(node, ast.Attribute):  # self._vault, self.state, app.vault...
            return _is_vault_name(node.attr.lstrip("_"))
        return False

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if _is_private(node.attr) and self._is_vault_object(node.value):
            self.found.append((node.lineno, node.attr))
        self.generic_visit(node)


def private_reaches(source: str) -> list[tuple[int, str]]:
    """(line, private attribute) of every reach into a vault object in one module's source."""
    visitor = _Reaches()
    visitor.visit(ast.parse(source))
    return visitor.found


# -- the import graph ------------------------------------------------------------------------------------
def _under_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.Module) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
    """Every import statement with its kind: ``module``, ``function`` or ``typing``."""

    def walk(node: ast.AST, kind: str) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                yield child, kind
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                yield from walk(child, "typing" if kind == "typing" else "function")
            elif isinstance(child, ast.If) and _under_type_checking(child.test):
                for stmt in child.body:
                    yield from walk(ast.Module(body=[stmt], type_ignores=[]), "typing")
                for stmt in child.orelse:
                    yield from walk(ast.Module(body=[stmt], type_ignores=[]), kind)
            else:
                yield from walk(child, kind)

    yield from walk(tree, "module")


def import_edges(sources: dict[str, str]) -> list[tuple[str, str, str]]:
    """(importer, imported, kind) among the package's modules (short names: ``store``, ``rekey``)."""
    modules = {Path(p).stem for p in sources if not p.endswith("__init__.py")}
    edges: set[tuple[str, str, str]] = set()
    for path, source in sources.items():
        me = Path(path).stem
        if me == "__init__":
            continue
        for stmt, kind in _imports(ast.parse(source)):
            targets: list[str] = []
            if isinstance(stmt, ast.Import):
                targets = [a.name for a in stmt.names]
            elif stmt.module == PACKAGE:
                targets = [f"{PACKAGE}.{a.name}" for a in stmt.names]
            elif stmt.module:
                targets = [stmt.module]
            for target in targets:
                if target.startswith(PACKAGE + "."):
                    name = target[len(PACKAGE) + 1 :].split(".")[0]
                    if name in modules and name != me:
                        edges.add((me, name, kind))
    return sorted(edges)


def _cycles(edges: list[tuple[str, str, str]]) -> tuple[list[list[str]], list[list[str]]]:
    runtime = nx.DiGraph([(a, b) for a, b, kind in edges if kind != "typing"])
    every = nx.DiGraph([(a, b) for a, b, _ in edges])
    cycles = sorted(sorted_cycle(c) for c in nx.simple_cycles(runtime))
    circles = sorted(sorted(c) for c in nx.strongly_connected_components(every) if len(c) > 1)
    return cycles, circles


def sorted_cycle(cycle: list[str]) -> list[str]:
    """A cycle written from its alphabetically first module, closed (``[a, b, a]``)."""
    start = cycle.index(min(cycle))
    turned = cycle[start:] + cycle[:start]
    return [*turned, turned[0]]


# -- the report ------------------------------------------------------------------------------------------
def vault_reaches(rev: str | None = None, *, elsewhere: tuple[str, ...] = ELSEWHERE) -> dict:
    """The numbers for the structure report, at ``rev`` (a git revision) or in the working tree (None);
    ``elsewhere`` names the folders whose reaches are counted apart (default ``engine``, ``app``, ``tests``).

    Returns a JSON-ready dict: ``private_reaches`` (total inside the vault's operation modules),
    ``reaches_by_module`` and ``reaches_by_name`` (where and which attributes), ``reaches`` (every one,
    ``module:line attribute``), ``private_reaches_elsewhere`` (the same rule over ``engine/`` outside the
    vault, ``app/`` and ``tests/``, by folder), ``runtime_cycles`` (each ``[a, b, ..., a]``),
    ``circles`` (each a sorted list of modules), ``circle_modules`` (modules in any circle) and
    ``imports`` (every edge ``importer -> imported (kind)``).
    """
    files = [p for p in _list_files(rev, PACKAGE_DIR) if p.count("/") == 2]  # the package, not below it
    sources = {p: _read(rev, p) for p in files}
    reaches: list[str] = []
    by_module: dict[str, int] = {}
    by_name: dict[str, int] = {}
    for path, source in sources.items():
        if path in OWNERS:
            continue
        for line, attr in private_reaches(source):
            reaches.append(f"{Path(path).stem}:{line} {attr}")
            by_module[Path(path).stem] = by_module.get(Path(path).stem, 0) + 1
            by_name[attr] = by_name.get(attr, 0) + 1
    outside: dict[str, int] = {}
    for folder in elsewhere:
        total = 0
        for path in _list_files(rev, folder):
            if path.startswith(PACKAGE_DIR + "/"):
                continue
            total += len(private_reaches(_read(rev, path)))
        outside[folder] = total
    edges = import_edges(sources)
    cycles, circles = _cycles(edges)
    return {
        "rev": rev or "working tree",
        "private_reaches": len(reaches),
        "reaches_by_module": dict(sorted(by_module.items(), key=lambda kv: (-kv[1], kv[0]))),
        "reaches_by_name": dict(sorted(by_name.items(), key=lambda kv: (-kv[1], kv[0]))),
        "reaches": reaches,
        "private_reaches_elsewhere": outside,
        "runtime_cycles": cycles,
        "circles": circles,
        "circle_modules": sum(len(c) for c in circles),
        "imports": [f"{a} -> {b} ({kind})" for a, b, kind in edges],
    }


def _print(report: dict) -> None:
    print(f"vault structure at {report['rev']}")
    print(f"  private reaches into the vault from its operation modules: {report['private_reaches']}")
    for module, n in report["reaches_by_module"].items():
        print(f"    {module:18} {n}")
    if report["reaches_by_name"]:
        names = ", ".join(f"{k} {v}" for k, v in report["reaches_by_name"].items())
        print(f"    by attribute: {names}")
    print(
        "  private reaches elsewhere: "
        + ", ".join(f"{k}/ {v}" for k, v in report["private_reaches_elsewhere"].items())
    )
    print(f"  runtime import cycles: {len(report['runtime_cycles'])}")
    for cycle in report["runtime_cycles"]:
        print("    " + " -> ".join(cycle))
    print(f"  circles (import SCCs, typing imports included): {len(report['circles'])}")
    for circle in report["circles"]:
        print(f"    {len(circle)} modules: {', '.join(circle)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rev", help="a git revision (default: the working tree)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    try:
        report = vault_reaches(args.rev)
    except subprocess.CalledProcessError as exc:
        print(f"error: git could not read revision {args.rev!r}: {exc.stderr.strip()}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
