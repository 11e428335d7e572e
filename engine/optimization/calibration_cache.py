"""int8 calibration and the mixed plan, measured once per model and machine and kept: one-off costs.

Quantizing a network needs the activation ranges of its layers on a calibration run of the sampling loop
(seconds on the shipped model, minutes on large ones). The ranges depend on the weights, the calibration
request and the library versions, not on the run that asks, so they are kept under the user cache as
``calibration/<key>.json``, the key being the sha256 of the network's parameters and buffers plus those
facts. A run that finds them skips the calibration; its report says so.

The mixed-precision plan (which layers run int8, :func:`engine.quantization.mixed_precision_plan`) costs
one sampling run per searched layer plus a binary search: minutes on the shipped model, an hour on the
bundle-sized U-Net. It depends on the weights, the PSNR floor, the calibration request, the int8 kernels'
arithmetic (7-bit activations without VNNI: the machine) and the library versions, so :func:`mixed_plan`
keeps it as ``calibration/<key>.mixed.json`` keyed by all of them (the machine by its probe fingerprint),
with the seconds the search took.

``VOLSYNTH_CALIBRATION_CACHE=0`` turns the cache off (the test suite does, except where it tests it).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

FORMAT = 1


def enabled() -> bool:
    return os.environ.get("VOLSYNTH_CALIBRATION_CACHE", "1") != "0"


def cache_dir() -> Path:
    from engine.files.user_folders import user_cache_dir

    return user_cache_dir() / "calibration"


def network_key(module, facts: Mapping[str, Any]) -> str:
    """sha256 of the network's tensors (names, shapes, bytes) and of ``facts`` (what else decides the ranges)."""
    import torch

    digest = hashlib.sha256(json.dumps(dict(facts), sort_keys=True, default=str).encode())
    digest.update(torch.__version__.encode())
    for name, tensor in (*module.named_parameters(), *module.named_buffers()):
        data = tensor.detach().to("cpu").contiguous()
        digest.update(f"{name}:{tuple(data.shape)}:{data.dtype}".encode())
        digest.update(data.view(torch.uint8).numpy().tobytes() if data.numel() else b"")
    return digest.hexdigest()[:32]


def calibrate(module, names: Iterable[str], run: Callable[[], Any], facts: Mapping[str, Any]):
    """The ``Calibration`` of ``names`` in ``module`` for the calibration ``run``: from the cache when it has
    it, else measured (forward hooks during ``run()``) and kept. Returns ``(calibration, from_cache)``."""
    from engine import quantization as q

    names = list(names)
    key = network_key(module, {**facts, "layers": names}) if enabled() else None
    if key is not None:
        cached = _load(key)
        if cached is not None:
            return cached, True
    calibration = q.Calibration()
    handles = calibration.attach(module, names)
    try:
        run()
    finally:
        for handle in handles:
            handle.remove()
    if key is not None:
        _save(key, calibration)
    return calibration, False


def latent(module, facts: Mapping[str, Any], run: Callable[[], Any]):
    """The tensor ``run()`` returns (a calibration run's final latent), kept per ``module``'s weights and
    ``facts`` like the ranges."""
    import torch

    key = network_key(module, facts) if enabled() else None
    path = cache_dir() / f"{key}.latent.json" if key else None
    if path is not None:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if data.get("format") == FORMAT:
                return torch.tensor(data["values"], dtype=torch.float32).reshape(data["shape"])
        except (OSError, ValueError, KeyError, TypeError, RuntimeError):
            pass
    value = run()
    if path is not None:
        _write(
            path, {"format": FORMAT, "shape": list(value.shape), "values": value.float().flatten().tolist()}
        )
    return value


def mixed_plan(module, facts: Mapping[str, Any], search: Callable[[], Any]):
    """The ``MixedPlan`` for ``module`` and ``facts`` (PSNR floor, autocast, calibration request, layers):
    from the cache when it has it, else ``search()`` timed and kept. The key adds this machine's probe
    fingerprint and the library versions. Returns ``(plan, from_cache, search_s)``: ``search_s`` is the
    search's own time (the one-off cost, measured when the plan was made, also on a hit)."""
    import time

    key = network_key(module, {**facts, **machine_facts()}) if enabled() else None
    path = cache_dir() / f"{key}.mixed.json" if key else None
    if path is not None:
        cached = _load_plan(path)
        if cached is not None:
            return cached[0], True, cached[1]
    started = time.perf_counter()
    plan = search()
    search_s = time.perf_counter() - started
    if path is not None:
        _write(path, {"format": FORMAT, "search_s": search_s, "plan": dataclasses.asdict(plan)})
    return plan, False, search_s


def machine_facts() -> dict[str, Any]:
    """What of the machine and libraries a mixed plan depends on: the probe's fingerprint (CPU model and
    capability, honouring the AVX2 stand-in's variables) and every library version the tuner keys on."""
    from engine.machine.probe import probe_machine
    from engine.optimization.tune_store import current_versions

    return {"machine": probe_machine().fingerprint(), "versions": current_versions()}


def _load_plan(path: Path):
    from engine import quantization as q

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("format") != FORMAT:
            return None
        known = {f.name for f in dataclasses.fields(q.MixedPlan)}
        plan = q.MixedPlan(**{k: v for k, v in data["plan"].items() if k in known})
        return plan, float(data["search_s"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # missing, damaged or from another version: search again


def _write(path: Path, data: dict) -> None:
    from engine.nifti.io import atomic_files

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_files([path]) as (temp,):
            temp.write_text(json.dumps(data), encoding="utf-8")
    except OSError:
        pass  # a cache that cannot be written only costs the next run its calibration again


def _load(key: str):
    from engine import quantization as q

    try:
        data = json.loads((cache_dir() / f"{key}.json").read_text(encoding="utf-8"))
        if data.get("format") != FORMAT:
            return None
        fields = dict(data["calibration"])
        fields["ranges"] = {name: q.RangeObserver(**values) for name, values in fields["ranges"].items()}
        known = {f.name for f in dataclasses.fields(q.Calibration)}
        return q.Calibration(**{k: v for k, v in fields.items() if k in known})
    except (OSError, ValueError, KeyError, TypeError):
        return None  # missing, damaged or from another version: calibrate again


def _save(key: str, calibration) -> None:
    _write(cache_dir() / f"{key}.json", {"format": FORMAT, "calibration": dataclasses.asdict(calibration)})
