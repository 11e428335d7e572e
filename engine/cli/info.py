"""``volsynth info``: devices, what this machine's hardware runs fast (the probe), and library versions."""

from __future__ import annotations

import json


def register(sub) -> None:
    parser = sub.add_parser("info", help="show compute devices and library versions")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.set_defaults(func=run)


def run(args) -> int:
    from engine.machine.devices import available_devices
    from engine.machine.probe import probe_machine
    from engine.machine.software import library_versions

    devices = available_devices()
    versions = library_versions()
    probe = probe_machine()
    if args.json:
        print(json.dumps({"devices": devices, "machine": probe.to_dict(), "versions": versions}, indent=2))
        return 0
    print("Devices:")
    for device in devices:
        extra = ", ".join(f"{k}={v}" for k, v in device.items() if k not in ("id", "name"))
        print(f"  {device['id']:<8} {device['name']}" + (f"  ({extra})" if extra else ""))
    cpu = probe.cpu
    print(f"Machine (fingerprint {probe.fingerprint()}):")
    print(
        f"  CPU      {cpu.vendor} {cpu.model}, {cpu.logical_cores} logical cores, {cpu.memory_bytes / 2**30:.1f} GiB"
    )
    print(f"  kernels  oneDNN {cpu.onednn_isa} (hardware {cpu.hardware_isa}), ATen {cpu.torch_capability}")
    print(
        f"  bf16     {'native' if cpu.native_bf16 else 'emulated (slower than fp32)' if cpu.emulated_bf16 else 'none: expected far slower than fp32'}"
    )
    print(f"  fp16     {'native' if cpu.native_fp16 else 'none: expected slower than fp32'}")
    print(
        f"  int8     engine {cpu.int8_engine or 'none'}, dot product {cpu.int8_dot or 'none (AVX2 multiply-adds)'}"
    )
    if cpu.stand_in:
        print("  stand-in " + ", ".join(f"{k}={v}" for k, v in sorted(cpu.stand_in.items())))
    for gpu in probe.gpus:
        print(
            f"  GPU {gpu.index}    {gpu.name}, compute capability {gpu.capability_text}, "
            f"TF32 {'yes' if gpu.tf32 else 'no'}, bf16 {'yes' if gpu.bf16 else 'no'}, fp8 {'yes' if gpu.fp8 else 'no'}"
        )
    print("Versions:")
    for name, version in versions.items():
        print(f"  {name:<9} {version}")
    return 0
