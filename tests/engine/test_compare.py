"""Side-by-side comparison of two optimization settings: kernel profile, peak memory, latency, volume distance."""

from __future__ import annotations

import json
import math

import nibabel as nib
import numpy as np
import pytest

from engine.api import SamplingRequest, run
from engine.api.optimization_config import OptimizationConfig
from engine.backends.local import LocalBackend
from engine.cli import main
from engine.compare import (
    DECODE,
    END_TO_END,
    UNET_STEP,
    changed_parts,
    compare_settings,
    headline_part,
    measure,
)
from engine.errors import InvalidRequest
from engine.machine.peak_memory import PeakMemory

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # profiler warnings on some builds

STEPS = 8


def _request(**changes) -> SamplingRequest:
    return SamplingRequest(model="tiny-latent", steps=STEPS, seed=4, **changes)


def test_kernel_profile_names_the_operators_of_the_chosen_steps(backend):
    result = run(backend.sample(_request(kernel_profile_steps=3)))
    profile = result.provenance["kernel_profile"]
    assert profile["steps"] == [2, 3, 4] and profile["clock"] == "cpu"
    names = [op["name"] for op in profile["operators"]]
    assert any("conv" in n for n in names)  # the tiny U-Net is convolutions first of all
    shares = [op["share"] for op in profile["operators"]]
    assert shares == sorted(shares, reverse=True) and 0.0 < sum(shares) <= 1.0 + 1e-9
    assert math.isclose(sum(shares) + profile["other_share"], 1.0, abs_tol=1e-6)
    assert profile["total_ms_per_step"] > 0
    assert all(op["calls_per_step"] > 0 for op in profile["operators"])


def test_profiling_does_not_change_the_volume(backend):
    plain = run(backend.sample(_request()))
    profiled = run(backend.sample(_request(kernel_profile_steps=2)))
    assert np.array_equal(plain.volumes, profiled.volumes)
    assert "kernel_profile" not in plain.provenance


@pytest.mark.parametrize("value", [-1, 11, 1.5, True])
def test_kernel_profile_steps_are_validated(value):
    with pytest.raises(InvalidRequest, match="kernel profile steps"):
        _request(kernel_profile_steps=value)


def test_peak_memory_sees_an_allocation_inside_the_block():
    import torch

    with PeakMemory(torch.device("cpu")) as peak:
        block = np.ones(200 * 2**20, dtype=np.uint8)  # 200 MiB, touched
        block[::4096] = 2
        del block
    record = peak.record
    assert record["kind"] == "process_rss" and record["since_start"]
    assert record["peak_bytes"] - record["start_bytes"] >= 190 * 2**20


def test_every_run_records_its_loop_peak_memory(backend):
    memory = run(backend.sample(_request())).provenance["memory"]
    assert memory["kind"] == "process_rss" and memory["peak_bytes"] >= memory["start_bytes"] > 0


@pytest.mark.slow
def test_same_settings_compare_as_identical(backend):
    comparison = run(compare_settings(backend, _request(), OptimizationConfig(), OptimizationConfig()))
    assert comparison.psnr_db == math.inf and comparison.max_abs_err == 0.0 and comparison.mean_abs_err == 0.0
    assert not comparison.difference().any()
    assert comparison.speedup_per_step is not None and comparison.speedup_per_step > 0


def test_bf16_moves_the_volume_and_reports_what_applied(backend):
    events = []
    comparison = run(
        compare_settings(
            backend,
            _request(guidance_scale=2.0),
            OptimizationConfig(),
            OptimizationConfig(autocast="bf16"),
            ("fp32", "bf16"),
            kernel_profile_steps=2,
        ),
        events.append,
    )
    a, b = comparison.a, comparison.b
    assert np.array_equal(a.result.volumes, run(backend.sample(_request(guidance_scale=2.0))).volumes)
    assert comparison.max_abs_err > 0 and 20 < comparison.psnr_db < math.inf
    assert comparison.difference().shape == (16, 24, 16)
    assert np.allclose(comparison.difference(), b.result.volume() - a.result.volume())
    assert a.applied() == [] and b.applied() == ["autocast"]
    # Step 1 (warm-up) and the two profiled steps are left out of the latency statistics.
    assert a.steps_measured == b.steps_measured == STEPS - 3
    assert a.kernel_profile["steps"] == [2, 3] and b.kernel_profile["operators"]
    # Progress counts over both runs and names the side.
    denoise = [e for e in events if e.stage == "denoise"]
    assert denoise[-1].step == denoise[-1].total == 2 * STEPS
    assert [e.step for e in denoise] == sorted(e.step for e in denoise)
    assert denoise[0].message.startswith("fp32:") and denoise[-1].message.startswith("bf16:")
    table = comparison.format_table()
    assert "fp32" in table and "bf16" in table and "PSNR" in table
    record = json.loads(json.dumps(comparison.to_dict()))
    assert record["b"]["applied"] == ["autocast"] and record["a"]["kernel_profile"]["steps"] == [2, 3]


