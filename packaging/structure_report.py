"""The structure report: four counts of things written in too many places, on any git revision.

Run from the repository root::

    python packaging/structure_report.py               # the working tree
    python packaging/structure_report.py --rev REV     # a commit (files read with ``git show REV:path``)

The same script on two revisions gives a before/after pair. Every count is read from the AST of the
product's code (``engine/`` and ``app/``; tests left out), by these rules:

* **Places per optimization setting.** The settings are the fields of ``OptimizationConfig`` in
  ``engine/api/optimization_config.py`` at that revision. A file mentions a setting when its AST holds
  ``OBJ.setting`` (not on ``torch``: ``torch.autocast`` is torch's), a keyword argument ``setting=``, a
  string ``"setting"`` or the string of its command-line flag ``"--setting-name"``. Words in comments and
  prose do not count, so a generic name (``attention``) is not counted from its English use.
* **Window attributes read by features.** In every ``install_*`` function under ``app/`` whose first
  parameter is ``window`` (the main window), the attributes read off it; in every one whose first
  parameter is ``services`` (the app's services, app/services), the attributes read off its field that is
  the main window (``services.parent``). Then, wherever it hands the window or the services on (an
  argument to a function or class defined in ``app/``), the same reads in that code off the parameter
  receiving it, or off ``self.NAME`` where ``__init__`` keeps it, or off a local name it is assigned to,
  following further hand-offs the same way. Added to those: reads of an attribute the main window has
  (``MainWindow``'s methods and class attributes, what its code sets on ``self`` or on a ``window``
  parameter) through ``X.window()``, ``X.parent()``, ``X.parentWidget()`` and the like, anywhere in
  ``app/`` outside the window's own code (``app/window/`` and the module of ``MainWindow``).
* **Private reaches into the vault.** ``vault_reaches(rev)`` of ``packaging/structure/vault_reaches.py``
  (its docstring has the rule): ``OBJ._name`` on a vault object from the vault's operation modules, and
  the same rule over the rest of the code.
* **Writers of a volume.** Functions that call ``nib.save`` / ``nibabel.save`` or ``.to_filename`` (the
  call sites), and the public functions that reach them through private helpers (the public wrappers: what
  a caller picks to write a volume). Calls are matched by the called name, so a wrapper list can include a
  function that calls a same-named function of another module.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import re
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CODE_FOLDERS = ("engine", "app")
CONFIG_PATH = "engine/api/optimization_config.py"
VAULT_REACHES = ROOT / "packaging" / "structure" / "vault_reaches.py"
MAIN_WINDOW_CLASS = "MainWindow"
WINDOW_PACKAGE = "app/window"  # the main window's own code: it may read the window
WINDOW_FIELD = "parent"  # the field of the app's services (app/services) that is the main window itself
PARENT_CALLS = frozenset({"window", "parent", "parentWidget", "nativeParentWidget", "topLevelWidget"})


# -- reading a revision -----------------------------------------------------------------------------------
class Source:
    """The Python files of ``engine/`` and ``app/`` at a git revision, or in the working tree (None)."""

    def __init__(self, rev: str | None):
        self.rev = rev
        if rev is None:
            listing = _git("ls-files", "--cached", "--others", "--exclude-standard", "--", *CODE_FOLDERS)
            paths = [p for p in listing if (ROOT / p).is_file()]
        else:
            paths = _git("ls-tree", "-r", "--name-only", rev, "--", *CODE_FOLDERS)
        self.paths = sorted(p for p in paths if p.endswith(".py"))
        self._trees: dict[str, ast.Module] = {}

    def text(self, path: str) -> str:
        if self.rev is None:
            return (ROOT / path).read_text(encoding="utf-8")
        return subprocess.run(
            ["git", "show", f"{self.rev}:{path}"], cwd=ROOT, check=True, capture_output=True, text=True
        ).stdout

    def tree(self, path: str) -> ast.Module:
        if path not in self._trees:
            self._trees[path] = ast.parse(self.text(path), filename=path)
        return self._trees[path]

    def under(self, folder: str) -> list[str]:
        return [p for p in self.paths if p.startswith(folder + "/")]


def _git(*args: str) -> list[str]:
    out = subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if line]


# -- places per optimization setting --------------------------------------------------------------------
def setting_names(source: Source) -> list[str]:
    """The fields of ``OptimizationConfig``, in their order."""
    for node in source.tree(CONFIG_PATH).body:
        if isinstance(node, ast.ClassDef) and node.name == "OptimizationConfig":
            return [
                item.target.id
                for item in node.body
                if isinstance(item, ast.AnnAssign)
                and isinstance(item.target, ast.Name)
                and "ClassVar" not in ast.unparse(item.annotation)
            ]
    raise SystemExit(f"no class OptimizationConfig in {CONFIG_PATH}")


def _rooted_at_torch(node: ast.expr) -> bool:
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name) and node.id == "torch"


def _mentions(tree: ast.Module, names: set[str]) -> set[str]:
    flags = {"--" + name.replace("_", "-"): name for name in names}
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in names and not _rooted_at_torch(node.value):
            found.add(node.attr)
        elif isinstance(node, ast.keyword) and node.arg in names:
            found.add(node.arg)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value in names:
                found.add(node.value)
            elif node.value in flags:
                found.add(flags[node.value])
    return found


def places_per_setting(source: Source) -> dict[str, list[str]]:
    names = setting_names(source)
    places: dict[str, list[str]] = {name: [] for name in names}
    for path in source.paths:
        for name in _mentions(source.tree(path), set(names)):
            places[name].append(path)
    return places


# -- window attributes read by features -----------------------------------------------------------------
@dataclass
class _Callable:
    path: str
    node: ast.FunctionDef | ast.ClassDef


def _definitions(source: Source) -> dict[str, list[_Callable]]:
    """Module-level functions and classes of ``app/`` by name."""
    found: dict[str, list[_Callable]] = defaultdict(list)
    for path in source.under("app"):
        for node in source.tree(path).body:
            if isinstance(node, ast.FunctionDef | ast.ClassDef):
                found[node.name].append(_Callable(path, node))
    return found


def _params(function: ast.FunctionDef) -> list[str]:
    args = function.args
    return [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]


def _receiving_param(
    function: ast.FunctionDef, call: ast.Call, holder: ast.expr, skip_self: bool
) -> str | None:
    """The parameter of ``function`` that receives ``holder`` in ``call``."""
    params = _params(function)
    positional = params[1:] if skip_self else params
    for index, arg in enumerate(call.args):
        if ast.dump(arg) == ast.dump(holder) and index < len(positional):
            return positional[index]
    for keyword in call.keywords:
        if keyword.arg is not None and ast.dump(keyword.value) == ast.dump(holder) and keyword.arg in params:
            return keyword.arg
    return None


@dataclass
class _Refs:
    """The names (parameters, local aliases) and ``self.NAME`` attributes that hold one object."""

    names: set[str] = field(default_factory=set)
    self_attrs: set[str] = field(default_factory=set)

    def holds(self, node: ast.expr) -> bool:
        if isinstance(node, ast.Name):
            return node.id in self.names
        return (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
            and node.attr in self.self_attrs
        )


@dataclass
class _WindowReads:
    attrs: set[str] = field(default_factory=set)
    handed_to: set[str] = field(default_factory=set)


def _is_window(node: ast.expr, window: _Refs, services: _Refs) -> bool:
    """``node`` is the main window: a reference to it, or the services' field that is the window."""
    return window.holds(node) or (
        isinstance(node, ast.Attribute) and node.attr == WINDOW_FIELD and services.holds(node.value)
    )


