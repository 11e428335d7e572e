"""Shared fixtures: tiny models in a private registry, and the gpu marker's skip."""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

# Tests never touch the user's real data, settings or caches: each run (each worker when runs are parallel) has
# its own folders, in one scratch folder removed when the run passes. Caches (int8 calibration, mixed plans, XLA
# plans) start empty: a plan kept by an earlier run would let a test pass without the work it checks.
RUN_FOLDER = Path(tempfile.mkdtemp(prefix="volsynth-tests-"))
for _variable, _name in [
    ("XDG_DATA_HOME", "data"),
    ("XDG_CONFIG_HOME", "config"),
    ("XDG_CACHE_HOME", "cache"),
    ("VOLSYNTH_TUNE_DIR", "tune"),
]:
    os.environ[_variable] = str(RUN_FOLDER / _name)  # even where the user's session sets it


def _own_display_and_core_for_this_worker() -> None:
    """When pytest-xdist runs the suite in parallel (``-n 2``), each worker gets an X display of its own and one
    compute thread. Windows of two processes on one display with no window manager take each other's focus, so
    keyboard tests would fail by chance; and two workers with torch's default thread count on a 2-core machine
    oversubscribe it (OpenMP threads spin while they wait)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(variable, "1")
    if not shutil.which("Xvfb"):
        return
    read_end, write_end = os.pipe()
    server = subprocess.Popen(
        ["Xvfb", "-displayfd", str(write_end), "-screen", "0", "1600x1000x24", "-nolisten", "tcp"],
        pass_fds=(write_end,),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    os.close(write_end)
    number = b""
    while not number.endswith(b"\n"):  # Xvfb writes the display number it took once it accepts clients
        piece = os.read(read_end, 16)
        if not piece:
            raise RuntimeError(f"Xvfb ended before it opened a display (exit {server.wait()})")
        number += piece
    os.close(read_end)
    os.environ["DISPLAY"] = ":" + number.decode().strip()
    os.environ.pop("XAUTHORITY", None)  # xvfb-run's cookie is for its own display
    atexit.register(server.terminate)


_own_display_and_core_for_this_worker()

# The suite runs reduced precision on tiny models on purpose, on every CPU class: it carries the override
# that real requests must ask for (engine.optimization.apply.check_combination). Tests of the refusal itself clear
# it (the ``no_slower_override`` fixture) and feed recorded machine probes.
os.environ["VOLSYNTH_ALLOW_SLOWER"] = "1"


def pytest_sessionfinish(session, exitstatus):
    if exitstatus == 0:
        shutil.rmtree(RUN_FOLDER, ignore_errors=True)
    else:
        print(f"\nthe run's data, settings and caches: {RUN_FOLDER}")


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:  # pragma: no cover
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU with CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def no_slower_override(monkeypatch):
    """Requests must ask for the override themselves, as a user's do."""
    monkeypatch.delenv("VOLSYNTH_ALLOW_SLOWER", raising=False)


@pytest.fixture
def made_up_sampler():
    """A sampler registered for one test (``tests/made_up_sampler.py``); its name."""
    from engine.samplers import register_sampler, unregister_sampler
    from tests.made_up_sampler import HandWrittenDDIM

    register_sampler(HandWrittenDDIM)
    yield HandWrittenDDIM.name
    unregister_sampler(HandWrittenDDIM.name)


@pytest.fixture(scope="session")
def tiny_models_dir(tmp_path_factory):
    """A folder with a tiny conditioned latent model, an unconditioned pixel model and an rflow model."""
    from engine.testing import make_tiny_model

    root = tmp_path_factory.mktemp("models")
    make_tiny_model(root / "tiny-latent", model_id="tiny-latent")
    make_tiny_model(root / "tiny-pixel", model_id="tiny-pixel", kind="pixel", conditioned=False)
    make_tiny_model(
        root / "tiny-rflow", model_id="tiny-rflow", kind="pixel", conditioned=False, samplers=("rflow",)
    )
    return root


@pytest.fixture
def registry(tiny_models_dir):
    from engine.models.registry import ModelRegistry

    return ModelRegistry([tiny_models_dir])


@pytest.fixture
def model_path_env(tiny_models_dir, monkeypatch):
    """Point the default registry (as the CLI builds it) at the tiny models."""
    monkeypatch.setenv("VOLSYNTH_MODEL_PATH", str(tiny_models_dir))
    return tiny_models_dir
