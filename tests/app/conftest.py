"""App fixtures: an isolated QSettings file, a recorded (non-blocking) error dialog, main windows, screenshots.

GUI tests need a real X display: run them as
``QT_QPA_PLATFORM=xcb xvfb-run -a -s "-screen 0 1600x1000x24" .venv/bin/pytest tests/app``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import RUN_FOLDER

os.environ.setdefault("QT_QPA_PLATFORM", "xcb")

# Tests write only inside temporary folders: screenshots go to a fresh one per run unless
# VOLSYNTH_SCREENSHOTS names the folder to keep them in (for people who want to look at them).
SCREENSHOTS = Path(os.environ.get("VOLSYNTH_SCREENSHOTS") or RUN_FOLDER / "screenshots")
SCREENSHOTS.mkdir(parents=True, exist_ok=True)


def pytest_collection_modifyitems(config, items):
    # Tests marked render need a display; skip them (with the reason) when there is none.
    if os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"):
        return
    skip = pytest.mark.skip(reason="needs an X display: run under xvfb-run with QT_QPA_PLATFORM=xcb")
    for item in items:
        if "render" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def private_data_home(tmp_path, monkeypatch):
    """Each test its own data folder: crash-recovery folders (and anything else under it) stay per test."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data-home"))


@pytest.fixture(autouse=True)
def quit_without_asking(monkeypatch):
    """Closing a window during a run asks first, and nobody answers in a test: pytest-qt closes the windows
    of a failed test (run still going) before fixtures tear down, which would wait forever. So the answer
    is yes; a test of the question itself puts back the real method this fixture returns."""
    from app.window.main_window import MainWindow

    real = MainWindow.confirm_quit_during_run
    monkeypatch.setattr(MainWindow, "confirm_quit_during_run", lambda self: True)
    return real


@pytest.fixture
def qt_settings(tmp_path):
    from PySide6.QtCore import QSettings

    return QSettings(str(tmp_path / "volsynth-studio.ini"), QSettings.Format.IniFormat)


@pytest.fixture
def error_dialogs(monkeypatch):
    """Replace QMessageBox.critical so no dialog blocks; the list records (title, message) of each one shown."""
    from PySide6.QtWidgets import QMessageBox

    shown: list[tuple[str, str]] = []

    def fake_critical(parent, title, text, *args, **kwargs):
        shown.append((title, text))
        return QMessageBox.StandardButton.Ok

    monkeypatch.setattr(QMessageBox, "critical", staticmethod(fake_critical))
    return shown


@pytest.fixture(scope="session")
def themed_app(qapp):
    from app.widgets.theme import apply_dark_theme

    apply_dark_theme(qapp)
    return qapp


@pytest.fixture
def app_services(qtbot, themed_app, registry, qt_settings, error_dialogs):
    """A real ``AppServices`` without a main window, for the tests of a feature where the window is not the
    subject: a plain host window gives the menus, the main tool bar, the docks and the status bar; the runner
    is a real ``JobRunner`` whose error dialog is recorded in ``error_dialogs`` and whose busy mark is in the
    host's status bar. The host is shown, so shortcuts and keys reach the feature's widgets."""
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QAction
    from PySide6.QtWidgets import QDockWidget, QMessageBox

    from app.core.session import AppState
    from app.docks.metrics_dock import MetricsDock
    from app.services import AppServices, WindowMenus
    from app.services.metrics_sources import MetricsSources
    from app.services.workers import BackendPool, JobRunner
    from engine.models import open_model_folder
    from tests.app.host import Host

    host = Host()
    qtbot.addWidget(host)
    state = AppState()
    status = host.statusBar()

    def show_error(title: str, message: str) -> None:
        QMessageBox.critical(host, title, message)

    def add_dock(widget, title, area=Qt.DockWidgetArea.RightDockWidgetArea, name=None, tabify_with=None):
        dock = QDockWidget(title, host)
        dock.setObjectName(name or title)
        dock.setWidget(widget)
        host.addDockWidget(area, dock)
        return dock

    def add_model_folder(folder) -> bool:
        state.add_model(open_model_folder(folder))
        return True

    runner = JobRunner(
        host, show_error=show_error, show_status=status.showMessage, hold_engine=state.set_job_running
    )
    status.addPermanentWidget(runner.activity)
    bar = host.menuBar()
    generate_menu = bar.addMenu("&Generate")
    open_model_action = generate_menu.addAction(QAction("Open &Model Folder...", host))
    services = AppServices(
        state=state,
        runner=runner,
        backends=BackendPool(registry),
        settings=qt_settings,
        telemetry=MetricsSources(MetricsDock(), None, lambda: state.form.device),
        show_status=status.showMessage,
        show_error=show_error,
        show_device=lambda where: None,
        add_status_widget=status.addPermanentWidget,
        add_dock=add_dock,
        open_path=lambda path: None,
        open_model_folder=add_model_folder,
        volume_opened=host.volume_opened,
        menus=WindowMenus(
            menu_bar=bar,
            generate=generate_menu,
            view=bar.addMenu("&View"),
            main_toolbar=host.addToolBar("Main"),
            open_model_action=open_model_action,
            add_window_action=host.addAction,
            add_fitted_tool_bars=lambda *bars: [host.addToolBar(tool_bar) for tool_bar in bars],
        ),
        parent=host,
    )
    state.set_models(registry.list())
    host.resize(1000, 700)
    host.show()
    qtbot.waitExposed(host)
    host.activateWindow()  # keys reach the host's widgets only in the active window
    qtbot.waitUntil(host.isActiveWindow, timeout=5_000)
    yield services
    runner.shutdown()
    services.telemetry.stop()
    # Each job leaves once its thread's end is heard. A bound for a hung job: a look-up a test set off at its end
    # (a device chosen: what was measured for it) may still be importing torch on a busy machine.
    qtbot.waitUntil(lambda: not runner.jobs, timeout=60_000)


