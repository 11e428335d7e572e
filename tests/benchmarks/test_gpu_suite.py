"""The GPU suite's runner: every part in its own process with a time limit; a part that hangs or crashes is
recorded as such and the rest still run; the JSON and the table are written."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from benchmarks import gpu_suite
from benchmarks.gpu_suite import Part, format_table, parse_junit, run_part_here, run_suite

PY = sys.executable


def _python(code: str, *args: str) -> tuple[str, ...]:
    return (PY, "-c", code, *args)


WRITE_OK = _python(
    "import json, sys; json.dump({'status': 'ok', 'value': 42}, open(sys.argv[1], 'w'))", "{result}"
)
# Saves a partial result, starts a child that records its pid, then hangs: the timeout must kill both.
PARTIAL_THEN_HANG = _python(
    "import json, subprocess, sys, time\n"
    "json.dump({'status': 'ok', 'rows_done': 3}, open(sys.argv[1], 'w'))\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
    "open(sys.argv[2], 'w').write(str(child.pid))\n"
    "time.sleep(600)",
    "{result}",
    "CHILD_PID",
)
ABORT = _python("import os; os.abort()")
NO_RESULT = _python("print('did nothing')")
RAISES = _python("raise RuntimeError('the GPU fell off the bus')")


def _alive(pid: int) -> bool:
    """Running (not gone, not a zombie waiting for its new parent to reap it)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


@pytest.mark.slow
def test_a_hanging_or_crashing_part_is_recorded_and_the_rest_still_run(tmp_path):
    pid_file = tmp_path / "child.pid"
    hang = tuple(a.replace("CHILD_PID", str(pid_file)) for a in PARTIAL_THEN_HANG)
    parts = [
        Part("hangs", 3.0, hang),
        Part("aborts", 30.0, ABORT),
        Part("writes-nothing", 30.0, NO_RESULT),
        Part("raises", 30.0, RAISES),
        Part("works", 30.0, WRITE_OK, optional=True),
    ]
    updates = []
    results = run_suite(parts, tmp_path, total_budget_s=300.0, on_update=updates.append, log=lambda m: None)
    outcome = results["parts"]

    assert outcome["hangs"]["status"] == "timed out"
    assert "3 s budget" in outcome["hangs"]["error"]
    assert outcome["hangs"]["result"] == {"status": "ok", "rows_done": 3}  # what it saved before hanging
    assert not _alive(int(pid_file.read_text()))  # its child went with it (process group killed)

    assert outcome["aborts"]["status"] == "crashed"
    assert "SIGABRT" in outcome["aborts"]["error"]
    assert outcome["writes-nothing"]["status"] == "crashed"
    assert outcome["writes-nothing"]["error"] == "exited without writing its result"
    assert "did nothing" in outcome["writes-nothing"]["output_tail"]
    assert outcome["raises"]["status"] == "crashed"
    assert "the GPU fell off the bus" in outcome["raises"]["output_tail"]

    assert outcome["works"]["status"] == "ok" and outcome["works"]["result"]["value"] == 42
    assert outcome["works"]["optional"] is True and "output_tail" not in outcome["works"]
    assert len(updates) == len(parts)  # the JSON is rewritten after every part


@pytest.mark.slow
def test_parts_get_at_most_the_time_left_and_are_skipped_when_it_is_spent(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_suite, "MIN_PART_S", 1.0)
    sleeper = _python("import time; time.sleep(600)")
    parts = [Part("slow", 500.0, sleeper), Part("never-starts", 10.0, WRITE_OK)]
    results = run_suite(parts, tmp_path, total_budget_s=2.0, log=lambda m: None)
    slow, never = results["parts"]["slow"], results["parts"]["never-starts"]
    assert slow["status"] == "timed out" and slow["timeout_s"] == pytest.approx(2.0, abs=0.1)
    assert slow["budget_s"] == 500.0
    assert never["status"] == "skipped" and "total budget spent" in never["error"]


def test_an_exception_in_a_part_function_is_written_as_its_crash_keeping_what_it_saved(tmp_path, monkeypatch):
    def part(ctx):
        ctx.save({"status": "ok", "first_network": "done"})
        raise RuntimeError("cuDNN error: CUDNN_STATUS_EXECUTION_FAILED")

    monkeypatch.setitem(gpu_suite.PARTS, "breaks", part)
    result_path = tmp_path / "breaks.json"
    assert run_part_here("breaks", result_path, tmp_path, smoke=True, budget_s=10) == 1
    result = json.loads(result_path.read_text())
    assert result["status"] == "crashed"
    assert result["error"] == "RuntimeError: cuDNN error: CUDNN_STATUS_EXECUTION_FAILED"
    assert result["first_network"] == "done"
    assert "Traceback" in result["traceback"]