def _reads_in(
    bodies: list[ast.AST],
    window: _Refs,
    services: _Refs,
    definitions: dict[str, list[_Callable]],
    reads: _WindowReads,
    seen: set[tuple[str, str, str]],
) -> None:
    """Attributes read off the main window in ``bodies``: off ``window``, or off the ``WINDOW_FIELD`` of
    ``services`` (and off local names either is assigned to), following the calls that hand either on."""
    window = _Refs(set(window.names), set(window.self_attrs))
    services = _Refs(set(services.names), set(services.self_attrs))
    for body in bodies:  # local aliases: ``parent = services.parent``, ``app = services``
        for node in ast.walk(body):
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
            ):
                if _is_window(node.value, window, services):
                    window.names.add(node.targets[0].id)
                elif services.holds(node.value):
                    services.names.add(node.targets[0].id)
    for body in bodies:
        for node in ast.walk(body):
            if isinstance(node, ast.Attribute) and _is_window(node.value, window, services):
                if isinstance(node.ctx, ast.Load):
                    reads.attrs.add(node.attr)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                for given in (*node.args, *(k.value for k in node.keywords)):
                    kind = (
                        "window"
                        if _is_window(given, window, services)
                        else "services"
                        if services.holds(given)
                        else None
                    )
                    for target in definitions.get(node.func.id, []) if kind else []:
                        _follow(target, node, given, kind, definitions, reads, seen)


