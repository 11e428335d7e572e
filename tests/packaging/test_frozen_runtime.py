"""The installable build holds what the product uses at run time, checked in seconds without building it.

The bundle lacks every module the spec (packaging/volsynth.spec) excludes and every package that is no
run-time requirement (its build environment holds only those: packaging/build.sh). tests/packaging/
frozen_run.py runs the main run-time paths in a child process where exactly those modules are absent: the
CLI's generate (anatomy check, tissue maps), segment, quality report, Get Models offline and vault, and the
app's 3D view with the anatomy line. A path that imports a module the bundle lacks fails here as it would
in the bundle, and every data file it reads from the checkout must lie under a folder the spec's ``datas``
ship. The full build and its smoke test (packaging/build.sh) remain the end-to-end check.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUNNER = ROOT / "tests" / "packaging" / "frozen_run.py"
sys.path.insert(0, str(ROOT / "packaging"))
import frozen_contents  # noqa: E402

sys.path.remove(str(ROOT / "packaging"))


def _run(part: str, work: Path, env: dict[str, str], timeout: int) -> dict:
    report = work / f"{part}-report.json"
    try:
        proc = subprocess.run(
            [sys.executable, str(RUNNER), part, str(work), str(report)],
            cwd=work,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as exc:
        partial = exc.output.decode(errors="replace") if isinstance(exc.output, bytes) else exc.output or ""
        pytest.fail(f"the {part} run took over {timeout} s:\n{partial[-4000:]}")
    output = proc.stdout
    assert proc.returncode == 0 and report.exists(), output[-4000:]
    out = json.loads(report.read_text())
    out["output"] = output
    return out


def _explain(run: dict) -> str:
    """A child's output, led by the absent modules it tried to import, said the way a packager needs it."""
    tried = run.get("tried_absent") or []
    lead = (
        f"modules the installable build does not hold that the run tried to import: {', '.join(tried)} "
        "(packaging/volsynth.spec excludes them, or they are no run-time requirement in pyproject.toml; a "
        "failure below that names one: ship it, or stop importing it at run time)\n"
        if tried
        else ""
    )
    return lead + run["output"][-6000:]


def _child_env(work: Path, tiny_models_dir: Path) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("VOLSYNTH_", "PYTEST_", "HF_", "NILEARN_")) and key != "PYTHONPATH"
    }
    env.update(
        PYTHONPATH=str(ROOT),  # this checkout's engine and app, not another install's
        HOME=str(work / "home"),
        XDG_DATA_HOME=str(work / "home" / "data"),
        XDG_CONFIG_HOME=str(work / "home" / "config"),
        XDG_CACHE_HOME=str(work / "home" / "cache"),
        VOLSYNTH_MODEL_PATH=str(tiny_models_dir),
    )
    return env


def _data_files_outside_datas(opened: list[str]) -> list[str]:
    """Files read from the checkout that are neither code (collected by the analysis) nor under a folder the
    spec's ``datas`` ship."""
    shipped = [source for source, _ in frozen_contents.spec_data_folders()]
    # The environment the test runs in (CI's .venv lies inside the checkout) holds the libraries, which the
    # analysis and their hooks collect; so does the project's own installation record (*.egg-info).
    environment = Path(sys.prefix).resolve()
    missing = []
    for name in opened:
        path = Path(name).resolve()
        if not path.is_relative_to(ROOT) or not path.is_file() or path.is_relative_to(environment):
            continue
        rel = path.relative_to(ROOT)
        if rel.parts[0].endswith(".egg-info"):
            continue
        if rel.parts[0] in ("engine", "app") and (
            path.suffix in (".py", ".pyc") or "__pycache__" in rel.parts
        ):
            continue
        if rel.parts[0] == "tests":
            continue  # the test's own runner
        if not any(path.is_relative_to(source) for source in shipped):
            missing.append(str(rel))
    return sorted(set(missing))


