"""The vault's structure: the counting rule of packaging/structure/vault_reaches.py, and the package as it is
(no private reach into the vault's state, no import cycle among its modules)."""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "packaging" / "structure" / "vault_reaches.py"


@pytest.fixture(scope="module")
def reaches():
    spec = importlib.util.spec_from_file_location("vault_reaches", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_rule_counts_private_attributes_of_vault_objects_only(reaches):
    source = textwrap.dedent(
        """
        def op(vault, item_id):
            vault._index["items"]            # a vault name: a reach
            vault._audit._lock.hold()        # one reach (the object of _lock is vault._audit)
            vault.path, vault.__class__      # public and dunder: none
            other._index                     # not a vault object: none

        class Piece:
            def run(self):
                return self._vault._keys     # an attribute ending in 'vault': a reach

        def typed(v: "Vault", s: VaultState):
            v._keys, s._mutex                # annotated as the vault's types: two reaches

        def made(path):
            again = Vault(path)
            staging = VaultState.open(path)
            again._header, staging._anchor   # assigned from the types: two reaches
        """
    )
    found = [attr for _, attr in reaches.private_reaches(source)]
    assert found == ["_index", "_audit", "_keys", "_keys", "_mutex", "_header", "_anchor"]


def test_imports_are_sorted_into_module_function_and_typing_and_cycles_found(reaches):
    sources = {
        "engine/vault/a.py": "from engine.vault import b\n",
        "engine/vault/b.py": "def f():\n    from engine.vault.a import x\n",
        "engine/vault/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from engine.vault.d import D\n",
        "engine/vault/d.py": "import engine.vault.c\nimport engine.errors\n",
        "engine/vault/__init__.py": "from engine.vault.a import x\n",
    }
    edges = reaches.import_edges(sources)
    assert edges == [("a", "b", "module"), ("b", "a", "function"), ("c", "d", "typing"), ("d", "c", "module")]
    cycles, circles = reaches._cycles(edges)
    assert cycles == [["a", "b", "a"]]  # c -> d runs never: no runtime cycle there
    assert circles == [["a", "b"], ["c", "d"]]  # but both pairs are one circle each


def test_the_vault_has_no_private_reach_and_no_import_cycle(reaches):
    report = reaches.vault_reaches(elsewhere=("tests/engine/vault",))  # (the whole tree: the script's run)
    assert report["private_reaches"] == 0, report["reaches"]
    assert report["private_reaches_elsewhere"] == {"tests/engine/vault": 0}
    assert report["runtime_cycles"] == [] and report["circles"] == []
    # The counter still sees the package: the state goes to every operation module.
    assert (
        "item_index -> state (typing)" in report["imports"] and "store -> state (module)" in report["imports"]
    )
