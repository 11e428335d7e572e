"""Start VolSynth Studio: ``volsynth-studio`` or ``python -m app``.

``--measure-startup`` prints the time from process start to a painted, usable window (and to the 3D view
being ready), then quits: the number the startup benchmark (benchmarks/app_startup.py) collects.
"""

from __future__ import annotations

import time

_T0 = time.perf_counter()

import argparse  # noqa: E402
import json  # noqa: E402
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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="volsynth-studio", description="VolSynth Studio")
    parser.add_argument("files", nargs="*", help="NIfTI files to open")
    parser.add_argument(
        "--measure-startup",
        action="store_true",
        help="print seconds from launch to a usable window and to the 3D view, then quit",
    )
    parser.add_argument("--no-3d", action="store_true", help="do not create the 3D view (no OpenGL)")
    parser.add_argument(
        "--demo",
        metavar="PNG",
        help="generate one volume with the selected (shipped) model, save a "
        "screenshot of the window to PNG and quit: the headless check of the main job",
    )
    return parser.parse_args(argv)


def open_window(args: argparse.Namespace, **window_options):
    """The shown main window with the command line's files opening (``window_options`` go to MainWindow)."""
    from app.window.main_window import MainWindow

    window = MainWindow(enable_3d=not args.no_3d, **window_options)
    window.show()
    for path in args.files:
        window.open_path(path)
    return window


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication

    existing = QApplication.instance()
    app = existing if isinstance(existing, QApplication) else QApplication(sys.argv[:1])
    app.setOrganizationName("VolSynth")
    app.setApplicationName("VolSynth Studio")
    app.setApplicationDisplayName("VolSynth Studio")

    from app.widgets.theme import apply_dark_theme

    apply_dark_theme(app)
    window = open_window(args)

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
    if args.demo:
        _run_demo(app, window, args.demo, wait_for_3d=not args.no_3d)
    code = app.exec()
    if args.demo:
        code = code or (0 if getattr(window, "_demo_outcome", "") == "finished" else 1)
    return leave(code)


def leave(code: int) -> int:
    """The exit code to return, or exit at once when an abandoned run's thread still runs."""
    from app.services.workers import abandoned_threads_running

    left = abandoned_threads_running()
    if left or os.environ.get("VOLSYNTH_HARD_EXIT"):
        # A run abandoned on Quit may still be inside a step that never ends; Python's normal exit would
        # destroy its QThread while it runs (an abort). Everything worth keeping was written at close.
        if left:
            logging.getLogger("app").warning("exiting with %d abandoned run(s) still running", left)
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def thread_cpu_s() -> dict[int, tuple[str, float]]:
    """CPU seconds used so far by each thread of this process, by thread id, with the thread's name (Linux's
    /proc; empty elsewhere): which threads compete for the cores during a run."""
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    found: dict[int, tuple[str, float]] = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return found
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/stat") as stat:
                name_start, rest = stat.read().split(" (", 1)
            name, fields = rest.rsplit(") ", 1)
            user, system = fields.split()[11:13]  # utime and stime, the 14th and 15th fields of stat
            found[int(tid)] = (name, (int(user) + int(system)) / ticks)
        except (OSError, ValueError):
            continue  # a thread that ended while it was read
    return found


def thread_cpu_since(before: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds each thread used since ``before``, busiest first, as "name (tid)": seconds."""
    used = {
        f"{name} ({tid})": round(seconds - before.get(tid, (name, 0.0))[1], 2)
        for tid, (name, seconds) in thread_cpu_s().items()
    }
    return dict(sorted(((k, v) for k, v in used.items() if v > 0), key=lambda item: -item[1]))


def _run_demo(app, window, png: str, wait_for_3d: bool) -> None:
    """Drive the window like a user would: Generate with the defaults, then screenshot the result."""
    from PySide6.QtCore import QTimer

    threads_at_start: dict[int, tuple[str, float]] = {}

    def generate() -> None:
        threads_at_start.update(thread_cpu_s())
        if not window.generation.start():
            print("demo: could not start a generation (see the message above)", flush=True)
            app.exit(1)

    def screenshot() -> None:
        # What a user sees, in words a smoke test can check: the 3D view drawn (not "unavailable"), and the
        # session details' anatomy check line.
        print(f"demo: 3D view: {_view3d_state(window)}", flush=True)
        print(
            f"demo: {_anatomy_line(window) or 'anatomy check: (no line in the session details)'}", flush=True
        )
        os.makedirs(os.path.dirname(os.path.abspath(png)), exist_ok=True)
        window.grab().save(png)
        print(f"demo: {window._demo_outcome}; screenshot saved to {png}", flush=True)
        window.recovery.keep_unsaved = False  # the demo's volume is a check, not work to offer back next time
        window.close()  # a clean exit: settings saved, workers and recovery closed
        app.quit()

    def ended(outcome: str) -> None:
        window._demo_outcome = outcome
        print(f"demo: generation {outcome} ({window.sampling_panel.progress_label.text()})", flush=True)
        if outcome == "finished":  # what the overhead benchmark (benchmarks/app_overhead.py) reads
            run = dict(window.generation.last_run, threads_cpu_s=thread_cpu_since(threads_at_start))
            print(f"demo: run {json.dumps(run)}", flush=True)
        # Let the 3D view render the finished volume, and the anatomy check (measured in the background) land
        # in the session details: at least 2 s, at most 60 s.
        waited = {"ms": 0}

        def screenshot_when_settled() -> None:
            waited["ms"] += 250
            line = _anatomy_line(window)
            measured = line and not line.rstrip(".\u2026").endswith("measuring")
            if waited["ms"] >= 2000 and (measured or waited["ms"] >= 60_000 or outcome != "finished"):
                screenshot()
            else:
                QTimer.singleShot(250, screenshot_when_settled)

        QTimer.singleShot(250, screenshot_when_settled)

    window.generation.ended.connect(ended)
    if wait_for_3d:
        window.view3d_ready.connect(generate)
    else:
        QTimer.singleShot(0, generate)


def _view3d_state(window) -> str:
    """The 3D view as a user sees it: "drawn (N actors)" when it shows a scene, else what its pane says."""
    view = window.viewer.view3d
    if view.ready and len(view.plotter.renderer.actors):
        return f"drawn ({len(view.plotter.renderer.actors)} actors)"
    return " ".join(view.placeholder.text().split()) if not view.ready else "no scene"


def _anatomy_line(window) -> str:
    """The session details' anatomy check line of the shown volume, as plain text ("" while there is none)."""
    import html
    import re

    text = html.unescape(re.sub(r"<[^>]+>", "\n", window.session_panel.details.text())).replace("\u200b", "")
    return next((line.strip() for line in text.splitlines() if line.strip().startswith("anatomy check:")), "")


if __name__ == "__main__":
    sys.exit(main())
