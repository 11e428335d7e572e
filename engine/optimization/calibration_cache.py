"""int8 calibration, measured once per model and machine and kept: a one-off cost, not a per-run one.

Quantizing a network needs the activation ranges of its layers on a calibration run of the sampling loop
(seconds on the shipped model, minutes on large ones). The ranges depend on the weights, the calibration
request and the library versions, not on the run that asks, so they are kept under the user cache as
``calibration/<key>.json``, the key being the sha256 of the network's parameters and buffers plus those
facts. A run that finds them skips the calibration; its report says so.

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