def test_junit_report_says_which_tests_passed_failed_and_were_skipped(tmp_path):
    report = tmp_path / "r.xml"
    report.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.engine.test_a" name="test_ok" time="0.1"/>'
        '<testcase classname="tests.engine.test_a" name="test_bad"><failure message="assert 1 == 2"/></testcase>'
        '<testcase classname="tests.engine.test_b" name="test_gpu"><skipped message="needs an NVIDIA GPU"/>'
        "</testcase></testsuite></testsuites>"
    )
    tests = parse_junit(report)
    assert [t["test"] for t in tests["passed"]] == ["tests.engine.test_a::test_ok"]
    assert tests["failed"] == [{"test": "tests.engine.test_a::test_bad", "message": "assert 1 == 2"}]
    assert tests["skipped"][0]["message"] == "needs an NVIDIA GPU"
    assert tests["error"] == []


def test_the_gpu_tests_are_found_by_their_marker():
    files = gpu_suite._gpu_test_files()
    assert "tests/engine/telemetry/test_telemetry_gpu_hw.py" in files
    assert "tests/engine/test_compare.py" in files
    assert all(f.startswith("tests/") for f in files)


def test_settings_reported_applied_that_the_kernels_contradict_are_flagged():
    shares = dict.fromkeys(
        ("convolution", "gemm", "attention", "normalisation", "copy", "elementwise", "other"), 0.0
    )
    fp32 = {"shares": {**shares, "layout": 0.15}, "tensor_core_share": 0.0}
    good = {"shares": {**shares, "layout": 0.0}, "tensor_core_share": 0.7}
    bad = {"shares": {**shares, "layout": 0.3}, "tensor_core_share": 0.0}
    both = {"tf32": True, "channels_last_3d": True}
    assert gpu_suite.applied_but_not_seen(fp32, good, both) == []
    warnings = gpu_suite.applied_but_not_seen(fp32, bad, both)
    assert warnings[0] == "TF32 reported as applied, but no kernel name marks Tensor-Core use"
    assert "layout conversions take 30.0 % of kernel time (NCDHW run: 15.0 %)" in warnings[1]
    # Not applied (an old GPU): nothing to contradict.
    assert gpu_suite.applied_but_not_seen(fp32, bad, {"tf32": False, "channels_last_3d": False}) == []


def _outcome(status, seconds, result=None, **extra):
    return {"status": status, "seconds": seconds, "timeout_s": 60.0, "result": result, **extra}


