"""volsynth tune: real row processes on the tiny model, the stored result, and what it decides."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch

from engine.api import run
from engine.api.optimization_config import OptimizationConfig
from engine.errors import InvalidRequest
from engine.machine.probe import MachineProbe
from engine.measure.tune import candidate_rows, format_result, tune
from engine.optimization import tune_store
from engine.optimization.apply import check_combination, expected_report
from tests.engine.optimization.test_hardware_probe import PROBES


@pytest.fixture
def tune_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("VOLSYNTH_TUNE_DIR", str(tmp_path / "tune"))
    return tmp_path / "tune"


@pytest.fixture(scope="module")
def tuned(tiny_models_dir, tmp_path_factory):
    """One real measurement of fp32 and the Low memory preset on the tiny latent model (kept in a temp store)."""
    import tempfile

    folder = tmp_path_factory.mktemp("tune")
    scratch = tmp_path_factory.mktemp("scratch")  # the temporary folder tune's own scratch folder is made in
    with pytest.MonkeyPatch.context() as patch:  # module-scoped: undone when the measurement is over
        patch.setenv("VOLSYNTH_TUNE_DIR", str(folder))
        patch.setattr(tempfile, "tempdir", str(scratch))
        progress = []
        pauses = iter([True, True, False])  # a generation runs when the first run is due, then ends
        result = run(
            tune(
                str(tiny_models_dir / "tiny-latent"),
                "cpu",
                budget_s=5,
                steps=3,
                rows=["preset:Low memory"],
                should_pause=lambda: next(pauses, False),
            ),
            on_progress=progress.append,
        )
    assert not list(scratch.iterdir()), "the rows' volumes were left in the temporary folder"
    return result, progress, folder


@pytest.mark.slow
def test_tune_measures_rows_side_by_side_and_keeps_the_result(tuned, tiny_models_dir, monkeypatch):
    result, progress, folder = tuned
    names = [row["name"] for row in result["rows"]]
    assert names == ["fp32", "preset:Low memory"]
    assert result["method"]["rounds"] >= 3  # the noise rule needs three samples a row
    messages = [p.message for p in progress]
    assert any("round 3" in m for m in messages) and messages[0].startswith("preparing fp32")
    estimate = next(m for m in messages if m.startswith("estimated "))
    # Over the 5 s budget, the estimate says so before the rounds start (and only then).
    shown = float(estimate.split()[1])  # whole seconds
    assert shown >= 5 if "over the 5 s budget" in estimate else shown <= 5
    paused = [i for i, m in enumerate(messages) if m.startswith("paused")]
    assert len(paused) == 2 and messages[paused[-1] + 1] == "round 1: fp32"  # held, then went on
    fp32, streamed = result["rows"]
    assert math.isinf(fp32["psnr_db"]) and fp32["speedup_end_to_end"] == 1.0
    assert streamed["psnr_db"] > 60  # the streamed decode is exact up to float reordering
    for row in result["rows"]:
        assert row["runs"] == result["method"]["rounds"]
        assert row["step_ms_median"] > 0 and row["decode_s_median"] > 0 and row["peak_rss_bytes"] > 0
        assert row["end_to_end_verdict"]["verdict"] in ("faster", "slower", "same", "undecided")
    assert result["recommended"] in names
    assert "Fast (GPU)" not in json.dumps(result["rows"])  # TF32 does not apply on a CPU: not measured
    assert any(r["name"] == "preset:Fast (GPU)" and "TF32" in r["reason"] for r in result["not_measured"])
    # Kept per machine fingerprint, model and versions: the lookup finds it, another machine does not.
    from engine.models.registry import ModelRegistry

    monkeypatch.setenv("VOLSYNTH_TUNE_DIR", str(folder))
    sha = ModelRegistry([tiny_models_dir]).get("tiny-latent").weights_sha256()
    assert tune_store.load_result(sha)["created"] == result["created"]
    assert tune_store.load_result(sha, fingerprint="another-machine") is None
    assert tune_store.load_result(sha, versions={"torch": "0.0"}) is None
    table = format_result(result)
    assert "fp32" in table and "not measured" in table and "noise rule" in table


def test_a_row_measured_slower_here_is_refused_and_never_recommended(tuned, no_slower_override):
    result, _, _ = tuned
    slow = copy.deepcopy(result)
    row = next(r for r in slow["rows"] if r["name"] == "preset:Low memory")
    row["end_to_end_verdict"] = {**row["end_to_end_verdict"], "verdict": "slower", "ratio": 0.5}
    row["end_to_end_s"] = 0.001  # even if it looked fastest, a slower verdict rules it out
    config = OptimizationConfig(streamed_decode=True)
    with pytest.raises(InvalidRequest, match="measured 0.50x fp32's speed end to end on this machine"):
        check_combination(config, torch.device("cpu"), measured=slow)
    assert tune_store.recommendation(slow)["name"] == "fp32"
    report = expected_report(
        OptimizationConfig(streamed_decode=True, allow_slower=True), "cpu", measured=slow
    )
    assert report["measured_here"]["applied"] is False and report["allow_slower"]["applied"]


@pytest.mark.slow
def test_measuring_some_rows_merges_into_the_stored_result(tuned, tiny_models_dir, tmp_path, monkeypatch):
    import shutil

    from engine.models.registry import ModelRegistry

    result, _, folder = tuned
    store = tmp_path / "tune"
    shutil.copytree(folder, store)
    monkeypatch.setenv("VOLSYNTH_TUNE_DIR", str(store))
    sha = ModelRegistry([tiny_models_dir]).get("tiny-latent").weights_sha256()
    # An earlier run measured one more row, twice as fast as the fp32 of that run (its own samples say so).
    stored = tune_store.load_result(sha)
    fp32 = next(r for r in stored["rows"] if r["name"] == "fp32")
    earlier = {
        **copy.deepcopy(fp32),
        "name": "int8+sdpa",
        "config": {"quantization": "int8", "attention": "sdpa"},
        "end_to_end_samples_s": [0.5, 0.505, 0.495],
        "reference_end_to_end_samples_s": [1.0, 1.01, 0.99],  # the fp32 of that run
        "end_to_end_s": 0.5,
        "end_to_end_verdict": {"verdict": "undecided"},  # judged again from the samples on merging
        "psnr_db": 45.0,
        "measured": "2026-01-01T00:00:00+00:00",
    }
    stored["rows"].append(earlier)
    tune_store.save_result(stored)

    again = run(
        tune(str(tiny_models_dir / "tiny-latent"), "cpu", budget_s=3, steps=2, rows=["preset:Low memory"])
    )
    names = [row["name"] for row in again["rows"]]
    assert sorted(names) == [
        "fp32",
        "int8+sdpa",
        "preset:Low memory",
    ]  # measured ones replaced, the other kept
    assert again["kept_from_earlier_runs"] == ["int8+sdpa"]
    low = next(r for r in again["rows"] if r["name"] == "preset:Low memory")
    assert low["measured"] == again["created"] != result["created"]
    kept = next(r for r in again["rows"] if r["name"] == "int8+sdpa")
    assert kept["measured"] == "2026-01-01T00:00:00+00:00"
    assert kept["end_to_end_verdict"]["verdict"] == "faster" and kept["speedup_end_to_end"] == pytest.approx(
        2.0
    )
    assert again["recommended"] == "int8+sdpa"  # recomputed from the merged rows
    on_disk = tune_store.load_result(sha)
    assert [r["name"] for r in on_disk["rows"]] == names and on_disk["recommended"] == "int8+sdpa"
    assert "kept from earlier runs" in format_result(again)


def test_a_merged_row_is_judged_against_the_fp32_of_its_own_run():
    def row(name, samples, reference, psnr=50.0):
        return {
            "name": name,
            "config": {},
            "end_to_end_s": sorted(samples)[len(samples) // 2],
            "end_to_end_samples_s": samples,
            "reference_end_to_end_samples_s": reference,
            "end_to_end_verdict": {"verdict": "faster"},
            "psnr_db": psnr,
        }

    base = {"format": 1, "fingerprint": "m", "model": {"key": "k"}, "versions_key": "v", "device": "cpu"}
    stored = {
        **base,
        "created": "earlier",
        "rows": [
            row("fp32", [10.0, 10.1, 9.9], [10.0, 10.1, 9.9], math.inf),
            # Measured under load: slow in seconds, but 1.5x its own fp32.
            row("loaded-but-faster", [20.0, 20.2, 19.8], [30.0, 30.3, 29.7]),
            # Stored as "faster", but its samples overlap its fp32's: the rule says undecided.
            row("noisy", [5.0, 12.0, 6.0], [10.0, 6.0, 11.0]),
        ],
    }
    new = {**base, "created": "now", "rows": [row("fp32", [8.0, 8.1, 7.9], [8.0, 8.1, 7.9], math.inf)]}
    merged = tune_store.merge_results(stored, new)
    verdicts = {r["name"]: r["end_to_end_verdict"]["verdict"] for r in merged["rows"] if r["name"] != "fp32"}
    assert verdicts == {"loaded-but-faster": "faster", "noisy": "undecided"}
    assert merged["recommended"] == "loaded-but-faster"  # ranked by its ratio, not its loaded seconds
    other_machine = {**new, "fingerprint": "another"}
    assert [r["name"] for r in tune_store.merge_results(stored, other_machine)["rows"]] == ["fp32"]


def test_recommendation_takes_the_fastest_clearly_faster_row_above_the_floor():
    def row(name, e2e, verdict, psnr):
        return {
            "name": name,
            "config": {},
            "end_to_end_s": e2e,
            "end_to_end_verdict": {"verdict": verdict},
            "psnr_db": psnr,
        }

    result = {
        "rows": [
            row("fp32", 10.0, "same", math.inf),
            row("fast-but-lossy", 2.0, "faster", 30.0),
            row("fast", 4.0, "faster", 44.0),
            row("maybe", 3.0, "undecided", 50.0),
            row("faster-exact", 5.0, "faster", math.inf),
        ]
    }
    assert tune_store.recommendation(result)["name"] == "fast"
    assert tune_store.recommendation(result, min_psnr_db=45.0)["name"] == "faster-exact"
    assert tune_store.recommendation(result, min_psnr_db=20.0)["name"] == "fast-but-lossy"
    assert tune_store.recommendation({"rows": [row("fp32", 10.0, "same", math.inf)]})["name"] == "fp32"


def test_candidates_follow_the_machine(tiny_models_dir):
    from engine.models.registry import ModelRegistry

    spec = ModelRegistry([tiny_models_dir]).get("tiny-latent").spec
    avx2 = MachineProbe.from_dict(json.loads((PROBES / "amd-epyc-avx2.json").read_text()))
    zen5 = MachineProbe.from_dict(json.loads((PROBES / "amd-epyc-zen5-avx512bf16.json").read_text()))
    rows_avx2, skipped_avx2 = candidate_rows(torch.device("cpu"), spec, avx2)
    rows_zen5, _ = candidate_rows(torch.device("cpu"), spec, zen5)
    measured_avx2 = {name for name, _ in rows_avx2}
    assert "fp32" in measured_avx2 and "int8+sdpa+streamed+dec:int8-cl" in measured_avx2
    assert not any("bf16" in name for name in measured_avx2)  # the trap is never run on AVX2
    assert any("no native bf16" in s["reason"] for s in skipped_avx2)
    assert "bf16+sdpa+streamed+dec:bf16-cl" in {name for name, _ in rows_zen5}
    # The mixed plan is measured too (its search cached as a one-off cost), and sub-pixel upsampling.
    assert {"mixed+sdpa+streamed", "int8+sdpa+subpixel+streamed"} <= measured_avx2


def test_tune_refuses_bad_arguments(tiny_models_dir):
    with pytest.raises(InvalidRequest, match="at least 2 steps"):
        next(tune(str(tiny_models_dir / "tiny-latent"), "cpu", steps=1))
    with pytest.raises(InvalidRequest, match="unknown tune row"):
        next(tune(str(tiny_models_dir / "tiny-latent"), "cpu", rows=["nonsense"]))


@pytest.mark.slow
def test_estimate_only_measures_nothing(tiny_models_dir, tune_dir):
    result = run(
        tune(
            str(tiny_models_dir / "tiny-latent"),
            "cpu",
            steps=2,
            rows=["preset:Low memory"],
            estimate_only=True,
        )
    )
    assert result["estimate_s"] > 0 and result["rows"] == ["fp32", "preset:Low memory"]
    assert not tune_dir.exists() or not any(tune_dir.rglob("*.json"))


@pytest.mark.slow
def test_the_cli_estimates_then_measures_and_shows(model_path_env, tune_dir, capsys):
    from engine.cli import main

    assert main(["tune", "--model", "tiny-latent", "--estimate", "--rows", "preset:Low memory"]) == 0
    assert "would take about" in capsys.readouterr().out
    assert main(["tune", "--model", "tiny-latent", "--show"]) == 2  # nothing measured yet: one-line error
    assert "run `volsynth tune`" in capsys.readouterr().err
    assert (
        main(
            ["tune", "--model", "tiny-latent", "--rows", "preset:Low memory", "--budget", "1", "--steps", "2"]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "preset:Low memory" in out and "noise rule" in out
    assert main(["tune", "--model", "tiny-latent", "--show", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"][0]["name"] == "fp32"


@pytest.mark.slow
def test_a_shorter_schedule_row_is_projected_from_fp32_and_advised_only_with_a_kept_verdict(
    tiny_models_dir, tune_dir, tmp_path, monkeypatch
):
    """``--rows steps:2``: fp32 is measured, the 2-step schedule projected from its steps and decode; it is
    advised (never recommended as settings) once `volsynth quality` kept a verdict that holds for it."""
    from engine.machine.probe import probe_machine
    from engine.models.registry import ModelRegistry
    from engine.quality import store

    monkeypatch.setenv("VOLSYNTH_QUALITY_DIR", str(tmp_path / "quality"))
    model = str(tiny_models_dir / "tiny-latent")
    result = run(tune(model, "cpu", budget_s=3, steps=2, rows=["steps:2"]))
    fp32, short = result["rows"]
    assert (fp32["name"], short["name"]) == ("fp32", "steps:2")
    assert short["steps"] == 2 and short["default_steps"] == 5 and short["config"] == {}
    assert short["end_to_end_s"] < fp32["end_to_end_s"] and "projected" in short
    assert result["shorter_schedule"] is None and result["recommended"] == "fp32"
    assert "'steps:2'" in result["quality"]["measure"]  # the command that would judge it

    key = tune_store.model_key(ModelRegistry([tiny_models_dir]).get("tiny-latent").weights_sha256())
    kept = store.quality_root() / probe_machine().fingerprint() / f"{key}.json"
    kept.parent.mkdir(parents=True)
    verdict = {
        "label": "steps:2",
        "verdict": "within seed-to-seed variation",
        "within_noise": True,
        "steps": 2,
    }
    kept.write_text(json.dumps({"format": store.FORMAT, "verdicts": {store.settings_key({}, 2): verdict}}))
    again = run(tune(model, "cpu", budget_s=3, steps=2, rows=["steps:2"]))
    assert again["quality"]["cohort"]["steps:2"]["within_noise"] is True
    # 2 of 5 steps: each fp32 sample less 3 of its steps, so the noise rule calls it faster.
    assert (
        next(r for r in again["rows"] if r["name"] == "steps:2")["end_to_end_verdict"]["verdict"] == "faster"
    )
    assert again["shorter_schedule"] == "steps:2"
    assert "keeps the quality verdict" in format_result(again)
    assert again["recommended"] == "fp32"  # a schedule is never the recommended settings
    with pytest.raises(InvalidRequest, match="whole number"):
        next(tune(model, "cpu", rows=["steps:many"]))


@pytest.mark.slow
def test_trades_are_timed_over_their_interval_and_judged_on_the_whole_schedule(tiny_models_dir, tune_dir):
    """Measure now's step caching and fewer steps: before, tune left them out (or judged a caching row on a few
    steps, whose timed steps were all cached ones and whose volume said nothing of a whole schedule)."""
    progress = []
    result = run(
        tune(
            str(tiny_models_dir / "tiny-latent"),
            "cpu",
            budget_s=3,
            steps=2,
            rows=["fp32"],
            trades=["cache:k3-l1-f", "steps:2"],
        ),
        on_progress=progress.append,
    )
    rows = {row["name"]: row for row in result["rows"]}
    assert set(rows) == {"fp32", "cache:k3-l1-f", "steps:2"}
    cached, shorter = rows["cache:k3-l1-f"], rows["steps:2"]
    for row in (cached, shorter):  # speed and quality cost side by side
        assert row["end_to_end_verdict"]["verdict"] in ("faster", "slower", "same", "undecided")
        assert row["psnr_db"] is not None and "whole 5-step schedule" in row["quality_measured"]
    # 1 + its interval steps a run: the timed steps hold one full pass and two cached ones, as a schedule does.
    assert cached["runs"] >= 3 and cached["steps_per_run"] == 4 and rows["fp32"]["steps_per_run"] == 2
    assert any("quality on the whole schedule: cache:k3-l1-f" in p.message for p in progress)
    assert any("quality on the whole schedule: fp32, 2 steps" in p.message for p in progress)
