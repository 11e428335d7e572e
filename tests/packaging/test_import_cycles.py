"""packaging/import_cycles.py, the CI check that no import circle exists, on tiny packages written to a temporary
folder."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.packaging.scripts import load_script


@pytest.fixture(scope="module")
def checker():
    return load_script("import_cycles")


def write_package(root: Path, name: str, files: dict[str, str]) -> str:
    package = root / name
    package.mkdir()
    (package / "__init__.py").write_text("")
    for module, text in files.items():
        (package / f"{module}.py").write_text(textwrap.dedent(text))
    return name


def test_a_circle_through_a_type_checking_import_is_reported(checker, tmp_path, monkeypatch, capsys):
    name = write_package(
        tmp_path,
        "circle_through_typing",
        {
            "owner": """
                from circle_through_typing.piece import Piece
                """,
            "piece": """
                from typing import TYPE_CHECKING

                if TYPE_CHECKING:
                    from circle_through_typing.owner import Owner
                """,
            "alone": """
                from circle_through_typing import piece
                """,
        },
    )
    monkeypatch.syspath_prepend(str(tmp_path))

    assert checker.main([name]) == 1
    out = capsys.readouterr().out
    assert "1 import circle(s)" in out
    assert "2 modules: circle_through_typing.owner, circle_through_typing.piece" in out
    assert "circle_through_typing.piece:5 -> circle_through_typing.owner" in out  # the import to cut, by line
    assert "alone" not in out


def test_a_package_without_a_circle_passes(checker, tmp_path, monkeypatch, capsys):
    name = write_package(
        tmp_path,
        "no_circle",
        {
            "owner": "from no_circle.piece import Piece\n",
            "piece": "from no_circle import low\n",
            "low": "",
        },
    )
    (tmp_path / name / "__init__.py").write_text(
        "from no_circle.owner import Owner\n"
    )  # a package re-exporting
    monkeypatch.syspath_prepend(str(tmp_path))

    assert checker.main([name]) == 0
    assert "no import circle in no_circle" in capsys.readouterr().out