def _follow(
    target: _Callable,
    call: ast.Call,
    given: ast.expr,
    kind: str,
    definitions: dict[str, list[_Callable]],
    reads: _WindowReads,
    seen: set[tuple[str, str, str]],
) -> None:
    """Reads in ``target``, called by ``call`` with ``given`` (the window, or the services: ``kind``)."""

    def refs(names: set[str], self_attrs: set[str]) -> tuple[_Refs, _Refs]:
        held = _Refs(names, self_attrs)
        return (held, _Refs()) if kind == "window" else (_Refs(), held)

    if isinstance(target.node, ast.FunctionDef):
        param = _receiving_param(target.node, call, given, skip_self=False)
        if param is None or (target.node.name, param, kind) in seen:
            return
        seen.add((target.node.name, param, kind))
        before = len(reads.attrs)
        _reads_in([target.node], *refs({param}, set()), definitions, reads, seen)
        if kind == "window" or len(reads.attrs) > before:
            reads.handed_to.add(f"{target.node.name}()")
        return
    init = next(
        (n for n in target.node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None
    )
    if init is None:
        return
    param = _receiving_param(init, call, given, skip_self=True)
    if param is None or (target.node.name, param, kind) in seen:
        return
    seen.add((target.node.name, param, kind))
    kept = {
        t.attr
        for n in ast.walk(init)
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Name) and n.value.id == param
        for t in n.targets
        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
    }
    before = len(reads.attrs)
    _reads_in([init], *refs({param}, set()), definitions, reads, seen)
    if kept:
        _reads_in(list(target.node.body), *refs(set(), kept), definitions, reads, seen)
    if (kind == "window" and kept) or len(reads.attrs) > before:
        reads.handed_to.add(target.node.name)


def _installers(source: Source) -> Iterator[tuple[str, ast.FunctionDef]]:
    for path in source.under("app"):
        for node in ast.walk(source.tree(path)):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("install_"):
                yield f"{path}:{node.name}", node


def window_reads(source: Source) -> dict[str, _WindowReads]:
    """Per ``install_*`` function handed the window or the services (first parameter ``window`` or
    ``services``): the main window's attributes it and the code it hands them to read."""
    definitions = _definitions(source)
    features: dict[str, _WindowReads] = {}
    for name, node in _installers(source):
        first = (_params(node) or [""])[0]
        if first not in ("window", "services"):
            continue
        held = _Refs({first}, set())
        window, services = (held, _Refs()) if first == "window" else (_Refs(), held)
        reads = _WindowReads()
        _reads_in(list(node.body), window, services, definitions, reads, set())
        features[name] = reads
    return features


def _main_window_names(source: Source) -> tuple[set[str], set[str]]:
    """The attributes the main window has (its class's methods and class attributes, what its methods set
    on ``self``, what any function sets on a parameter named ``window``), and the files defining it."""
    names: set[str] = set()
    homes: set[str] = set()
    for path in source.under("app"):
        for node in ast.walk(source.tree(path)):
            if isinstance(node, ast.ClassDef) and node.name == MAIN_WINDOW_CLASS:
                homes.add(path)
                for item in node.body:
                    if isinstance(item, ast.FunctionDef):
                        names.add(item.name)
                    elif isinstance(item, ast.Assign | ast.AnnAssign):
                        targets = item.targets if isinstance(item, ast.Assign) else [item.target]
                        names.update(t.id for t in targets if isinstance(t, ast.Name))
                names.update(_set_on(node, "self"))
            elif isinstance(node, ast.FunctionDef) and "window" in _params(node):
                names.update(_set_on(node, "window"))
    return names, homes


