"""The bench's engine-vs-MONAI agreement, its decoder-only rows and its verdicts."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest


@pytest.mark.slow  # two child processes, each importing torch + MONAI
def test_bench_engine_loop_matches_monai_inferer_and_writes_outputs(
    registry, tiny_models_dir, tmp_path, monkeypatch
):
    from engine.measure.bench import BenchSettings, format_table, run_bench

    monkeypatch.setenv("VOLSYNTH_MODEL_PATH", str(tiny_models_dir))
    settings = BenchSettings(
        model="tiny-latent", steps=3, repeats=1, warmup=1, seed=0, device="cpu", latent_only=False, threads=1
    )
    summary = run_bench(settings, ["fp32", "reference", "xla"], tmp_path, log=lambda _m: None)
    rows = {r["row"]: r for r in summary["rows"]}
    assert "error" not in rows["reference"], rows["reference"]
    assert rows["reference"]["psnr_db"] > 100  # the engine's loop reproduces MONAI's inferer
    assert "error" not in rows["xla"], rows["xla"]
    assert rows["xla"]["psnr_db"] > 100  # the XLA programs reproduce the torch networks
    assert rows["xla"]["details"]["compile_s"] > 0 and rows["xla"]["speedup_per_step"] > 0
    assert rows["fp32"]["steps_measured"] == 2 and rows["fp32"]["peak_memory_bytes"] > 0
    for name in ("bench.json", "bench.csv", "bench.txt", "bench.png"):
        assert (tmp_path / name).is_file()
    assert "reference" in format_table(summary)
    assert json.loads((tmp_path / "bench.json").read_text())["compared_on"] == "final decoded volume"


@pytest.mark.slow
def test_latent_only_rows_load_no_decoder_and_mixed_judges_the_latent(tiny_models_dir, tmp_path, monkeypatch):
    from engine.measure.bench import BenchSettings, run_row

    monkeypatch.setenv("VOLSYNTH_MODEL_PATH", str(tiny_models_dir))
    monkeypatch.setattr("engine.optimization.apply.CALIBRATION_STEPS", 2)
    settings = BenchSettings(
        model="tiny-latent", steps=2, repeats=1, warmup=1, seed=0, device="cpu", latent_only=True, threads=1
    )
    record = run_row("mixed+bf16+sdpa", settings, tmp_path)
    entry = record["report"]["quantization"]
    assert entry["applied"], entry
    assert "final latent" in entry["reason"] and "kept in bf16" in entry["reason"]
    plan = record["details"]["mixed_plan"]
    assert plan["achieved_psnr_db"] >= 40.0 and plan["quantized"]
    assert record["decode_s"] is None
    latent = np.load(tmp_path / "mixed_bf16_sdpa.npy")
    assert latent.shape[1] == 3  # the tiny model's latent channels, not a decoded 1-channel volume


def test_psnr_metric_basics():
    from engine.metrics.image import compare

    ref = np.linspace(0, 1, 1000).reshape(1, 1, 10, 10, 10)
    assert compare(ref, ref)["psnr_db"] == math.inf
    noisy = ref + 0.01
    assert abs(compare(ref, noisy)["psnr_db"] - 40.0) < 1e-6


@pytest.mark.slow  # one child process per row, each importing torch + MONAI
def test_bench_decoder_only_runs_on_a_tiny_model(model_path_env, tmp_path, capsys, monkeypatch):
    from engine.cli import main

    monkeypatch.setattr(
        "engine.optimization.apply.CALIBRATION_STEPS", 1
    )  # only in this process; rows are children
    rows = "fp32,streamed_decode,streamed+dec:bf16-cl,streamed+dec:int8-cl"
    argv = ["bench", "--decoder-only", "--model", "tiny-latent", "--rows", rows, "--repeats", "1"]
    assert main([*argv, "--threads", "1", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    summary = json.loads((tmp_path / "bench.json").read_text())
    got = {r["row"]: r for r in summary["rows"]}
    assert list(got) == rows.split(",") and not any("error" in r for r in got.values()), got
    assert got["fp32"]["psnr_db"] == math.inf and got["fp32"]["speedup"] == 1.0
    assert got["streamed_decode"]["psnr_db"] > 100  # the same decode, bounded memory
    assert got["streamed_decode"]["report"]["streamed_decode"]["applied"]
    int8 = got["streamed+dec:int8-cl"]
    assert int8["report"]["decoder_quantization"]["applied"] and 15 < int8["psnr_db"] < math.inf
    assert all(r["peak_memory_bytes"] > 0 and r["decode_s_median"] > 0 for r in got.values())
    assert summary["output_shape"][2:] == [16, 24, 16]
    assert "streamed+dec:int8-cl" in printed and "x fp32" in printed
    # One run a row: the noise rule cannot call any decode faster or slower, and the table says so.
    assert all(got[r]["verdict"]["verdict"] == "undecided" for r in rows.split(",")[1:])
    assert "verdict" in printed and "engine.metrics.speed_verdict" in printed


def test_bench_decoder_only_refuses_unknown_rows(model_path_env, tmp_path):
    from engine.errors import InvalidRequest
    from engine.measure.bench import BenchSettings, run_decoder_bench

    settings = BenchSettings("tiny-latent", 0, 1, 0, 0, "cpu", False, 1, decoder_only=True)
    with pytest.raises(InvalidRequest, match="unknown decoder bench row"):
        run_decoder_bench(settings, ["fp32", "reference"], tmp_path, log=lambda _m: None)


def test_bench_verdicts_come_from_the_noise_rule(tmp_path, monkeypatch):
    """The summary and table of recorded runs: a ratio is called faster only where engine.metrics.speed_verdict says so."""
    from engine.measure import bench

    # Per row and repeat: (measured step times, end-to-end time). fp32 is quiet; "sdpa" halves both without
    # overlap; "int8"'s steps and runs look 1.6x faster by their medians, but swing between 0.6 and 1.6 s.
    recorded = {
        "fp32": [([1.0, 1.01, 0.99], 10.0), ([1.02, 0.98, 1.0], 10.1), ([1.01, 0.99, 1.0], 9.9)],
        "sdpa": [([0.5, 0.51, 0.49], 5.0), ([0.5, 0.52, 0.5], 5.1), ([0.5, 0.49, 0.51], 4.9)],
        "int8": [([0.6, 1.6, 0.62], 4.0), ([1.58, 0.61, 1.3], 12.0), ([0.63, 1.5, 0.64], 6.0)],
    }
    repeat_of = dict.fromkeys(recorded, 0)

    def recorded_run(name, settings, out_dir):  # stands in for a row's child process
        steps, end_to_end = recorded[name][repeat_of[name]]
        repeat_of[name] += 1
        out_dir.mkdir(parents=True, exist_ok=True)
        np.save(out_dir / f"{bench._safe(name)}.npy", np.ones((1, 1, 4, 4, 4), dtype=np.float32))
        return {
            "row": name,
            "report": {},
            "step_s": [9.0, *steps],  # the warm-up step, left out
            "unet_ms": [9e3, *(1e3 * s for s in steps)],
            "end_to_end_s": end_to_end,
            "prepare_s": 0.1,
            "decode_s": 0.5,
            "peak_memory_bytes": 2**30,
            "memory_kind": "process_rss",
        }

    monkeypatch.setattr(bench, "_spawn", recorded_run)
    settings = bench.BenchSettings("tiny", 4, 3, 1, 0, "cpu", False, 1)
    summary = bench.run_bench(settings, ["fp32", "sdpa", "int8"], tmp_path, log=lambda _m: None)
    rows = {r["row"]: r for r in summary["rows"]}
    sdpa, int8 = rows["sdpa"], rows["int8"]
    assert sdpa["verdict_per_step"]["verdict"] == "faster" and sdpa["verdict_per_step"]["samples"] == [9, 9]
    assert sdpa["verdict_end_to_end"]["verdict"] == "faster" and sdpa["verdict_end_to_end"]["samples"] == [
        3,
        3,
    ]
    assert int8["speedup_per_step"] > 1.5 and int8["speedup_end_to_end"] > 1.5  # what the medians alone say
    assert int8["verdict_per_step"]["verdict"] == int8["verdict_end_to_end"]["verdict"] == "undecided"
    assert "verdict_per_step" not in rows["fp32"]
    recorded_json = json.loads((tmp_path / "bench.json").read_text())
    assert recorded_json["rows"][2]["verdict_end_to_end"]["verdict"] == "undecided"
    table = bench.format_table(summary).splitlines()
    assert table[0].split().count("verdict") == 2
    line = {row.split()[0]: row.split() for row in table[2:5]}
    assert line["fp32"][4] == "ref" and line["sdpa"][4] == "faster" and line["sdpa"][7] == "faster"
    assert line["int8"][4] == "undecided" and line["int8"][7] == "undecided"
    assert not any(word in " ".join(line["int8"]) for word in ("faster", "slower"))
    assert "engine.metrics.speed_verdict" in table[-1]
    csv_rows = (tmp_path / "bench.csv").read_text().splitlines()
    assert "per_step_verdict" in csv_rows[0] and ",undecided," in csv_rows[3]
