"""The counting rules of packaging/structure_report.py, on small sources held in memory."""

from __future__ import annotations

import ast
import importlib.util
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "packaging" / "structure_report.py"


@pytest.fixture(scope="module")
def report():
    spec = importlib.util.spec_from_file_location("structure_report", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


def fake_source(report, files: dict[str, str]):
    """A Source over ``files`` (path -> text) instead of a revision."""

    class InMemory(report.Source):
        def __init__(self):
            self.rev = None
            self.paths = sorted(files)
            self._trees = {}

        def text(self, path):
            return textwrap.dedent(files[path])

    return InMemory()


def test_a_setting_is_mentioned_by_code_not_by_prose_or_torch(report):
    tree = ast.parse(
        textwrap.dedent(
            """
            # attention: a comment is prose
            use = config.tf32                           # attribute: a mention
            make(decoder_autocast="bf16")               # keyword: a mention
            parser.add_argument("--unet-subpixel")      # its flag: a mention
            row = {"streamed_decode": True}             # its name as a string: a mention
            with torch.autocast("cpu"):                 # torch's own autocast: none
                pass
            text = "the attention kernel"               # a sentence holding the word: none
            """
        )
    )
    names = {"tf32", "decoder_autocast", "unet_subpixel", "streamed_decode", "autocast", "attention"}
    assert report._mentions(tree, names) == {"tf32", "decoder_autocast", "unet_subpixel", "streamed_decode"}


def test_window_reads_follow_the_window_into_the_code_it_is_handed_to(report):
    source = fake_source(
        report,
        {
            "app/feature.py": """
                def install_feature(window):
                    window.menu.addAction("x")          # read: menu
                    _wire(window.state, window)         # read: state; handed to _wire
                    return Piece(window, name="p")      # handed to Piece

                def _wire(state, win):
                    win.show_status("wired")            # read: show_status

                class Piece:
                    def __init__(self, owner, name):
                        self._owner = owner             # kept
                        owner.runner.start()            # read: runner

                    def later(self):
                        return self._owner.settings     # read through self: settings

                def install_other(settings):            # no window: not a feature installer
                    settings.value("x")
                """,
        },
    )
    features = report.window_reads(source)
    assert list(features) == ["app/feature.py:install_feature"]
    reads = features["app/feature.py:install_feature"]
    assert reads.attrs == {"menu", "state", "show_status", "runner", "settings"}
    assert reads.handed_to == {"_wire()", "Piece"}
    assert report.installers_without_window(source) == {"app/feature.py:install_other": "settings"}


def test_window_reads_follow_the_services_field_that_is_the_window(report):
    """A feature handed the services reads nothing off the window; a read off ``services.parent`` (or off a
    name it is given to, or in code the services are handed to) is a window read."""
    source = fake_source(
        report,
        {
            "app/feature.py": """
                def install_clean(services):
                    services.menus.generate.addAction("x")   # the services' own fields: none
                    return Dialog(services.parent)           # handed on as a parent only: none

                def install_leaky(services):
                    services.parent.statusBar()              # read: statusBar
                    owner = services.parent
                    owner.generate_menu.addSeparator()       # read through a local name: generate_menu
                    return Panel(services)                   # the services handed on

                class Dialog:
                    def __init__(self, parent):
                        super().__init__(parent)

                class Panel:
                    def __init__(self, app):
                        self.app = app                       # kept

                    def later(self):
                        return self.app.parent.runner        # read through the kept services: runner
                """,
        },
    )
    features = report.window_reads(source)
    assert features["app/feature.py:install_clean"].attrs == set()
    leaky = features["app/feature.py:install_leaky"]
    assert leaky.attrs == {"statusBar", "generate_menu", "runner"}
    assert leaky.handed_to == {"Panel"}
    assert report.installers_without_window(source) == {}


def test_main_window_attributes_reached_through_parent_calls_are_window_reads(report):
    source = fake_source(
        report,
        {
            "app/window/main_window.py": """
                class MainWindow:
                    volume_opened = Signal(object)

                    def __init__(self):
                        self.runner = JobRunner()
                        self.window().runner                 # the window's own code: not counted

                    def show_status(self, text):
                        pass
                """,
            "app/window/menus.py": """
                def build_menus(window):
                    window.generate_menu = window.menuBar().addMenu("Generate")
                """,
            "app/feature/panel.py": """
                class Panel:
                    def later(self):
                        self.window().show_status("x")       # a main-window method: counted
                        self.parentWidget().generate_menu    # set on the window by its menus: counted
                        self.parent().visualRect(None)       # not a main-window name: not counted
                        self.window().runner.run_task()      # counted
                """,
        },
    )
    assert report.parent_chain_reads(source) == [
        "app/feature/panel.py:4 window().show_status",
        "app/feature/panel.py:5 parentWidget().generate_menu",
        "app/feature/panel.py:7 window().runner",
    ]


def test_no_feature_reads_the_main_window(report):
    """Every feature is installed with the app's services and reads nothing off the main window."""
    source = report.Source(None)
    features = report.window_reads(source)
    assert features and all(name.split(":")[1].startswith("install_") for name in features)
    assert {name: reads.attrs for name, reads in features.items() if reads.attrs} == {}
    assert report.parent_chain_reads(source) == []


def test_writers_are_the_call_sites_and_the_public_functions_above_them(report):
    source = fake_source(
        report,
        {
            "engine/io.py": """
                import nibabel as nib

                def _write(image, path):
                    nib.save(image, path)               # a call site

                def save_thing(image, path):            # public, above a private writer: a wrapper
                    _write(image, path)

                def export_all(items):                  # calls a wrapper: a user, not a wrapper
                    for image, path in items:
                        save_thing(image, path)

                def write_map(image, path):             # public and a call site itself
                    image.to_filename(path)
                """,
            "app/files.py": """
                def save_files(image, path):            # calls the public call site: a wrapper
                    write_map(image, path)
                """,
        },
    )
    sites, wrappers = report.volume_writers(source)
    assert sites == ["engine/io.py:15 write_map", "engine/io.py:5 _write"]
    assert wrappers == ["app/files.py save_files", "engine/io.py save_thing"]


@pytest.mark.slow
def test_the_product_writes_a_volume_in_one_place(report):
    """Every NIfTI the engine and the app write goes through engine.nifti.io.save_volumes (save_volume is its
    one-volume form): the CLI, Compare, cohorts, segmentation, the app's Save As and crash recovery."""
    sites, wrappers = report.volume_writers(report.Source(None))
    assert sites and all(site.startswith("engine/nifti/io.py:") for site in sites)
    assert wrappers == ["engine/nifti/io.py save_volumes"]