def _set_on(node: ast.AST, holder: str) -> set[str]:
    return {
        target.attr
        for n in ast.walk(node)
        if isinstance(n, ast.Assign | ast.AnnAssign)
        for target in (n.targets if isinstance(n, ast.Assign) else [n.target])
        if isinstance(target, ast.Attribute)
        and isinstance(target.value, ast.Name)
        and target.value.id == holder
    }


def parent_chain_reads(source: Source) -> list[str]:
    """Reads of the main window's attributes through ``X.window()``, ``X.parent()``, ``X.parentWidget()``
    (and the like) anywhere in ``app/`` outside the window's own code (``app/window/`` and the module of
    ``MainWindow``): ``path:line name``, one per read."""
    names, homes = _main_window_names(source)
    found: list[tuple[str, int, str]] = []
    for path in source.under("app"):
        if path in homes or path.startswith(WINDOW_PACKAGE + "/"):
            continue
        for node in ast.walk(source.tree(path)):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Load)
                and node.attr in names
                and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Attribute)
                and node.value.func.attr in PARENT_CALLS
                and not node.value.args
            ):
                found.append((path, node.lineno, f"{node.value.func.attr}().{node.attr}"))
    return [f"{path}:{line} {read}" for path, line, read in sorted(found)]


def installers_without_window(source: Source) -> dict[str, str]:
    """``install_*`` functions of ``app/`` handed neither the window nor the services (first parameter):
    name -> that parameter."""
    found: dict[str, str] = {}
    for name, node in _installers(source):
        first = (_params(node) or ["(none)"])[0]
        if first not in ("window", "services"):
            found[name] = first
    return found


# -- private reaches into the vault ---------------------------------------------------------------------
def vault_numbers(rev: str | None) -> dict:
    spec = importlib.util.spec_from_file_location("vault_reaches", VAULT_REACHES)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {VAULT_REACHES.relative_to(ROOT)}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.vault_reaches(rev)


