"""Run the product's main run-time paths with only what the installable build holds: the child process of
tests/packaging/test_frozen_runtime.py.

Before anything of the product is imported, every module the bundle lacks (packaging/frozen_contents.py:
the spec's excludes, and every installed package that is no run-time requirement, such as mypy or pytest) is
made absent the way it is absent there: the import system's finders no longer find it. Every file the process opens is recorded (an audit hook), so the
test can check that each data file read from the checkout lies under a folder the spec's ``datas`` ship.

    python tests/packaging/frozen_run.py engine WORK REPORT.json   # the CLI paths, in WORK
    python tests/packaging/frozen_run.py app WORK REPORT.json      # the app's 3D view and anatomy line (X display)
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "packaging"))
import frozen_contents  # noqa: E402

ABSENT = frozen_contents.absent_modules()
# Absent modules something tried to import (fine when it copes, as optional imports do).
TRIED: set[str] = set()


def _absent(name: str) -> bool:
    return any(name == absent or name.startswith(absent + ".") for absent in ABSENT)


class _AsInTheBundle:
    """A finder of ``sys.meta_path`` that finds nothing the bundle lacks: ``import`` raises
    ModuleNotFoundError ("No module named ..."), ``importlib.util.find_spec`` returns None, and
    ``name in sys.modules`` stays False, exactly as where the module is not installed."""

    def __init__(self, finder) -> None:
        self._finder = finder

    def find_spec(self, name, path=None, target=None):
        if _absent(name):
            TRIED.add(name)
            return None
        return self._finder.find_spec(name, path, target)

    def __getattr__(self, attribute):
        return getattr(self._finder, attribute)


sys.meta_path[:] = [_AsInTheBundle(finder) for finder in sys.meta_path]
OPENED: set[str] = set()


def _on_audit(event: str, args: tuple) -> None:
    if event == "open" and args and isinstance(args[0], str | bytes | os.PathLike):
        OPENED.add(os.fsdecode(args[0]))


sys.addaudithook(_on_audit)


def _cli(*argv: str) -> dict:
    """One ``volsynth`` command in this process: its exit code, or the exception that escaped it."""
    from engine.cli import main

    print(f"$ volsynth {' '.join(argv)}", file=sys.stderr, flush=True)
    try:
        return {"rc": main(list(argv))}
    except BaseException as exc:  # noqa: BLE001 - reported to the test, which fails on it
        traceback.print_exc()
        return {"rc": None, "error": f"{type(exc).__name__}: {exc}"}


def run_engine(work: Path) -> dict:
    """generate (anatomy check, tissue maps), segment, the quality report, Get Models offline, the vault."""
    steps: dict[str, dict] = {}
    steps["models"] = _cli("models")
    steps["generate"] = _cli("generate", "--steps", "2", "--seed", "1", "--out", str(work / "gen.nii.gz"))
    steps["segment"] = _cli("segment", str(work / "phantom_T1w.nii.gz"), "--out", str(work / "seg"))
    steps["quality"] = _cli(
        "quality", "--model", "tiny-latent", "--seeds", "4", "--steps", "2", "--settings", "steps:1",
        "--json", str(work / "quality.json"), "--png", str(work / "quality.png"),
    )  # fmt: skip
    os.environ["HF_ENDPOINT"] = "http://127.0.0.1:9"  # nothing listens there: the offline path
    steps["models get (offline)"] = _cli("models", "get", "nv-generate-mr-brain", "--accept-licence")
    (work / "passphrase").write_text("correct horse battery staple\n")
    vault = ("--vault", str(work / "vault"), "--passphrase-file", str(work / "passphrase"))
    steps["vault init"] = _cli("vault", "init", *vault)
    steps["vault import"] = _cli("vault", "import", str(work / "gen.nii.gz"), *vault)
    steps["vault ls"] = _cli("vault", "ls", "--json", *vault)
    return steps


def run_app(work: Path) -> dict:
    """The main window with its 3D view, showing the generated volume: the scene and the anatomy line."""
    import time

    from PySide6.QtCore import QSettings
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication(sys.argv[:1])
    from PySide6.QtWidgets import QMessageBox

    from app.window.main_window import MainWindow

    dialogs: list[str] = []  # a message box would wait for a click nobody gives: recorded instead

    def _recorded(kind: str):
        def show(parent, title, text, *args, **kwargs):
            dialogs.append(f"{kind}: {title}: {text}")
            print(f"dialog {kind}: {title}: {text}", file=sys.stderr, flush=True)
            return QMessageBox.StandardButton.Ok

        return staticmethod(show)

    for kind in ("critical", "warning", "information", "question"):
        setattr(QMessageBox, kind, _recorded(kind))

    settings = QSettings(str(work / "studio.ini"), QSettings.Format.IniFormat)
    window = MainWindow(settings=settings, enable_3d=True, preload_torch=False)
    window.resize(1400, 900)
    window.show()

    def wait(condition, seconds: float) -> bool:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            app.processEvents()
            if condition():
                return True
            time.sleep(0.02)
        return condition()

    view = window.viewer.view3d
    wait(lambda: view.ready or "unavailable" in view.placeholder.text(), 90)
    window.open_path(str(work / "gen.nii.gz"))
    drawn = wait(lambda: view.ready and len(view.plotter.renderer.actors) > 0, 60)
    details = window.session_panel.details
    wait(lambda: "anatomy check:" in details.text(), 30)
    result = {
        "3d_view": "drawn" if drawn else view.placeholder.text(),
        "details": details.text(),
        "dialogs": dialogs,
    }
    window.recovery.keep_unsaved = False
    window.close()
    return result


def main(argv: list[str]) -> int:
    part, work, report = argv[0], Path(argv[1]), Path(argv[2])
    out: dict = {"absent": ABSENT}
    try:
        out["result"] = run_engine(work) if part == "engine" else run_app(work)
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        traceback.print_exc()
        out["error"] = f"{type(exc).__name__}: {exc}"
    out["tried_absent"] = sorted(TRIED)
    out["opened"] = sorted(OPENED)
    out["modules"] = sorted(name for name, module in sys.modules.items() if module is not None)
    report.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
