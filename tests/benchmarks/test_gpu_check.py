"""The GPU check's logic at tiny size on the CPU, and its exit on a machine without a GPU."""

from __future__ import annotations

import json
import math

import pytest
import torch


def test_gpu_check_logic_runs_at_tiny_size_on_the_cpu(monkeypatch):
    from benchmarks import gpu_check

    tiny = {
        "tiny": {
            "unet": {
                "_target_": "DiffusionModelUNet",
                "spatial_dims": 3,
                "in_channels": 2,
                "out_channels": 1,
                "channels": [8, 8],
                "num_res_blocks": 1,
                "attention_levels": [False, True],
                "num_head_channels": 8,
                "norm_num_groups": 8,
            },
            "input": [1, 2, 8, 8, 8],
            "context": None,
        }
    }
    monkeypatch.setattr(gpu_check, "network_defs", lambda smoke: tiny)
    results = gpu_check.run_check(
        smoke=True, budget_s=600, iters=1, warmup=0, include_compile=False, log=lambda _m: None
    )
    rows = {r["row"]: r for r in results["rows"]}
    assert rows["fp32"]["psnr_vs_fp32_db"] == math.inf and results["networks"]["tiny"]["gflop_per_call"] > 0
    assert rows["tf32"]["applied"] == {"tf32": False}  # no TF32 on a CPU: reported, not faked
    assert 40 < rows["bf16+cl"]["psnr_vs_fp32_db"] < math.inf
    assert "skipped" in rows["bf16+cl+sdpa+compile"]
    assert "bf16+cl+sdpa" in gpu_check.format_table(results)


def test_gpu_check_exits_cleanly_without_a_gpu(tmp_path, capsys):
    from benchmarks import gpu_check

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    out = tmp_path / "r.json"
    assert gpu_check.main(["--out", str(out)]) == 0
    assert "no CUDA GPU" in capsys.readouterr().out
    assert "skipped" in json.loads(out.read_text())