# -- writers of a volume --------------------------------------------------------------------------------
def _functions(tree: ast.Module) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """(qualified name, node) of every function and method, nested ones included."""

    def walk(node: ast.AST, prefix: str) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                yield name, child
                yield from walk(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.")

    yield from walk(tree, "")


def _own_calls(function: ast.FunctionDef | ast.AsyncFunctionDef) -> Iterator[ast.Call]:
    """Calls in ``function``'s body, not in the functions nested in it."""
    stack: list[ast.AST] = list(function.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        if isinstance(node, ast.Call):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _is_nifti_write(call: ast.Call) -> bool:
    func = call.func
    if not isinstance(func, ast.Attribute):
        return False
    if func.attr == "to_filename":
        return True
    return func.attr == "save" and isinstance(func.value, ast.Name) and func.value.id in ("nib", "nibabel")


def _called_name(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Name):
        return call.func.id
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return None


def volume_writers(source: Source) -> tuple[list[str], list[str]]:
    """(the call sites ``path:line function``, the public wrappers ``path function``).

    A wrapper is a public function that calls a site's function, directly or through private helpers.
    Callers are found by the called name, followed only for names defined once in the code (``run`` is
    defined by every command, so its callers say nothing about who writes).
    """
    sites: list[str] = []
    writers: set[tuple[str, str]] = set()  # (path, qualified name)
    callers_of: dict[str, set[tuple[str, str]]] = defaultdict(set)  # called name -> (path, qualified name)
    defined: dict[str, int] = defaultdict(int)
    for path in source.paths:
        for qualname, function in _functions(source.tree(path)):
            defined[function.name] += 1
            for call in _own_calls(function):
                if _is_nifti_write(call):
                    sites.append(f"{path}:{call.lineno} {qualname}")
                    writers.add((path, qualname))
                name = _called_name(call)
                if name is not None:
                    callers_of[name].add((path, qualname))
    wrappers: set[tuple[str, str]] = set()
    frontier, seen = set(writers), set(writers)
    while frontier:
        next_frontier: set[tuple[str, str]] = set()
        for _path, qualname in frontier:
            short = qualname.rsplit(".", 1)[-1]
            if defined[short] != 1:
                continue
            for caller in callers_of.get(short, ()):
                if caller in seen:
                    continue
                seen.add(caller)
                if _is_public(caller[1]):
                    wrappers.add(caller)  # where a caller enters: its own callers are users of it
                else:
                    next_frontier.add(caller)
        frontier = next_frontier
    return sorted(sites), sorted(f"{path} {qualname}" for path, qualname in wrappers)


def _is_public(qualname: str) -> bool:
    return not any(part.startswith("_") for part in qualname.split("."))


# -- the report -----------------------------------------------------------------------------------------
def report(rev: str | None) -> str:
    source = Source(rev)
    label = rev or "the working tree"
    if rev is not None:
        label = f"{rev} ({_git('rev-parse', '--short', rev)[0]})"
    lines = [f"structure report: {label}", ""]

    places = places_per_setting(source)
    lines.append(f"1. places per optimization setting ({len(places)} settings of OptimizationConfig)")
    width = max(len(n) for n in places)
    for name, paths in places.items():
        lines.append(f"   {name:<{width}}  {len(paths):>2}  {', '.join(_short(p) for p in paths)}")
    counts = [len(p) for p in places.values()]
    lines.append(f"   total {sum(counts)} places, mean {sum(counts) / len(counts):.1f}, max {max(counts)}")
    lines.append("")

    features = window_reads(source)
    chains = parent_chain_reads(source)
    every: set[str] = {chain.rsplit(".", 1)[1] for chain in chains}
    for reads in features.values():
        every |= reads.attrs
    per_feature = sum(len(reads.attrs) for reads in features.values()) + len(chains)
    lines.append(
        f"2. window attributes read by features: {per_feature} (summed over {len(features)} install_* "
        f"functions and {len(chains)} window()/parent() reads), {len(every)} distinct"
    )
    for name, reads in features.items():
        handed = f" (handed to {', '.join(sorted(reads.handed_to))})" if reads.handed_to else ""
        lines.append(f"   {name}: {len(reads.attrs)}{handed}")
        if reads.attrs:
            lines.append(f"      {', '.join(sorted(reads.attrs))}")
    if chains:
        lines.append("   main-window attributes reached through window()/parent() calls:")
        lines.extend(f"      {chain}" for chain in chains)
    others = installers_without_window(source)
    if others:
        lines.append("   install_* functions handed neither the window nor the services (first parameter):")
        lines.extend(f"      {name}: {first}" for name, first in others.items())
    lines.append("")

    vault = vault_numbers(rev)
    lines.append(f"3. private reaches into the vault from its operation modules: {vault['private_reaches']}")
    for module, n in vault["reaches_by_module"].items():
        lines.append(f"   {module:<18} {n}")
    elsewhere = ", ".join(f"{k}/ {v}" for k, v in vault["private_reaches_elsewhere"].items())
    lines.append(f"   elsewhere (same rule): {elsewhere}")
    lines.append(
        f"   runtime import cycles in the vault: {len(vault['runtime_cycles'])}; "
        f"circles: {len(vault['circles'])} ({vault['circle_modules']} modules)"
    )
    for cycle in vault["runtime_cycles"]:
        lines.append("      " + " -> ".join(cycle))
    lines.append("")

    sites, wrappers = volume_writers(source)
    lines.append(
        f"4. writers of a volume: {len(sites)} NIfTI write call sites, {len(wrappers)} public wrappers"
    )
    lines.extend(f"   site     {site}" for site in sites)
    lines.extend(f"   wrapper  {wrapper}" for wrapper in wrappers)
    return "\n".join(lines)


def _short(path: str) -> str:
    return re.sub(r"\.py$", "", path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rev", help="a git revision (default: the working tree)")
    args = parser.parse_args(argv)
    try:
        print(report(args.rev))
    except subprocess.CalledProcessError as exc:
        print(f"error: git could not read revision {args.rev!r}: {exc.stderr.strip()}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
