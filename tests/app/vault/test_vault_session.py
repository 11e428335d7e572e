"""The open vault's state has one writer: only app/vault/locking.py calls the session's setters, and no code
outside the session reads or writes its private fields (checked on the app's source)."""

from __future__ import annotations

import ast
from pathlib import Path

from app.vault.session import VaultSession

APP = Path(__file__).resolve().parents[3] / "app"
WRITER = APP / "vault" / "locking.py"
OWNER = APP / "vault" / "session.py"


def _is_session(node: ast.expr) -> bool:
    """``session``, ``self._session``, ``controller.session``...: an expression naming a vault session."""
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return name.lstrip("_") == "session"


def _session_uses(attributes: set[str]) -> list[tuple[Path, int, str]]:
    """Every ``<session>.<attribute>`` in app/ for the given attribute names: (file, line, attribute)."""
    found = []
    for path in sorted(APP.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if not any(f".{name}" in text for name in attributes):  # most files: nothing to parse
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Attribute) and node.attr in attributes and _is_session(node.value):
                found.append((path, node.lineno, node.attr))
    return found


def test_only_locking_changes_the_vault_session():
    setters = {name for name in vars(VaultSession) if name.startswith("set_")}
    assert setters == {"set_unlocked", "set_locked", "set_path"}
    callers = {path for path, _line, _name in _session_uses(setters)}
    assert callers == {WRITER}, sorted(str(p.relative_to(APP)) for p in callers)


def test_no_code_outside_the_session_reaches_its_private_state():
    private = {name for name in vars(VaultSession(settings=None)) if name.startswith("_")}
    assert {"_vault", "_unlocked", "_path"} <= private
    reaches = [
        f"{p.relative_to(APP)}:{line} {name}" for p, line, name in _session_uses(private) if p != OWNER
    ]
    assert reaches == []