@pytest.fixture(scope="module")
def work(tmp_path_factory, tiny_models_dir):
    import nibabel as nib

    from tests.engine.anatomy.phantoms import phantom, phantom_affine

    folder = tmp_path_factory.mktemp("frozen-run")
    (folder / "home").mkdir()
    nib.save(nib.Nifti1Image(phantom("t1w"), phantom_affine()), folder / "phantom_T1w.nii.gz")
    return folder


@pytest.fixture(scope="module")
def engine_run(work, tiny_models_dir):
    return _run("engine", work, _child_env(work, tiny_models_dir), timeout=300)


def test_the_specs_lists_are_read_from_the_spec():
    excludes = frozen_contents.spec_excludes()
    assert "pytest" in excludes and "jax" in excludes
    assert (ROOT / "resources", "resources") in frozen_contents.spec_data_folders()


def test_what_the_bundle_lacks_includes_the_dev_tools():
    absent = set(frozen_contents.absent_modules())
    assert {"pytest", "mypy", "ruff"} <= absent  # dev tools: never in the build environment
    assert not {"torch", "monai", "nibabel", "engine", "app", "PySide6", "pyvista"} & absent


@pytest.mark.slow
def test_the_cli_paths_run_with_only_what_the_bundle_holds(engine_run, work):
    steps = engine_run.get("result") or {}
    failed = {name: step for name, step in steps.items() if step.get("error")}
    assert not engine_run.get("error") and not failed, _explain(engine_run)
    for name in ("models", "generate", "segment", "quality", "vault init", "vault import", "vault ls"):
        assert steps[name]["rc"] == 0, f"volsynth {name} exited {steps[name]['rc']}\n" + _explain(engine_run)
    # Offline, Get Models ends with what to fetch elsewhere and how to add it (exit code 5: unreachable).
    assert steps["models get (offline)"]["rc"] == 5
    assert "volsynth models add FOLDER --model nv-generate-mr-brain" in engine_run["output"]

    sidecar = json.loads((work / "gen.json").read_text())
    check = sidecar["anatomy_check"]
    assert check["status"] in ("within", "outside", "not_brain_like") and check["verdict"], check
    assert check["space_scale"] > 1.0  # the template's brain against a native one: the MNI152 data were read
    for name in sidecar["tissue_maps"].values():
        assert (work / name).stat().st_size > 0
    for tissue in ("GM", "WM", "CSF", "brain"):
        assert (work / "seg" / f"phantom_label-{tissue}_probseg.nii.gz").stat().st_size > 0
    assert json.loads((work / "quality.json").read_text()) and (work / "quality.png").stat().st_size > 0


def test_the_cli_reads_its_data_only_from_folders_the_bundle_ships(engine_run):
    missing = _data_files_outside_datas(engine_run["opened"])
    assert not missing, (
        f"read at run time but not under the spec's datas (packaging/volsynth.spec): {missing}"
    )


@pytest.mark.render
@pytest.mark.skipif(
    not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")),
    reason="needs an X display: run under xvfb-run with QT_QPA_PLATFORM=xcb",
)
@pytest.mark.slow
def test_the_apps_3d_view_and_anatomy_line_with_only_what_the_bundle_holds(engine_run, work, tiny_models_dir):
    assert (work / "gen.nii.gz").exists(), "volsynth generate wrote no volume to show\n" + _explain(
        engine_run
    )
    env = _child_env(work, tiny_models_dir)
    env["QT_QPA_PLATFORM"] = "xcb"
    run = _run("app", work, env, timeout=180)
    assert not run.get("error"), _explain(run)
    result = run["result"]
    assert result["3d_view"] == "drawn", result["3d_view"] + "\n" + _explain(run)
    assert not result["dialogs"], result["dialogs"]
    assert "anatomy check:" in result["details"] and "could not be checked" not in result["details"], result
    missing = _data_files_outside_datas(run["opened"])
    assert not missing, (
        f"read at run time but not under the spec's datas (packaging/volsynth.spec): {missing}"
    )
