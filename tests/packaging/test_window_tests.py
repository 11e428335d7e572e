"""packaging/window_tests.py: which test functions build the whole main window, followed through fixtures, module
marks and helpers of the same file."""

from __future__ import annotations

import textwrap
from pathlib import Path

from tests.packaging.scripts import load_script

window_tests = load_script("window_tests")


def _write(root: Path, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))


def test_a_window_is_followed_through_fixtures_marks_and_helpers_and_nothing_else_counts(tmp_path):
    _write(
        tmp_path,
        "tests/conftest.py",
        """
        import pytest

        @pytest.fixture
        def window():
            return MainWindow(registry=None)

        @pytest.fixture
        def vault_window(window):
            return window

        @pytest.fixture
        def services():
            return object()
        """,
    )
    _write(
        tmp_path,
        "tests/test_marked.py",
        """
        import pytest

        pytestmark = pytest.mark.usefixtures("vault_window")

        def test_marked_module():
            pass
        """,
    )
    _write(
        tmp_path,
        "tests/test_features.py",
        """
        import pytest

        def _open(qtbot):
            return MainWindow(registry=None)

        def _steps(qtbot):
            return _open(qtbot)

        def test_through_a_fixture_of_a_fixture(vault_window):
            pass

        def test_through_helpers(qtbot):
            _steps(qtbot)

        @pytest.mark.usefixtures("window")
        def test_through_usefixtures():
            pass

        def test_on_the_services(services, qtbot):
            pass

        def test_a_plain_host(qtbot):
            host = QMainWindowLike()
        """,
    )
    found = window_tests.window_tests(tmp_path)
    assert sorted(name for _, name in found) == [
        "test_marked_module",
        "test_through_a_fixture_of_a_fixture",
        "test_through_helpers",
        "test_through_usefixtures",
    ]


def test_the_suite_keeps_within_its_budget(capsys):
    assert window_tests.main([]) == 0
    assert "within the budget of 60" in capsys.readouterr().out
