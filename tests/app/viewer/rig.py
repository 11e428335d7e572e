"""The viewer's features on ``AppServices``, without the main window: the slice and 3D views in the host's centre,
the viewer's and the tissue overlay's tool bars with their View menu entries and Compute Tissue Maps
(``build_viewer_bars``, as the window builds them), opening and saving files (``VolumeFiles``), the session
panel, and the generation (``install_generation``) for the tests that need a run."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest

from app.generation import GenerationController
from app.panels.sampling_panel import SamplingPanel
from app.panels.session_panel import SessionPanel
from app.services import AppServices
from app.viewer.tissue_compute import TissueMapsComputer
from app.viewer.tissue_toolbar import TissueToolbar
from app.viewer.toolbar import ViewerToolbar
from app.viewer.viewer_area import ViewerArea
from app.window.menus import build_viewer_bars
from app.window.tool_bar_rows import ToolBarRows
from app.window.volume_files import VolumeFiles
from tests.app.generating import dock_generate_panel, dock_session_panel, install_runs, volume_files


@dataclass
class ViewerRig:
    services: AppServices
    viewer: ViewerArea
    toolbar: ViewerToolbar
    tissue_toolbar: TissueToolbar
    tissue_maps: TissueMapsComputer
    files: VolumeFiles
    session_panel: SessionPanel
    sampling_panel: SamplingPanel | None = None  # with the generation (``add_generation``)
    generation: GenerationController | None = None

    @property
    def runner(self):
        return self.services.runner

    @property
    def state(self):
        return self.services.state

    @property
    def host(self):
        return self.services.parent

    def message(self) -> str:
        """The status bar's message now."""
        return self.host.statusBar().currentMessage()

    def open(self, qtbot, path):
        """Open a NIfTI file as File > Open does (in the background); the entry once it is shown."""
        with qtbot.waitSignal(self.services.volume_opened, timeout=30_000) as blocker:
            self.files.open_path(path)
        return blocker.args[0]


def build_viewer(qtbot, services: AppServices, enable_3d: bool = False) -> ViewerRig:
    """The viewer and its tool bars on ``services``' host window, shown; with ``enable_3d`` the 3D view's
    interactor is attached (pyvista imported here, as the window's preloader does in the background)."""
    host = services.parent
    # The viewer's tool bars on rows of their own where one row has no room, as in the window.
    services = dataclasses.replace(
        services, menus=dataclasses.replace(services.menus, add_fitted_tool_bars=ToolBarRows(host).add)
    )
    viewer = ViewerArea(services.state)
    host.setCentralWidget(viewer)
    reset_camera = services.menus.view.addAction("Reset 3D &Camera")
    reset_camera.triggered.connect(viewer.view3d.reset_camera)
    bars = build_viewer_bars(viewer, services, reset_camera)
    files = volume_files(services)
    session_panel = dock_session_panel(services)
    if enable_3d:
        import pyvista  # noqa: F401 - what the window imports in the background before attaching
        import pyvistaqt  # noqa: F401

        viewer.view3d.attach_interactor()
        assert viewer.view3d.ready
    host.resize(1500, 920)
    qtbot.waitUntil(lambda: viewer.isVisible() and viewer.axial.width() > 100, timeout=10_000)
    return ViewerRig(
        services=services,
        viewer=viewer,
        toolbar=bars.toolbar,
        tissue_toolbar=bars.toolbar.tissue_toolbar,
        tissue_maps=bars.tissue_maps,
        files=files,
        session_panel=session_panel,
    )


def add_generation(qtbot, rig: ViewerRig) -> ViewerRig:
    """Generate, Cancel and the run lifecycle for the Generate form, in a dock of the host, as the window
    installs them; ``tests.app.runs.generate(qtbot, rig, click=True)`` runs the form's request (its button)."""
    services = rig.services
    rig.sampling_panel = dock_generate_panel(services)
    rig.generation = install_runs(services, rig.sampling_panel)
    view3d = rig.viewer.view3d
    if view3d.ready:  # the 3D scene drawn again at the size the Generate dock leaves it, before any run
        drawn: list[bool] = []
        observer = view3d.plotter.ren_win.AddObserver("EndEvent", lambda *_: drawn.append(True))
        qtbot.waitUntil(lambda: bool(drawn), timeout=30_000)
        view3d.plotter.ren_win.RemoveObserver(observer)
    return rig


TISSUE_NAMES = ["GM", "WM", "CSF", "ventricles"]
MNI = "MNI152NLin2009aSym"


def add_tissue_volume(state, shape=(16, 20, 16), seed=0):
    """A volume as a model with paired tissue maps makes it (image in channel 0, maps GM, WM, CSF and
    ventricles in channels 1-4, MNI space, random values as random weights give), added to the session as
    a generation adds its result, and shown."""
    import numpy as np

    from engine.api import SamplingRequest, SamplingResult

    rng = np.random.default_rng(seed)
    affine = np.array(
        [[2.0, 0, 0, -16.0], [0, 2.0, 0, -30.0], [0, 0, 2.0, -10.0], [0, 0, 0, 1.0]]
    )  # the tiny tissue model's grid
    result = SamplingResult(
        volumes=rng.random((1, 1 + len(TISSUE_NAMES), *shape)).astype(np.float32),
        affine=affine,
        request=SamplingRequest(model="tiny-tissue", seed=seed),
        provenance={"label_channels": list(TISSUE_NAMES), "space": MNI, "seed": seed},
    )
    return state.add_result(result)[0]


@pytest.fixture
def viewer_rig(qtbot, app_services):
    """The viewer and its tool bars on ``app_services`` (no 3D view)."""
    return build_viewer(qtbot, app_services)


@pytest.fixture
def viewer_rig_3d(qtbot, app_services):
    """The viewer with its 3D view attached, on ``app_services``."""
    rig = build_viewer(qtbot, app_services, enable_3d=True)
    yield rig
    rig.viewer.view3d.close_interactor()


@pytest.fixture(name="registry")
def registry_with_tissue_model(tiny_models_dir, tissue_models_dir):
    """The tiny test models and the tiny tissue-map model (``tiny-tissue``); imported by a test module, it is
    the registry its ``app_services`` lists."""
    from engine.models.registry import ModelRegistry

    return ModelRegistry([tiny_models_dir, tissue_models_dir])
