"""Per-device memory and communication of the decoder split over 1, 2, 4 and 8 XLA devices.

``python -m benchmarks.xla_decode [--out FILE] [--check]`` compiles (without running) the shipped demo
model's decoder (latent 8x20x24x20 -> 5x80x96x80) and the brain-bundle-sized decoder (3x20x28x20 ->
1x160x224x160) on 1 device and split over 2, 4 and 8 fake host devices, and prints XLA's memory analysis
per device (argument, output, temp, total) and the collectives of the partitioned HLO (count, bytes per
device). The split is ``engine.xla.sharded_decode.split_for``'s: depth slabs where the latent's depth
divides, else depth x height (20 does not divide over 8: 4 x 2). On a GPU box with JAX's CUDA build
(``JAX_PLATFORMS=cuda``) or a TPU VM the same command measures the real devices (up to 8). ``--check``
also runs the shipped model's decoder (its trained weights) on one latent on 1 device and on all of them,
and reports the relative difference and the times (fake devices share this machine's cores: times are
recorded, not compared).

Memory analysis is of the compiled per-device program, so it is what a TPU or GPU of the same program
would hold up to the backend's buffer assignment; it does not need the memory to exist.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

DEVICE_COUNTS = (1, 2, 4, 8)
DEFAULT_OUT = Path("build/xla-decode-memory.json")


def _models():
    from engine.models.reference import bundle_sized_spec, demo_shaped_spec

    out = {}
    for name, spec in (("shipped-demo", demo_shaped_spec()), ("bundle-sized", bundle_sized_spec())):
        channels, *spatial = spec.latent_shape
        out[name] = (spec.networks["autoencoder"], (1, *spatial, channels))
    # The bundle's decoder with MONAI's mid-block self-attention over all 20x28x20 latent voxels: what
    # attention costs split (queries stay split, keys and values are all-gathered).
    definition, latent = out["bundle-sized"]
    out["bundle-sized-attention"] = (dict(definition, with_decoder_nonlocal_attn=True), latent)
    return out


def measure_model(name: str, definition: dict, latent_shape, devices, precision: str) -> dict:
    """Compile the decoder on 1 and on each N devices; memory per device and collectives per split."""
    from engine.errors import InvalidRequest
    from engine.xla import convert, sharded_decode

    module = convert.meta_network(definition)
    arch, params = convert.decoder_arch(module), convert.abstract_params(module)
    rows = []
    one = None
    for n in (c for c in DEVICE_COUNTS if c <= len(devices)):
        started = time.perf_counter()
        if n == 1:
            compiled = sharded_decode.compile_one_device(arch, params, latent_shape, devices[0], precision)
            axes, mesh = (), ()
        else:
            axes, mesh = sharded_decode.split_for(latent_shape, n)
            compiled = sharded_decode.compile_decoder(
                arch, params, latent_shape, devices[:n], precision, axes, mesh
            )
        memory = sharded_decode.memory_record(compiled)
        one = one or memory
        row = {
            "devices": n,
            "axes": list(axes),
            "mesh_shape": list(mesh),
            "memory": memory,
            "temp_ratio": memory["temp_bytes"] / one["temp_bytes"],
            "total_ratio": memory["total_bytes"] / one["total_bytes"],
            "collectives": sharded_decode.collective_summary(compiled, n) if n > 1 else {},
            "compile_s": round(time.perf_counter() - started, 1),
        }
        if n > 1 and axes != ("depth",):
            try:
                sharded_decode.check_divisible(latent_shape, ("depth",), (n,))
            except InvalidRequest as exc:
                row["depth_only"] = str(exc)
        rows.append(row)
        _print_row(name, row)
    return {"latent_shape": list(latent_shape), "decoder": definition, "rows": rows}


def _print_row(name: str, row: dict) -> None:
    m = row["memory"]
    split = "x".join(map(str, row["mesh_shape"])) + " " + "x".join(row["axes"]) if row["axes"] else "-"
    comm = ", ".join(f"{k} {v['count']}x {v['bytes'] / 1e6:.2f} MB" for k, v in row["collectives"].items())
    print(
        f"{name:22s} N={row['devices']}  split {split:18s} temp {m['temp_bytes'] / 1e6:9.1f} MB "
        f"({row['temp_ratio']:.3f})  total {m['total_bytes'] / 1e6:9.1f} MB ({row['total_ratio']:.3f})  "
        f"compile {row['compile_s']:.0f} s  {comm or 'no collectives'}"
    )


def check_shipped(devices, precision: str) -> dict:
    """Run the shipped decoder on one latent on 1 device and split over 8; relative difference and times."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from engine.models.registry import ModelRegistry
    from engine.xla import convert, nets, sharded_decode

    autoencoder = ModelRegistry().get("brain-t1-demo").load().autoencoder
    arch = convert.decoder_arch(autoencoder)
    params = {k: jnp.asarray(v) for k, v in convert.numpy_params(autoencoder).items()}
    latent = (1, 20, 24, 20, arch.latent_channels)
    z = jnp.asarray(np.random.default_rng(0).standard_normal(latent).astype(np.float32))
    single_fn = jax.jit(lambda p, z: nets.decoder_apply(arch, p, z, precision=precision))
    axes, mesh = sharded_decode.split_for(latent, len(devices))
    program, shardings = sharded_decode.sharded_decoder_program(arch, devices, precision, axes, mesh)
    placed = jax.device_put(params, shardings[0]), jax.device_put(z, shardings[1])
    single = np.asarray(single_fn(params, z))  # compile + first run
    sharded = np.asarray(program(*placed))
    times = {}
    for label, fn in (
        ("one_device_s", lambda: single_fn(params, z)),
        ("sharded_s", lambda: program(*placed)),
    ):
        started = time.perf_counter()
        jax.block_until_ready(fn())
        times[label] = round(time.perf_counter() - started, 3)
    error = float(np.abs(sharded - single).max() / np.abs(single).max())
    print(
        f"shipped decode 1 vs {len(devices)} devices ({'x'.join(map(str, mesh))} {axes}): "
        f"relative error {error:.2e}; {times}"
    )
    return {
        "devices": len(devices),
        "axes": list(axes),
        "mesh_shape": list(mesh),
        "relative_error": error,
        "image_shape": list(single.shape),
        **times,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON results file")
    parser.add_argument("--precision", default="highest")
    parser.add_argument(
        "--check", action="store_true", help="also run the shipped decoder on 1 and 8 devices"
    )
    parser.add_argument(
        "--models",
        nargs="*",
        default=None,
        help="a subset of shipped-demo, bundle-sized, bundle-sized-attention",
    )
    args = parser.parse_args(argv)

    from engine.machine.probe import probe_machine
    from engine.xla.runtime import configure_jax

    configure_jax(max(DEVICE_COUNTS))  # fake host devices; JAX_PLATFORMS=cuda or a TPU VM uses real ones
    import jax

    devices = jax.devices()[: max(DEVICE_COUNTS)]
    if len(devices) < 2:
        raise SystemExit(f"need at least 2 XLA devices, JAX has {len(devices)} ({devices[0].platform})")
    cpu = probe_machine().cpu
    results = {
        "machine": f"{cpu.model} ({cpu.hardware_isa}), {cpu.logical_cores} cores, "
        f"{len(devices)} {'fake ' if devices[0].platform == 'cpu' else ''}{devices[0].platform} devices",
        "jax": jax.__version__,
        "precision": args.precision,
        "load_average_before": list(os.getloadavg()),
        "models": {},
    }
    for name, (definition, latent) in _models().items():
        if args.models and name not in args.models:
            continue
        results["models"][name] = measure_model(name, definition, latent, devices, args.precision)
    if args.check:
        results["shipped_check"] = check_shipped(devices, args.precision)
    results["load_average_after"] = list(os.getloadavg())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    print(
        f"load average {results['load_average_before']} -> {results['load_average_after']}; wrote {args.out}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
