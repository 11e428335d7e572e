"""``volsynth quality`` on the tiny model: table, JSON, PNG, clear errors, and a cancel that stops the backend."""

from __future__ import annotations

import json

import pytest

from engine.cli import main


@pytest.mark.slow
def test_quality_writes_table_json_and_png(model_path_env, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("VOLSYNTH_QUALITY_DIR", str(tmp_path / "kept"))
    out_json, out_png = tmp_path / "q.json", tmp_path / "q.png"
    args = ["quality", "--model", "tiny-latent", "--seeds", "4", "--steps", "2", "--settings", "bf16", "int8"]
    assert main([*args, "--json", str(out_json), "--png", str(out_png)]) == 0
    captured = capsys.readouterr()
    assert "16 volumes" in captured.err and "denoise [" in captured.err
    table = captured.out
    assert table.splitlines()[0].startswith("setting") and "PSNR med" in table
    assert "bf16: " in table and "int8: " in table and "fp32, seeds B: " in table
    data = json.loads(out_json.read_text())
    assert data["seeds"] == [0, 1, 2, 3] and data["noise_seeds"] == [4, 5, 6, 7]
    assert set(data["settings"]) == {"bf16", "int8"}
    for report in data["settings"].values():
        assert isinstance(report["within_noise"], bool) and report["verdict"]
        assert len(report["per_seed"]) == 4 and report["per_seed"][0]["psnr_db"] is not None
        assert {"features", "diversity"} <= set(report["statistics"])
    # random weights are not brain-like: segmentation refuses them, and every verdict says tissue was not compared
    assert data["tissue_source"] is None and "segmentation refused" in data["tissue_note"]
    assert "tissue volumes not compared" in data["settings"]["bf16"]["verdict"]
    # ... and every refused volume fails its anatomy check: the reliability share counts all 4 of each set
    for report in data["settings"].values():
        assert (
            report["reliability"]["candidate"]["passed"] == 0
            and report["reliability"]["candidate"]["count"] == 4
        )
        assert {"frd", "diversity", "reliability"} <= set(report["measures"]) and report["measures"]["frd"][
            "n"
        ] == 4
    assert data["timings"]["radiomics_s_per_volume"] > 0 and data["timings"]["anatomy_s"] >= 0
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out_png.stat().st_size > 10_000

    # bench and tune carry the kept verdicts in their JSON's "quality" block, or the command that measures one
    from engine.measure.bench import quality_block_for

    block = quality_block_for(
        "tiny-latent", [("bf16", {"autocast": "bf16"}), ("sdpa", {"attention": "sdpa"})]
    )
    assert block["cohort"]["bf16"]["verdict"] == data["settings"]["bf16"]["verdict"]
    assert block["cohort"]["bf16"]["seeds"] == 4 and block["cohort"]["sdpa"] is None
    assert block["measure"] == "volsynth quality --model tiny-latent --seeds 16 --settings 'sdpa'"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--seeds", "2", "--settings", "bf16"], "--seeds must be from 4 to 64"),
        (["--settings", "warp9"], "unknown settings 'warp9'"),
        (["--settings", "bf16", "--json", "out.txt"], "--json needs a .json file name"),
        (["--settings", "bf16", "bf16"], "named twice"),
        (["--settings", "bf16", "--batch", "2"], "--batch does not apply"),
        (["--settings", "steps:few"], "give the schedule's steps as a whole number"),
        (["--settings", "steps:0"], "give the schedule's steps as a whole number"),
        (["--settings", "[" * 10_000 + "]" * 10_000], "must be a flat JSON object"),
        (["--settings", '{"a":' * 10_000 + "1" + "}" * 10_000], "must be a flat JSON object"),
        (["--settings", '{"tf32": ' + "[" * 900 + "]" * 900 + "}"], "must be a flat JSON object"),
    ],
)
def test_bad_input_is_one_line(model_path_env, tmp_path, capsys, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    assert main(["quality", "--model", "tiny-latent", *args]) != 0
    err = capsys.readouterr().err.strip()
    assert err.startswith("volsynth: error: ") and message in err and "Traceback" not in err


def test_cancel_closes_the_run_in_progress(registry):
    from engine.api import SamplingRequest, drive
    from engine.api.optimization_config import OptimizationConfig
    from engine.backends.factory import make_backend
    from engine.quality.run import quality_run

    backend = make_backend("cpu", registry=registry)
    closed = []

    class Watched:  # the backend's own generator, watched for the close the cancel must reach
        def info(self):
            return backend.info()

        def sample(self, request):
            gen = backend.sample(request)
            try:
                return (yield from gen)
            finally:
                closed.append(request.seed)

    events = []
    request = SamplingRequest(model="tiny-latent", steps=3)
    run = quality_run(Watched(), request, {"bf16": OptimizationConfig(autocast="bf16")}, 4)
    result = drive(run, on_progress=events.append, should_stop=lambda: len(closed) >= 2 and len(events) > 12)
    assert result is None
    # The sets are interleaved seed by seed (fp32 A seed 0, fp32 B seed 4, bf16 seed 0, ...): the third volume,
    # bf16 on seed 0, was cancelled mid-run, and none started after.
    assert closed == [0, 4, 0]
    assert all(e.stage != "measure" for e in events)


def test_a_shorter_schedule_is_judged_like_a_setting(model_path_env, tmp_path, capsys, monkeypatch):
    """``steps:N`` runs fp32 on N steps against fp32 on the request's steps, beside a setting; each volume's
    steps count once in the progress, and the verdict is kept apart from fp32's own."""
    monkeypatch.setenv("VOLSYNTH_QUALITY_DIR", str(tmp_path / "kept"))
    from engine.quality import store

    out_json = tmp_path / "q.json"
    args = ["quality", "--model", "tiny-latent", "--seeds", "4", "--steps", "4"]
    assert main([*args, "--settings", "steps:2", "cache:k3-l1-f", "--json", str(out_json)]) == 0
    err = capsys.readouterr().err
    # 4 + 4 fp32 volumes and 4 cached ones on 4 steps, 4 on 2 steps: 56 steps in all, the last one shown.
    assert "56/56" in err
    data = json.loads(out_json.read_text())
    assert set(data["settings"]) == {"steps:2", "cache:k3-l1-f"}
    assert data["request"]["schedules"] == {"steps:2": 2} and data["request"]["steps"] == 4
    shorter = data["settings"]["steps:2"]
    assert len(shorter["per_seed"]) == 4 and shorter["per_seed"][0]["psnr_db"] < 200  # not fp32 itself
    kept_dir = tmp_path / "kept"
    (kept_file,) = kept_dir.rglob("*.json")
    verdicts = json.loads(kept_file.read_text())["verdicts"]
    assert verdicts[store.settings_key({}, 2)]["steps"] == 2
    assert verdicts[store.settings_key({}, 2)]["label"] == "steps:2"
    assert store.settings_key({}) not in verdicts  # fp32 on the request's schedule was not judged
