"""``volsynth info``: devices and library versions."""

from __future__ import annotations

import json


def register(sub) -> None:
    parser = sub.add_parser("info", help="show compute devices and library versions")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.set_defaults(func=run)


def run(args) -> int:
    from engine.backends.local import library_versions
    from engine.devices import available_devices

    devices = available_devices()
    versions = library_versions()
    if args.json:
        print(json.dumps({"devices": devices, "versions": versions}, indent=2))
        return 0
    print("Devices:")
    for device in devices:
        extra = ", ".join(f"{k}={v}" for k, v in device.items() if k not in ("id", "name"))
        print(f"  {device['id']:<8} {device['name']}" + (f"  ({extra})" if extra else ""))
    print("Versions:")
    for name, version in versions.items():
        print(f"  {name:<9} {version}")
    return 0
