"""Measure the streamed (memory-bounded) decode against the full decode: peak RSS, time and PSNR.

``python -m benchmarks.decode_memory --out DIR`` builds the brain-bundle-sized autoencoder (random
perturbed weights, seed 0), draws one latent 1x3x20x28x20 (seed 0) and decodes it in one child process per
mode, so each peak RSS is that decode's alone (the child resets its peak before decoding where the kernel
allows). Writes DIR/decode_memory.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

MODES = ("streamed", "full")


def _child(mode: str, out: Path, slab: int | None, threads: int | None) -> None:
    import numpy as np
    import torch

    from engine.machine.peak_memory import current_peak_rss_bytes, peak_rss_bytes, reset_peak_rss
    from engine.models.reference import bundle_sized_spec, perturbed_networks
    from engine.optimization.streamed_decode import streamed_decode

    if threads:
        torch.set_num_threads(threads)
    spec = bundle_sized_spec()
    ae = perturbed_networks(spec, seed=0, roles=("autoencoder",))["autoencoder"]
    z = torch.randn((1, *spec.latent_shape), generator=torch.Generator().manual_seed(0))
    rss_before = peak_rss_bytes()
    was_reset = reset_peak_rss()  # so the peak below is the decode's, not the set-up's
    started = time.perf_counter()
    with torch.inference_mode():
        image = ae.decode_stage_2_outputs(z) if mode == "full" else streamed_decode(ae, z, slab=slab)
    seconds = time.perf_counter() - started
    decode_peak = current_peak_rss_bytes() if was_reset else None
    np.save(out / f"{mode}.npy", image.float().numpy())
    (out / f"{mode}.json").write_text(
        json.dumps(
            {
                "mode": mode,
                "seconds": seconds,
                "peak_rss_bytes": peak_rss_bytes(),
                "peak_rss_before_decode_bytes": rss_before,
                "peak_rss_during_decode_bytes": decode_peak,
                "shape": list(image.shape),
                "slab": slab,
            }
        )
    )


def measure(out: Path, slab: int | None, modes=MODES, threads: int | None = None) -> dict:
    """Run each decode in a child process; return both records and the streamed-vs-full comparison."""
    import numpy as np

    from engine.metrics.image import compare

    out.mkdir(parents=True, exist_ok=True)
    records = {}
    for mode in modes:
        cmd = [
            sys.executable,
            "-m",
            "benchmarks.decode_memory",
            "--child",
            mode,
            "--out",
            str(out),
        ]
        cmd += (["--slab", str(slab)] if slab else []) + (["--threads", str(threads)] if threads else [])
        subprocess.run(cmd, check=True)
        records[mode] = json.loads((out / f"{mode}.json").read_text())
    result = {
        "model": "brain-bundle-sized AutoencoderKL (64/128/128/128), random perturbed weights",
        "latent": [1, 3, 20, 28, 20],
        **records,
    }
    if (out / "full.npy").is_file() and (out / "streamed.npy").is_file():
        result["streamed_vs_full"] = compare(np.load(out / "full.npy"), np.load(out / "streamed.npy"))
    (out / "decode_memory.json").write_text(json.dumps(result, indent=2))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument(
        "--slab", type=int, default=None, help="rows per slab (default: sized from the memory available)"
    )
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--child", choices=list(MODES), help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    out = Path(args.out)
    if args.child:
        _child(args.child, out, args.slab, args.threads)
        return 0
    result = measure(out, args.slab, tuple(args.modes), args.threads)
    for mode in args.modes:
        rec = result[mode]
        during = rec.get("peak_rss_during_decode_bytes")
        extra = f" (during decode {during / 2**30:.2f} GiB)" if during else ""
        print(
            f"{mode:8s} peak RSS {rec['peak_rss_bytes'] / 2**30:6.2f} GiB{extra}  time {rec['seconds']:7.1f} s"
        )
    if "streamed_vs_full" in result:
        cmp = result["streamed_vs_full"]
        print(
            f"streamed vs full: PSNR {cmp['psnr_db']:.2f} dB  SSIM {cmp['ssim']}  max abs err {cmp['max_abs_err']:.4g}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
