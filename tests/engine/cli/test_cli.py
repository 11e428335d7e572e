"""The `volsynth` command line: a real generation end to end, and one-line errors for bad input."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from engine.cli import main

REPO = Path(__file__).resolve().parents[3]


def _files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_generate_writes_nifti_and_sidecar(model_path_env, tmp_path, capsys):
    out = tmp_path / "vol.nii.gz"
    code = main(
        [
            "generate",
            "--model",
            "tiny-latent",
            "--steps",
            "3",
            "--seed",
            "7",
            "--cond",
            "brain_volume=1100",
            "--device",
            "cpu",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    assert _files(tmp_path) == ["vol.json", "vol.nii.gz"]
    image = nib.load(out)
    assert image.shape == (16, 24, 16)
    assert nib.aff2axcodes(image.affine) == ("R", "A", "S")
    assert np.allclose(image.header.get_zooms(), (2, 2, 2))
    assert b"SYNTHETIC" in image.header["descrip"].item()
    sidecar = json.loads((tmp_path / "vol.json").read_text())
    assert sidecar["synthetic"] is True and sidecar["seed"] == 7
    assert sidecar["conditioning"]["brain_volume"] == 1100.0
    assert sidecar["telemetry"]["duration_s"] > 0 and "energy_j" in sidecar["telemetry"]
    captured = capsys.readouterr()
    assert str(out) in captured.out
    assert "denoise" in captured.err


def test_generate_batch_writes_one_file_per_volume(model_path_env, tmp_path):
    assert (
        main(
            [
                "generate",
                "--model",
                "tiny-pixel",
                "--steps",
                "2",
                "--batch",
                "2",
                "--out",
                str(tmp_path / "b.nii"),
            ]
        )
        == 0
    )
    assert _files(tmp_path) == ["b_00.json", "b_00.nii", "b_01.json", "b_01.nii"]


def test_models_lists_conditioning(model_path_env, capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "tiny-latent" in out
    assert "--cond brain_volume=VALUE   Brain volume: 900 to 1500 mL (default 1200)" in out


def test_info_lists_cpu(capsys):
    assert main(["info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["devices"][0]["id"] == "cpu"
    assert "torch" in info["versions"]


@pytest.mark.parametrize(
    ("args", "message", "code"),
    [
        (["--model", "no-such-model"], "unknown model 'no-such-model'; available:", 3),
        (["--steps", "0"], "--steps must be at least 1", 2),
        (["--cond", "age=30"], "has no condition 'age'", 2),
        (["--cond", "brain_volume=99999"], "outside the model's range [900, 1500] mL", 2),
        (["--sampler", "rflow"], "cannot sample with 'rflow'", 2),
    ],
)
def test_bad_input_gives_one_line_error(model_path_env, tmp_path, capsys, args, message, code):
    argv = ["generate", "--model", "tiny-latent", "--steps", "2", *args, "--out", str(tmp_path / "x.nii.gz")]
    # the last --model wins in argparse, so the unknown-model case overrides the default above
    assert main(argv) == code
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("volsynth: error: ") and message in err[-1]
    assert "Traceback" not in "\n".join(err)
    assert _files(tmp_path) == []


def test_output_folder_errors(model_path_env, tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    assert main(["generate", "--model", "tiny-latent", "--out", str(tmp_path / "nope" / "x.nii.gz")]) == 7
    assert "does not exist; create it" in capsys.readouterr().err
    assert main(["generate", "--model", "tiny-latent", "--out", str(tmp_path / "afile" / "x.nii.gz")]) == 7
    assert "is not a folder" in capsys.readouterr().err
    assert main(["generate", "--model", "tiny-latent", "--out", str(tmp_path / "x.png")]) == 2
    assert "must end in .nii.gz or .nii" in capsys.readouterr().err
    assert _files(tmp_path) == ["afile"]


def test_unwritable_output_folder(model_path_env, tmp_path, capsys, monkeypatch):
    # As root, permission bits do not stop writes; simulate the kernel's answer instead.
    import tempfile

    def refuse(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    assert main(["generate", "--model", "tiny-latent", "--out", str(tmp_path / "x.nii.gz")]) == 7
    assert "permission denied or read-only; choose a writable folder" in capsys.readouterr().err
    assert _files(tmp_path) == []


def test_full_disk_leaves_no_partial_file(model_path_env, tmp_path, capsys, monkeypatch):
    import nibabel.nifti1

    (tmp_path / "keep.nii.gz").write_bytes(b"previous result")

    def disk_full(self, filename, *args, **kwargs):
        with open(filename, "wb") as handle:
            handle.write(b"\0" * 1000)  # the write gets part-way, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(nibabel.nifti1.Nifti1Image, "to_filename", disk_full)
    code = main(
        ["generate", "--model", "tiny-latent", "--steps", "2", "--out", str(tmp_path / "keep.nii.gz")]
    )
    assert code == 7
    assert "the disk is full" in capsys.readouterr().err
    assert _files(tmp_path) == ["keep.nii.gz"]
    assert (tmp_path / "keep.nii.gz").read_bytes() == b"previous result"


@pytest.mark.slow
def test_ctrl_c_cancels_cleanly(tiny_models_dir, tmp_path):
    env = dict(os.environ, VOLSYNTH_MODEL_PATH=str(tiny_models_dir), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "engine",
            "generate",
            "--model",
            "tiny-latent",
            "--steps",
            "1000",
            "--out",
            str(tmp_path / "x.nii.gz"),
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    seen = ""
    while time.monotonic() < deadline and "denoise" not in seen:
        seen += proc.stderr.readline()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert "cancelled" in err and "Traceback" not in err
    assert _files(tmp_path) == []


def test_generate_records_optimization_flags(model_path_env, tmp_path):
    out = tmp_path / "o.nii.gz"
    assert (
        main(
            [
                "generate",
                "--model",
                "tiny-latent",
                "--steps",
                "2",
                "--autocast",
                "bf16",
                "--channels-last",
                "--tf32",
                "--streamed-decode",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    report = json.loads((tmp_path / "o.json").read_text())["optimization"]["report"]
    assert report["autocast"]["applied"] and report["channels_last_3d"]["applied"]
    assert report["streamed_decode"]["applied"]
    assert not report["tf32"]["applied"] and "NVIDIA GPU" in report["tf32"]["reason"]


def test_refused_optimization_is_one_line(model_path_env, tmp_path, capsys):
    assert (
        main(["generate", "--model", "tiny-latent", "--cuda-graphs", "--out", str(tmp_path / "x.nii")]) == 2
    )
    assert "CUDA graphs need an NVIDIA GPU" in capsys.readouterr().err
    assert _files(tmp_path) == []


def test_help_offers_the_registered_samplers_and_no_empty_choice(capsys):
    from engine.samplers import sampler_names

    with pytest.raises(SystemExit) as exited:
        main(["generate", "--help"])
    assert exited.value.code == 0
    text = capsys.readouterr().out
    # the registry's names (engine/samplers), not a copy written out for the CLI
    assert "{" + ",".join(sampler_names()) + "}" in text and "{," not in text and ",}" not in text


def test_progress_counts_the_steps_of_the_run_in_progress():
    """Two runs on one step counter (how `volsynth compare` reports A then B): B's rate is B's own steps."""
    import io

    from engine.api import Progress
    from engine.cli._progress import ProgressLine

    now = [0.0]
    stream = io.StringIO()
    line = ProgressLine(stream, clock=lambda: now[0])

    def run(first: int, per_run: int, total: int, seconds_per_step: float) -> str:
        line.update(Progress("load", 0, 1, now[0], "loading"))
        line.update(Progress("denoise", first, total, now[0], "denoising"))
        for step in range(first + 1, first + per_run + 1):
            now[0] += seconds_per_step
            line.update(Progress("denoise", step, total, now[0], f"step {step}"))
        line.update(Progress("decode", first + per_run, total, now[0], "decoding"))
        return [text for text in stream.getvalue().splitlines() if text.startswith("denoise")][-1]

    assert run(0, 10, 20, 0.5).endswith("10/20  2.00 steps/s  ETA 0:05")
    assert run(10, 10, 20, 2.0).endswith("20/20  0.50 steps/s  ETA 0:00")  # B is slower: 0.5, not 1.0


def test_generate_progress_counts_steps_not_batch_or_guidance(model_path_env, tmp_path, capsys):
    steps = 4
    argv = ["generate", "--model", "tiny-latent", "--steps", str(steps), "--batch", "2", "--guidance", "3"]
    assert main([*argv, "--out", str(tmp_path / "g.nii.gz")]) == 0
    counts = [
        text.split("]")[1].split()[0] for text in capsys.readouterr().err.splitlines() if "denoise [" in text
    ]
    assert counts[0] == f"0/{steps}" and counts[-1] == f"{steps}/{steps}"


@pytest.mark.slow
def test_kernel_profiling_keeps_torch_profiler_lines_off_the_terminal(tiny_models_dir, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "KINETO_LOG_LEVEL"}
    env["VOLSYNTH_MODEL_PATH"] = str(tiny_models_dir)
    argv = ["compare", "--model", "tiny-pixel", "--steps", "3", "--b", "bf16", "--profile-steps", "2"]
    done = subprocess.run(
        [sys.executable, "-m", "engine", *argv, "--device", "cpu", "--out", str(tmp_path / "c")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "top operators" in done.stdout  # the profile ran and was reported
    for noise in ("USDT", "STAGE:", "profiler_start"):
        assert noise not in done.stderr and noise not in done.stdout


@pytest.mark.slow
def test_profiling_in_a_worker_thread_writes_nothing_to_the_terminal(tiny_models_dir):
    env = {k: v for k, v in os.environ.items() if k != "KINETO_LOG_LEVEL"}
    env["VOLSYNTH_MODEL_PATH"] = str(tiny_models_dir)
    done = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("child_profile_in_a_thread.py"))],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "profiled steps [2, 3]" in done.stdout
    for noise in ("USDT", "STAGE:", "External init callback", "ERROR:"):
        assert noise not in done.stderr
