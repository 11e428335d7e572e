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


def test_the_product_writes_a_volume_in_one_place(report):
    """Every NIfTI the engine and the app write goes through engine.nifti.io.save_volumes (save_volume is its
    one-volume form): the CLI, Compare, cohorts, segmentation, the app's Save As and crash recovery."""
    sites, wrappers = report.volume_writers(report.Source(None))
    assert sites and all(site.startswith("engine/nifti/io.py:") for site in sites)
    assert wrappers == ["engine/nifti/io.py save_volumes"]
