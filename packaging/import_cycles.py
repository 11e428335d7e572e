"""Import circles in the product's code: every strongly connected component of the module import graph.

Run from the repository root (``packaging/test.sh`` does, after ``lint-imports``)::

    python packaging/import_cycles.py              # app and engine
    python packaging/import_cycles.py PACKAGE ...  # other top-level packages

The graph is grimp's (the one import-linter checks its contracts on), with the imports under ``if
TYPE_CHECKING:`` counted: a type-only import still ties the two modules together (a change in one may need
the other, and neither can be read or tested alone), and lint-imports' layer contracts read them as well.
Imports inside functions count too. What does not count is Python's implicit import of a package's
``__init__`` before its submodules: that is how packages load, not a dependency either module wrote.

Each circle is printed with the imports between its modules (``importer:line -> imported``), so the one to
cut is in front of the reader. Exits 1 when there is any circle, 0 when there is none.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import grimp
import networkx as nx

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("app", "engine")


def import_graph(packages: tuple[str, ...]) -> grimp.ImportGraph:
    """The import graph of ``packages`` (importable from ``sys.path``), TYPE_CHECKING imports included; no
    cache is written."""
    return grimp.build_graph(*packages, exclude_type_checking_imports=False, cache_dir=None)


def circles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Every strongly connected component of more than one module, each sorted, sorted by its first module."""
    edges = nx.DiGraph()
    for importer in graph.modules:
        for imported in graph.find_modules_directly_imported_by(importer):
            edges.add_edge(importer, imported)
    return sorted(sorted(c) for c in nx.strongly_connected_components(edges) if len(c) > 1)


def imports_within(graph: grimp.ImportGraph, circle: list[str]) -> list[str]:
    """The imports between the modules of ``circle``: ``importer:line -> imported``, one per import line."""
    members = set(circle)
    lines = []
    for importer in circle:
        for imported in sorted(graph.find_modules_directly_imported_by(importer) & members):
            for detail in graph.get_import_details(importer=importer, imported=imported):
                lines.append(f"{importer}:{detail['line_number']} -> {imported}  ({detail['line_contents']})")
    return lines


def report(packages: tuple[str, ...]) -> tuple[str, int]:
    """The text printed for ``packages`` and the number of circles found."""
    graph = import_graph(packages)
    found = circles(graph)
    names = ", ".join(packages)
    if not found:
        return f"no import circle in {names} ({len(graph.modules)} modules, TYPE_CHECKING imports counted)", 0
    text = [f"{len(found)} import circle(s) in {names} (TYPE_CHECKING imports counted):"]
    for circle in found:
        text.append(f"  {len(circle)} modules: {', '.join(circle)}")
        text.extend(f"    {line}" for line in imports_within(graph, circle))
    return "\n".join(text), len(found)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "packages", nargs="*", default=list(PACKAGES), help="top-level packages (default: app engine)"
    )
    args = parser.parse_args(argv)
    if str(ROOT) not in sys.path:  # this checkout's packages, not an installed copy
        sys.path.insert(0, str(ROOT))
    text, count = report(tuple(args.packages))
    print(text)
    return 1 if count else 0


if __name__ == "__main__":
    sys.exit(main())