def _make_window(qtbot, registry, settings, enable_3d):
    from app.window.main_window import MainWindow

    window = MainWindow(registry=registry, settings=settings, enable_3d=enable_3d, preload_torch=False)
    qtbot.addWidget(window)
    window.resize(1500, 920)
    window.show()
    qtbot.waitExposed(window)
    window.activateWindow()  # keyboard shortcuts only fire in the active window
    qtbot.waitUntil(window.isActiveWindow, timeout=5_000)
    return window


@pytest.fixture
def main_window(qtbot, themed_app, registry, qt_settings, error_dialogs):
    """The main window over the tiny test models, without the 3D view (fast)."""
    window = _make_window(qtbot, registry, qt_settings, enable_3d=False)
    yield window
    window.close()
    assert not window.runner.jobs


@pytest.fixture(scope="session")
def tissue_models_dir(tmp_path_factory):
    """A tiny latent model that makes paired tissue maps in MNI space, as the shipped model does: output
    channel 0 is the image, channels 1-4 are GM, WM, CSF and ventricles (random weights: noise)."""
    import dataclasses

    from engine.models.export import save_model_folder
    from engine.testing import build_tiny_networks, tiny_spec

    spec = tiny_spec("tiny-tissue")
    networks = dict(spec.networks)
    networks["autoencoder"] = {**networks["autoencoder"], "in_channels": 5, "out_channels": 5}
    spec = dataclasses.replace(
        spec,
        name="Tiny tissue test model",
        networks=networks,
        output_shape=(5, *spec.output_shape[1:]),
        space="MNI152NLin2009aSym",
        world_affine=((2.0, 0.0, 0.0, -16.0), (0.0, 2.0, 0.0, -30.0), (0.0, 0.0, 2.0, -10.0), (0, 0, 0, 1.0)),
        label_channels=("GM", "WM", "CSF", "ventricles"),
    )
    root = tmp_path_factory.mktemp("tissue-models")
    save_model_folder(root / "tiny-tissue", spec, build_tiny_networks(spec), card="# Tiny tissue model\n")
    return root


@pytest.fixture
def tissue_window(qtbot, themed_app, tiny_models_dir, tissue_models_dir, qt_settings, error_dialogs):
    """The main window (no 3D view) over the tiny test models and the tiny tissue-map model."""
    from engine.models.registry import ModelRegistry

    registry = ModelRegistry([tiny_models_dir, tissue_models_dir])
    window = _make_window(qtbot, registry, qt_settings, enable_3d=False)
    window.state.select_model(window.state.model_by_id("tiny-tissue"))
    yield window
    window.close()
    assert not window.runner.jobs


@pytest.fixture
def window_3d(qtbot, themed_app, registry, qt_settings, error_dialogs):
    """The main window with its 3D view attached (pyvista imported in the background). It does not wait to
    become the active window: under Xvfb (no window manager) a second 3D window in one process never does, and
    which test makes the first depends on the order tests run in. Tests that use it send their keys to the
    widgets themselves or trigger actions, so they need no window shortcut."""
    from app.window.main_window import MainWindow

    window = MainWindow(registry=registry, settings=qt_settings, enable_3d=True, preload_torch=False)
    qtbot.addWidget(window)
    window.resize(1500, 920)
    window.show()
    qtbot.waitExposed(window)
    if not window.viewer.view3d.ready:
        with qtbot.waitSignal(window.view3d_ready, timeout=90_000):
            pass
    yield window
    window.close()


@pytest.fixture
def screenshot():
    """``screenshot(window, name)`` saves what is on screen (GL content included) to SCREENSHOTS."""

    def save(window, name: str) -> Path:
        from PySide6.QtWidgets import QApplication

        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        QApplication.processEvents()
        path = SCREENSHOTS / f"{name}.png"
        pixmap = window.screen().grabWindow(window.winId())
        assert not pixmap.isNull()
        assert pixmap.save(str(path))
        return path

    return save


@pytest.fixture(scope="session")
def nibabel_data() -> Path:
    from nibabel.testing import data_path

    return Path(data_path)


@pytest.fixture(scope="session")
def mni_t1() -> Path:
    """A real brain T1 (the MNI152 template the product ships in resources/mni152), for screenshots worth
    looking at."""
    from engine.anatomy import mni152

    return mni152.path("t1")


@pytest.fixture(scope="module")
def xla_server(tmp_path_factory):
    """A real ``volsynth serve --device xla`` (tiny model) in its own process, shared by a module's tests."""
    from tests.app.remote.xla_server import xla_server as running_xla_server

    with running_xla_server(tmp_path_factory.mktemp("xla-models")) as url:
        yield url