def test_table_shows_every_part_and_the_measurements():
    share = {c: 0.0 for c in ("convolution", "gemm", "attention", "normalisation", "layout", "copy")}
    fp32 = {
        "shares": {**share, "convolution": 0.7, "layout": 0.2, "elementwise": 0.1, "other": 0.0},
        "tensor_core_share": 0.1,
        "ms_per_call": 40.0,
        "total_us": 80000.0,
    }
    fast = {
        "shares": {**share, "convolution": 0.9, "elementwise": 0.1, "other": 0.0},
        "tensor_core_share": 0.6,
        "ms_per_call": 10.0,
        "total_us": 20000.0,
    }
    rows = [
        {
            "network": "med-ddpm-128",
            "row": "fp32",
            "ms_per_step": 40.0,
            "tflops": 50.0,
            "fraction_of_peak": 0.75,
            "psnr_vs_fp32_db": float("inf"),
        },
        {
            "network": "med-ddpm-128",
            "row": "tf32+cl",
            "ms_per_step": 10.0,
            "tflops": 200.0,
            "fraction_of_peak": 0.4,
            "psnr_vs_fp32_db": 61.2,
            "speedup_vs_fp32": 4.0,
        },
        {
            "network": "med-ddpm-128",
            "row": "bf16+cl+sdpa+compile",
            "skipped": "time budget: 130 s of 215 s used",
        },
    ]
    results = {
        "smoke": False,
        "total_s": 512.0,
        "total_budget_s": 600.0,
        "install": {"mode": "venv", "seconds": 107.0},
        "parts": {
            "environment": _outcome(
                "ok",
                3.0,
                {
                    "device": "NVIDIA H200",
                    "compute_capability": "9.0",
                    "torch": "2.13.0+cu130",
                    "torch_cuda": "13.0",
                    "cudnn": 92000,
                },
            ),
            "gpu-tests": _outcome(
                "failed", 30.0, {"counts": {"passed": 1, "failed": 1, "error": 0, "skipped": 0}}
            ),
            "gpu-check": _outcome(
                "ok",
                200.0,
                {"check": {"device": "NVIDIA H200", "torch": "2.13.0+cu130", "rows": rows}, "row_errors": []},
            ),
            "kernel-shares": _outcome(
                "ok",
                40.0,
                {
                    "clock": "cuda kernels",
                    "networks": {
                        "med-ddpm-128": {
                            "fp32 NCDHW": fp32,
                            "tf32+channels-last": fast,
                            "tf32+cl vs fp32": {
                                "kernel_time_ratio": 4.0,
                                "tensor_core_share": [0.1, 0.6],
                                "layout_share": [0.2, 0.0],
                                "warnings": ["TF32 reported as applied, x"],
                            },
                        }
                    },
                },
            ),
            "generate-bundle": _outcome("timed out", 75.0, error="ran past its 75 s budget and was killed"),
            "nvml-4hz": _outcome(
                "ok",
                20.0,
                {
                    "samples": 33,
                    "achieved_hz": 4.0,
                    "span_s": 8.0,
                    "gpu_available": True,
                    "gpus": [
                        {
                            "index": 0,
                            "name": "NVIDIA H200",
                            "ranges": {"sm_util_pct": {"min": 0, "max": 100, "mean": 80}},
                        }
                    ],
                },
            ),
            "maisi-v2": _outcome("not available", 0.4, {"reason": "not available in this build: no loader"}),
        },
    }
    table = format_table(results)
    assert "device NVIDIA H200, torch 2.13.0+cu130; suite 512 s of 600 s budget" in table
    assert "set-up (venv) 107 s, apart from the budget" in table
    assert "1 passed, 1 failed, 0 errors, 0 skipped" in table
    assert "timed out" in table and "ran past its 75 s budget" in table
    assert "med-ddpm-128   tf32+cl" in table and "   4.00 " in table  # the gpu_check row and its ratio
    assert "time budget: 130 s of 215 s used" in table
    assert "kernel time fp32 / tf32+cl = 4.00; TC share 10.0 % -> 60.0 %" in table
    assert "stand-in for the paper's hardware counters" in table
    assert "WARNING: TF32 reported as applied, x" in table
    assert "33 samples at 4.0 Hz over 8.0 s, GPU on" in table
    assert "SM util 0-100 %" in table
    assert "not available in this build: no loader" in table

    shown = gpu_suite.must_show(results)
    assert shown["device"] == "NVIDIA H200"
    assert [(r["row"], r["ms_per_call"], r["x_fp32"]) for r in shown["rows"][:2]] == [
        ("fp32", 40.0, 1.0),
        ("tf32+cl", 10.0, 4.0),
    ]
    assert shown["rows"][2]["not_run"] == "time budget: 130 s of 215 s used"
    assert shown["kernel_shares_tf32_cl_vs_fp32"]["med-ddpm-128"]["tensor_core_share"] == [0.1, 0.6]
    assert shown["nvml"]["achieved_hz"] == 4.0


@pytest.mark.slow
def test_suite_command_writes_json_and_table_and_refuses_unknown_parts(tmp_path, capsys):
    assert gpu_suite.main(["--out", str(tmp_path), "--parts", "gpu-chek"]) == 2
    assert "unknown part gpu-chek" in capsys.readouterr().err

    install = tmp_path / "install.json"
    install.write_text(json.dumps({"mode": "python", "seconds": 2.5}))
    code = gpu_suite.main(
        ["--out", str(tmp_path), "--cpu-smoke", "--parts", "environment", "--install-record", str(install)]
    )
    assert code == 0
    data = json.loads((tmp_path / "gpu_suite.json").read_text())
    assert data["smoke"] is True and data["install"]["mode"] == "python"
    environment = data["parts"]["environment"]
    assert environment["status"] == "ok" and environment["result"]["cuda_available"] is False
    table = (tmp_path / "gpu_suite.txt").read_text()
    assert table.startswith("VolSynth GPU check: CPU smoke run")
    assert "environment      ok" in table
    assert table.strip() in capsys.readouterr().out  # the table is printed last
    assert data["must_show"]["device"] == "cpu"
    assert (tmp_path / "gpu_suite_logs.tar.gz").is_file()


@pytest.mark.slow
def test_the_shell_script_refuses_unknown_options_and_records_an_existing_interpreter(tmp_path):
    import subprocess

    script = str(Path(gpu_suite.REPO_ROOT) / "packaging" / "gpu_check.sh")
    bad = subprocess.run(["bash", script, "--gpus", "2"], capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown option --gpus" in bad.stderr
    done = subprocess.run(
        ["bash", script, "--python", PY, "--install-only", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    install = json.loads((tmp_path / "install.json").read_text())
    assert install["mode"] == "python" and install["python"] == PY
    assert install["missing_modules"] == [] and install["torch"]