def test_setting_that_does_not_apply_is_reported_with_its_reason(backend):
    comparison = run(
        compare_settings(
            backend, _request(), OptimizationConfig(), OptimizationConfig(tf32=True), kernel_profile_steps=0
        )
    )
    assert comparison.max_abs_err == 0.0  # TF32 on a CPU changes nothing, and says so
    reasons = dict(comparison.b.not_applied())
    assert "tf32" in reasons and reasons["tf32"]
    assert comparison.a.kernel_profile is None and comparison.a.steps_measured == STEPS - 1


def test_closing_the_comparison_cancels_it(backend):
    job = compare_settings(backend, _request(), OptimizationConfig(), OptimizationConfig(autocast="bf16"))
    seen = [next(job) for _ in range(4)]
    job.close()
    assert seen[-1].stage == "denoise"
    with pytest.raises(StopIteration):
        next(job)


def test_measure_reads_latency_and_memory_from_the_provenance(backend):
    result = run(backend.sample(_request(kernel_profile_steps=2)))
    times = [0.5, 9.0, 9.0, 0.010, 0.012, 0.014, 0.016, 0.018]  # step 1 warms up, steps 2-3 profiled
    result.provenance["step_times_s"] = times
    result.provenance["timings"]["loop_total_s"] = 20.0
    result.provenance["memory"] = {
        "peak_bytes": 900,
        "start_bytes": 600,
        "kind": "process_rss",
        "since_start": True,
    }
    side = measure("x", result)
    assert side.steps_measured == 5 and side.step_ms_median == pytest.approx(14.0)
    assert side.loop_s == pytest.approx(2.0)
    assert side.peak_over_start_bytes == 300


def test_compare_command_writes_volumes_difference_and_record(model_path_env, tmp_path, capsys):
    out = tmp_path / "cmp"
    code = main(
        [
            "compare",
            "--model",
            "tiny-latent",
            "--steps",
            "6",
            "--seed",
            "2",
            "--device",
            "cpu",
            "--b",
            '{"autocast": "bf16"}',
            "--out",
            str(out),
        ]
    )
    assert code == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "a.json",
        "a.nii.gz",
        "b.json",
        "b.nii.gz",
        "compare.json",
        "difference.nii.gz",
    ]
    a, b, diff = (
        np.asanyarray(nib.load(out / n).dataobj) for n in ("a.nii.gz", "b.nii.gz", "difference.nii.gz")
    )
    assert np.allclose(diff, b - a, atol=1e-6) and np.abs(diff).max() > 0
    record = json.loads((out / "compare.json").read_text())
    assert record["a"]["label"] == "fp32" and record["b"]["label"] == "bf16"
    assert record["b"]["optimization"]["autocast"] == "bf16" and record["request"]["seed"] == 2
    printed = capsys.readouterr().out
    assert "top operators" in printed and "volume moved" in printed


