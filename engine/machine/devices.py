"""Which compute devices this machine has, and turning a user's device string into a torch.device."""

from __future__ import annotations

from typing import Any

from engine.errors import BackendUnavailable


def available_devices() -> list[dict[str, Any]]:
    """Every device the local backend can use, with a human-readable name. Always includes the CPU."""
    import platform

    import torch

    from engine.machine.probe import probe_machine

    devices = [
        {
            "id": "cpu",
            "name": probe_machine().cpu.model or platform.processor() or platform.machine() or "CPU",
            "threads": torch.get_num_threads(),
        }
    ]
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            devices.append(
                {
                    "id": f"cuda:{index}",
                    "name": props.name,
                    "memory_gb": round(props.total_memory / 2**30, 1),
                    "compute_capability": f"{props.major}.{props.minor}",
                }
            )
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        devices.append({"id": "mps", "name": "Apple Metal (MPS)"})
    return devices


def resolve_device(name: str | None):
    """'auto' (or None) -> the best available device; otherwise check the named one exists here."""
    import torch

    name = (name or "auto").strip().lower()
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda:0")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise BackendUnavailable(f"unknown device {name!r}; use cpu, cuda, cuda:N, mps or auto") from exc
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise BackendUnavailable(
                "device 'cuda' requested but no CUDA GPU is available here; use --device cpu"
            )
        index = device.index or 0
        if index >= torch.cuda.device_count():
            raise BackendUnavailable(
                f"no GPU {index}: this machine has {torch.cuda.device_count()} CUDA device(s)"
            )
        return torch.device("cuda", index)
    if device.type == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise BackendUnavailable(
                "device 'mps' requested but Apple Metal is not available here; use --device cpu"
            )
        return device
    if device.type != "cpu":
        raise BackendUnavailable(f"the local backend runs on cpu, cuda or mps, not {name!r}")
    return device


def device_name(device) -> str:
    import platform

    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "mps":
        return "Apple Metal (MPS)"
    from engine.machine.probe import probe_machine

    return probe_machine().cpu.model or platform.processor() or platform.machine() or "CPU"
