"""The PyTorch CUDA caching allocator's statistics, without importing torch behind anyone's back.

Importing torch takes seconds and hundreds of megabytes, so by default this only looks at a torch that the
process has already imported (the engine does, as soon as it loads a model). ``volsynth monitor`` therefore
starts fast and reports "not available" here, which is also the truth: it holds no tensors.
"""

from __future__ import annotations

import sys
from typing import Any

from engine.telemetry.samples import TorchDeviceStats, TorchSample


def _loaded_torch(import_torch: bool) -> tuple[Any, str | None]:
    loaded = sys.modules.get("torch")
    if loaded is None:
        if not import_torch:
            return None, "torch is not loaded in this process"
        try:
            import torch
        except Exception as exc:  # a broken CUDA install can raise anything from an import
            return None, f"torch cannot be imported ({type(exc).__name__}: {exc})"
        return torch, None
    # Another thread may be half-way through ``import torch``; touching torch.cuda then could fail or
    # import submodules from this thread. importlib marks a module being executed with _initializing.
    if getattr(getattr(loaded, "__spec__", None), "_initializing", False):
        return None, "torch is still loading"
    return loaded, None


def torch_allocator_stats(import_torch: bool = False) -> TorchSample:
    """Read ``torch.cuda.memory_stats`` for every CUDA device. Never raises.

    Args:
        import_torch: Import torch if the process has not. Default ``False``: report "not available"
            instead, so that callers like the monitor CLI stay light.

    Returns:
        A :class:`TorchSample`; ``available`` is ``False`` with a reason when torch is not loaded, CUDA is
        not available to it, or CUDA has not been initialised in this process yet (the allocator then holds
        nothing, and asking would initialise CUDA as a side effect).
    """
    torch, reason = _loaded_torch(import_torch)
    if torch is None:
        return TorchSample(available=False, reason=reason)
    try:
        cuda = torch.cuda
        if not cuda.is_available():
            return TorchSample(available=False, reason="CUDA is not available to torch")
        if not cuda.is_initialized():
            return TorchSample(available=False, reason="CUDA is not initialised in this process yet")
        devices = []
        for index in range(cuda.device_count()):
            stats = cuda.memory_stats(index)
            devices.append(
                TorchDeviceStats(
                    device=index,
                    allocated_bytes=int(stats.get("allocated_bytes.all.current", 0)),
                    reserved_bytes=int(stats.get("reserved_bytes.all.current", 0)),
                    peak_allocated_bytes=int(stats.get("allocated_bytes.all.peak", 0)),
                    peak_reserved_bytes=int(stats.get("reserved_bytes.all.peak", 0)),
                    num_alloc_retries=int(stats.get("num_alloc_retries", 0)),
                    num_ooms=int(stats.get("num_ooms", 0)),
                )
            )
    except Exception as exc:  # the allocator must never take the sampler down
        return TorchSample(
            available=False, reason=f"torch.cuda statistics failed ({type(exc).__name__}: {exc})"
        )
    return TorchSample(available=True, devices=devices)
