"""Start VolSynth Studio: ``volsynth-studio`` or ``python -m app``.

``--measure-startup`` prints the time from process start to a painted, usable window (and to the 3D view
being ready), then quits: the number the startup benchmark (app/bench_startup.py) collects.
"""

from __future__ import annotations

import time

_T0 = time.perf_counter()

import argparse  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402


def _process_age_s() -> float:
    """Seconds since this process was created (includes the interpreter's own start-up)."""
    try:
        import psutil

        return time.time() - psutil.Process().create_time()
    except Exception:  # noqa: BLE001 - fall back to time since this module was imported
        return time.perf_counter() - _T0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="volsynth-studio", description="VolSynth Studio")
    parser.add_argument("files", nargs="*", help="NIfTI files to open")
    parser.add_argument("--measure-startup", action="store_true",
                        help="print seconds from launch to a usable window and to the 3D view, then quit")
    parser.add_argument("--no-3d", action="store_true", help="do not create the 3D view (no OpenGL)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setOrganizationName("VolSynth")
    app.setApplicationName("VolSynth Studio")
    app.setApplicationDisplayName("VolSynth Studio")

    from app.main_window import MainWindow
    from app.theme import apply_dark_theme

    apply_dark_theme(app)
    window = MainWindow(enable_3d=not args.no_3d)
    window.show()
    for path in args.files:
        window.open_path(path)

    if args.measure_startup:
        marks: dict[str, float] = {}

        def _window_usable() -> None:
            marks["window"] = _process_age_s()
            print(f"startup: usable window after {marks['window']:.2f} s", flush=True)
            if args.no_3d:
                app.quit()

        def _view3d_ready() -> None:
            marks["3d"] = _process_age_s()
            print(f"startup: 3D view ready after {marks['3d']:.2f} s", flush=True)
            QTimer.singleShot(0, app.quit)

        QTimer.singleShot(0, _window_usable)  # runs once the event loop has painted the shown window
        window.view3d_ready.connect(_view3d_ready)
        QTimer.singleShot(60_000, app.quit)
    code = app.exec()
    if os.environ.get("VOLSYNTH_HARD_EXIT"):
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