def test_decoder_only_setting_headlines_the_decode_not_the_step(backend):
    # The trap of the "Fast decode (CPU)" preset: it changes only the decoder, so a per-step ratio is noise.
    comparison = run(
        compare_settings(
            backend,
            _request(),
            OptimizationConfig(),
            OptimizationConfig(decoder_channels_last=True),
            ("fp32", "dec:cl"),
            kernel_profile_steps=0,
        )
    )
    a, b = comparison.a, comparison.b
    assert a.decode_s > 0 and b.decode_s > 0  # the loop's own decode timing, from the provenance
    assert a.decode_s == a.result.provenance["timings"]["decode_s"]
    assert comparison.changed_parts() == {"decoder"}
    headline = comparison.headline()
    assert headline.part == DECODE and headline.verdict.samples == (1, 1)
    # One decode a side: the rule cannot call it, and the headline says so and what to run.
    assert headline.verdict.verdict == "undecided" and headline.verdict.too_few
    text = headline.text()
    assert text.startswith("Decode (B's settings change only the decoder): too few samples to call")
    assert "--decoder-only" in text and "per step" not in text
    assert "faster" not in text and "slower" not in text
    table = comparison.format_table()
    assert table.splitlines()[2].startswith("decode") and f"{b.decode_s:.2f} s" in table.splitlines()[2]
    assert text in table and "  U-Net step (unchanged by B's settings):" in table and "  End to end" in table
    record = json.loads(json.dumps(comparison.to_dict()))
    assert record["headline"]["part"] == "decode" and record["changed_parts"] == ["decoder"]
    assert record["a"]["decode_s"] == a.decode_s and record["verdicts"]["decode"]["verdict"] == "undecided"
    assert len(record["b"]["step_s_measured"]) == b.steps_measured

    # The U-Net is the same on both sides: steps the rule calls faster in B's run mean the load changed.
    import dataclasses

    def with_steps(a_s, b_s):
        return dataclasses.replace(
            comparison,
            a=dataclasses.replace(a, step_s=tuple(a_s)),
            b=dataclasses.replace(b, step_s=tuple(b_s)),
        )

    same_load = with_steps([1.0, 1.01, 0.99, 1.0], [1.0, 0.99, 1.01, 1.0])
    assert same_load.load_shift() == "" and same_load.headline().caveat == ""
    busy_a = with_steps([2.0, 2.02, 1.98, 2.01], [1.0, 0.99, 1.01, 1.0]).headline()
    assert busy_a.part == DECODE and "load changed between the runs" in busy_a.caveat
    assert "U-Net step, which B's settings leave alone, ran at 2.00x" in busy_a.text()


def test_the_headline_part_follows_what_each_setting_changes():
    def parts(a, b, **reports):
        return changed_parts(OptimizationConfig.from_dict(a), OptimizationConfig.from_dict(b), **reports)

    fast_decode = {"streamed_decode": True, "decoder_autocast": "bf16", "decoder_channels_last": True}
    assert parts({}, fast_decode) == {"decoder"}
    assert parts({}, {"attention": "sdpa"}) == parts({}, {"quantization": "int8"}) == {"unet"}
    # autocast reaches the decoder too, unless the decoder keeps its own precision
    assert parts({}, {"autocast": "bf16"}) == {"unet", "decoder"}
    assert parts({"decoder_autocast": "fp32"}, {"autocast": "bf16", "decoder_autocast": "fp32"}) == {"unet"}
    assert parts({}, {"channels_last_3d": True}) == {"unet", "decoder"}
    assert parts({"quantization": "int8"}, {"quantization": "int8", "psnr_budget_db": 30.0}) == frozenset()
    assert parts({}, {}) == frozenset()
    # A setting that did not apply changes nothing: TF32 on a CPU
    not_applied = {"tf32": {"requested": True, "applied": False, "reason": "needs an NVIDIA GPU"}}
    assert parts({}, {"tf32": True}) == {"unet", "decoder"}
    assert parts({}, {"tf32": True}, report_b=not_applied) == frozenset()
    assert headline_part(frozenset({"unet"})) == UNET_STEP
    assert headline_part(frozenset({"decoder"})) == DECODE
    assert headline_part(frozenset({"unet", "decoder"})) == headline_part(frozenset()) == END_TO_END


def test_every_u_net_setting_changes_the_u_net_step():
    """The U-Net's settings come from their rows: sub-pixel upsampling and step caching change the step too."""

    def parts(b):
        return changed_parts(OptimizationConfig(), OptimizationConfig.from_dict(b))

    assert parts({"unet_subpixel": True}) == parts({"step_cache_interval": 2}) == {"unet"}
    not_applied = {"unet_subpixel": {"requested": True, "applied": False, "reason": "no upsampling block"}}
    assert changed_parts(
        OptimizationConfig(), OptimizationConfig(unet_subpixel=True), report_b=not_applied
    ) == (frozenset())


