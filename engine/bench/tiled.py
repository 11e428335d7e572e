"""Measure tiled decoding against the full decode: peak RSS (each in its own process) and PSNR.

``python -m engine.bench.tiled --out DIR`` builds the brain-bundle-sized autoencoder (random perturbed
weights, seed 0), draws one latent 1x3x20x28x20 (seed 0), and decodes it in two child processes, one
full and one tiled, so each peak RSS is that decode's alone. Writes DIR/tiled_decode.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def _child(mode: str, out: Path, tile: tuple[int, ...], overlap: float, threads: int | None) -> None:
    import numpy as np
    import torch

    from engine.bench.metrics import current_peak_rss_bytes, peak_rss_bytes, reset_peak_rss
    from engine.bench.models import bundle_sized_spec, perturbed_networks
    from engine.tiled_decode import tiled_decode

    if threads:
        torch.set_num_threads(threads)
    spec = bundle_sized_spec()
    ae = perturbed_networks(spec, seed=0, roles=("autoencoder",))["autoencoder"]
    z = torch.randn((1, *spec.latent_shape), generator=torch.Generator().manual_seed(0))
    rss_before = peak_rss_bytes()
    was_reset = reset_peak_rss()  # so the peak below is the decode's, not the set-up's
    started = time.perf_counter()
    with torch.inference_mode():
        if mode == "full":
            image = ae.decode_stage_2_outputs(z)
        else:
            image = tiled_decode(ae.decode_stage_2_outputs, z, tile=tile, overlap=overlap)
    seconds = time.perf_counter() - started
    decode_peak = current_peak_rss_bytes() if was_reset else None
    np.save(out / f"{mode}.npy", image.float().numpy())
    (out / f"{mode}.json").write_text(json.dumps({
        "mode": mode, "seconds": seconds, "peak_rss_bytes": peak_rss_bytes(),
        "peak_rss_before_decode_bytes": rss_before,
        "peak_rss_during_decode_bytes": decode_peak, "shape": list(image.shape),
        "tile": list(tile), "overlap": overlap}))


def measure(out: Path, tile: tuple[int, ...], overlap: float, modes=("tiled", "full")) -> dict:
    """Run each decode in a child process; return both records and the PSNR of tiled vs full."""
    import numpy as np

    from engine.bench.metrics import compare

    out.mkdir(parents=True, exist_ok=True)
    records = {}
    for mode in modes:
        cmd = [sys.executable, "-m", "engine.bench.tiled", "--child", mode, "--out", str(out),
               "--tile", *map(str, tile), "--overlap", str(overlap)]
        subprocess.run(cmd, check=True)
        records[mode] = json.loads((out / f"{mode}.json").read_text())
    result = {"model": "brain-bundle-sized AutoencoderKL (64/128/128/128), random perturbed weights",
              "latent": [1, 3, 20, 28, 20], **records}
    if (out / "full.npy").is_file() and (out / "tiled.npy").is_file():
        result["tiled_vs_full"] = compare(np.load(out / "full.npy"), np.load(out / "tiled.npy"))
    (out / "tiled_decode.json").write_text(json.dumps(result, indent=2))
    return result


def main(argv: list[str] | None = None) -> int:
    from engine.tiled_decode import DEFAULT_OVERLAP, DEFAULT_TILE

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--tile", type=int, nargs=3, default=list(DEFAULT_TILE))
    parser.add_argument("--overlap", type=float, default=DEFAULT_OVERLAP)
    parser.add_argument("--modes", nargs="+", default=["tiled", "full"], choices=["tiled", "full"])
    parser.add_argument("--child", choices=["full", "tiled"], help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    out = Path(args.out)
    if args.child:
        _child(args.child, out, tuple(args.tile), args.overlap, args.threads)
        return 0
    result = measure(out, tuple(args.tile), args.overlap, tuple(args.modes))
    for mode in args.modes:
        rec = result[mode]
        print(f"{mode:6s} peak RSS {rec['peak_rss_bytes'] / 2**30:6.2f} GiB  time {rec['seconds']:7.1f} s")
    if "tiled_vs_full" in result:
        cmp = result["tiled_vs_full"]
        print(f"tiled vs full: PSNR {cmp['psnr_db']:.2f} dB  SSIM {cmp['ssim']}  max abs err {cmp['max_abs_err']:.4g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
