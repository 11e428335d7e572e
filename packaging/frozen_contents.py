"""What the installable build holds, read from the files that decide it, for the checks that keep it whole.

The bundle (packaging/volsynth.spec, built by packaging/build.sh) holds the modules of its build environment
that the analysis reaches, less the spec's ``excludes``, plus the data folders of the spec's ``datas``. The
build environment holds only the product's run-time requirements (``[project].dependencies`` of
pyproject.toml, followed through each package's own requirements) and PyInstaller. So a module is missing
from the bundle when the spec excludes it or when no run-time requirement brings it: a development tool
(mypy, pytest...) can be importable in the development environment and still never ship.

Used by packaging/build.sh (``check-env``: the build environment holds nothing else) and by
tests/packaging/test_frozen_runtime.py (runs the product with every module the bundle lacks blocked)::

    python packaging/frozen_contents.py check-env    # exit 1, listing them, if extra packages are installed
    python packaging/frozen_contents.py absent       # the import names the bundle cannot hold, one a line
"""

from __future__ import annotations

import ast
import importlib.metadata as metadata
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "packaging" / "volsynth.spec"
PYPROJECT = ROOT / "pyproject.toml"
# Installers and the build tool: in the build environment, never imported by the product at run time.
BUILD_TOOLS = frozenset(
    {"pip", "setuptools", "wheel", "pyinstaller", "pyinstaller-hooks-contrib", "altgraph"}
)


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _spec_assignments(spec: Path = SPEC) -> dict[str, ast.expr]:
    tree = ast.parse(spec.read_text(), str(spec))
    found: dict[str, ast.expr] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            found[node.targets[0].id] = node.value
    return found


def spec_excludes(spec: Path = SPEC) -> list[str]:
    """The spec's ``excludes``: module names the analysis leaves out (a name excludes its submodules too)."""
    value = _spec_assignments(spec)["excludes"]
    return [str(name) for name in ast.literal_eval(value)]


def spec_data_folders(spec: Path = SPEC) -> list[tuple[Path, str]]:
    """The spec's ``datas`` as (source path, folder in the bundle); each source is
    ``os.path.join(ROOT, "part", ...)`` in the spec, ROOT being the repository root."""
    value = _spec_assignments(spec)["datas"]
    if not isinstance(value, ast.List):
        raise ValueError("packaging/volsynth.spec: datas is not a list literal")
    folders = []
    for item in value.elts:
        if not (isinstance(item, ast.Tuple) and len(item.elts) == 2):
            raise ValueError(
                f"packaging/volsynth.spec: datas entry {ast.unparse(item)} is not (source, dest)"
            )
        source, dest = item.elts
        if not (
            isinstance(source, ast.Call)
            and ast.unparse(source.func) == "os.path.join"
            and source.args
            and ast.unparse(source.args[0]) == "ROOT"
        ):
            raise ValueError(
                f"packaging/volsynth.spec: datas source {ast.unparse(source)} is not os.path.join(ROOT, ...)"
            )
        parts = [ast.literal_eval(arg) for arg in source.args[1:]]
        folders.append((ROOT.joinpath(*parts), ast.literal_eval(dest)))
    return folders


def _requirements_closure(roots: list[str], extras: dict[str, set[str]] | None = None) -> set[str]:
    """Normalized names of the installed distributions that ``roots`` (requirement strings) need, following
    each one's own requirements, with markers evaluated for this interpreter."""
    from packaging.requirements import Requirement

    needed: set[str] = set()
    queue = [(Requirement(text), {""}) for text in roots]
    wanted_extras = dict(extras or {})
    while queue:
        req, context_extras = queue.pop()
        if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in context_extras):
            continue
        name = _normalize(req.name)
        new_extras = set(req.extras) - wanted_extras.get(name, set())
        if name in needed and not new_extras:
            continue
        needed.add(name)
        wanted_extras.setdefault(name, set()).update(req.extras)
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            continue  # not installed here: nothing it brings can be imported either
        for text in dist.requires or ():
            queue.append((Requirement(text), {""} | wanted_extras[name]))
    return needed


def runtime_distributions(pyproject: Path = PYPROJECT) -> set[str]:
    """Normalized names of the distributions the product needs at run time (the build environment's
    contents, less the build tools), the project itself included."""
    project = tomllib.loads(pyproject.read_text())["project"]
    return _requirements_closure(list(project["dependencies"])) | {_normalize(project["name"])}


def absent_modules(spec: Path = SPEC, pyproject: Path = PYPROJECT) -> list[str]:
    """Import names the bundle cannot hold: the spec's excludes, and every top-level module installed here
    whose distributions are all outside the run-time requirements (dev, test and type-checking tools,
    optional extras)."""
    runtime = runtime_distributions(pyproject)
    absent = set(spec_excludes(spec))
    for module, dists in metadata.packages_distributions().items():
        if not module.isidentifier() or module in sys.stdlib_module_names:
            continue  # data folders in RECORD, or a package shadowing the standard library's (torchao's "test")
        if all(_normalize(d) not in runtime for d in dists):
            absent.add(module)
    return sorted(absent)


def extra_distributions(pyproject: Path = PYPROJECT) -> list[str]:
    """Installed distributions (``name version``) that neither the product's run time nor the build needs."""
    runtime = runtime_distributions(pyproject)
    build = _requirements_closure(["pyinstaller"])
    extra = []
    for dist in metadata.distributions():
        name = _normalize(dist.metadata["Name"] or "")
        if name and name not in runtime and name not in build and name not in BUILD_TOOLS:
            extra.append(f"{dist.metadata['Name']} {dist.version}")
    return sorted(set(extra))


def main(argv: list[str]) -> int:
    command = argv[0] if argv else ""
    if command == "check-env":
        extra = extra_distributions()
        if extra:
            print(
                "the build environment holds packages the product does not need at run time (a development tool "
                "there can change what the bundle ships); recreate it with only `pip install .[packaging]`:\n  "
                + "\n  ".join(extra),
                file=sys.stderr,
            )
            return 1
        print(f"build environment: only the product's run-time packages and PyInstaller ({sys.prefix})")
        return 0
    if command == "absent":
        print("\n".join(absent_modules()))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