def test_noisy_step_times_leave_the_headline_undecided(backend):
    import dataclasses

    comparison = run(
        compare_settings(
            backend,
            _request(),
            OptimizationConfig(),
            OptimizationConfig(attention="sdpa"),
            kernel_profile_steps=0,
        )
    )
    assert comparison.changed_parts() == {"unet"}

    def with_steps(a_s, b_s):
        a = dataclasses.replace(comparison.a, step_s=tuple(a_s))
        b = dataclasses.replace(comparison.b, step_s=tuple(b_s))
        return dataclasses.replace(comparison, a=a, b=b)

    # A's median looks 3.8x slower only because a busy spell hit three of its steps.
    noisy = with_steps([1.0, 4.0, 4.1, 0.9, 4.2], [1.0, 1.05, 0.95, 1.1, 1.0]).headline()
    assert noisy.part == UNET_STEP and noisy.verdict.ratio > 3.5 and noisy.verdict.verdict == "undecided"
    assert noisy.text().startswith("U-Net step (B's settings change only the U-Net): no clear difference yet")
    assert "run more steps" in noisy.text() and "volsynth bench" in noisy.text()
    assert "faster" not in noisy.text()
    quiet = with_steps([2.0, 2.02, 1.98, 2.01, 1.99], [1.0, 1.01, 0.99, 1.0, 1.02]).headline()
    assert quiet.verdict.verdict == "faster" and "as fast as A" in quiet.text() and not quiet.advice


def test_compare_command_headlines_the_decode_of_a_decoder_setting(model_path_env, tmp_path, capsys):
    out = tmp_path / "cmp"
    argv = ["compare", "--model", "tiny-latent", "--steps", "4", "--device", "cpu", "--profile-steps", "0"]
    assert main([*argv, "--b", '{"decoder_channels_last": true}', "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    record = json.loads((out / "compare.json").read_text())
    assert record["headline"]["part"] == "decode" and record["a"]["decode_s"] > 0 < record["b"]["decode_s"]
    assert record["headline"]["text"] in printed
    assert "Decode (B's settings change only the decoder)" in printed
    decode_row = next(line for line in printed.splitlines() if line.startswith("decode "))
    assert (
        f"{record['a']['decode_s']:.2f} s" in decode_row and f"{record['b']['decode_s']:.2f} s" in decode_row
    )


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("warp-speed", "unknown settings 'warp-speed'"),
        ('{"autocast": "bf17"}', "autocast must be one of"),
        ("{not json", "not valid JSON"),
        ('["bf16"]', "JSON object"),
    ],
)
def test_compare_command_refuses_bad_settings(model_path_env, tmp_path, capsys, setting, message):
    code = main(["compare", "--model", "tiny-latent", "--b", setting, "--out", str(tmp_path / "x")])
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x").exists()  # refused before any work or output


def test_settings_summary_names_what_differs_from_fp32():
    assert OptimizationConfig().summary() == "fp32"
    assert (
        OptimizationConfig(autocast="bf16", attention="sdpa", channels_last_3d=True).summary()
        == "cl+bf16+sdpa"
    )
    assert OptimizationConfig(quantization="mixed", psnr_budget_db=35).summary() == "mixed@35dB"


@pytest.mark.gpu
def test_comparison_on_cuda_profiles_device_time_and_allocator_peaks(registry):
    """On an NVIDIA GPU: kernels ranked by CUDA time, peaks from the CUDA allocator (comparable per run)."""
    backend = LocalBackend("cuda", registry)
    comparison = run(
        compare_settings(
            backend,
            _request(),
            OptimizationConfig(),
            OptimizationConfig(autocast="bf16", channels_last_3d=True),
        )
    )
    for side in (comparison.a, comparison.b):
        assert side.peak_kind == "cuda_allocator" and side.peak_bytes > 0
        assert side.kernel_profile["clock"] == "cuda" and side.kernel_profile["total_ms_per_step"] > 0
    assert set(comparison.b.applied()) == {"channels_last_3d", "autocast"}
    assert 20 < comparison.psnr_db < math.inf
