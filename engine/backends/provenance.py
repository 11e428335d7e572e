"""The provenance record every backend writes with its result: what made the volume, where and how."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from typing import Any


def run_provenance(
    source,
    loop,
    *,
    backend: str,
    device: str,
    device_name: str,
    versions: dict[str, str],
    optimization: dict[str, Any],
    timings: dict[str, float],
    memory: dict[str, Any],
) -> dict[str, Any]:
    """``source`` is the ModelSource sampled, ``loop`` the sampling loop's LoopOutput."""
    spec = source.spec
    return {
        "synthetic": True,
        "generator": "VolSynth Studio",
        "created_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "model": {
            "id": spec.id,
            "name": spec.name,
            "source": spec.source,
            "path": str(source.path),
            "weights_sha256": source.weights_sha256(),
        },
        "request": loop.request.to_dict(),
        # Where the volume lies and what its extra channels are: the NIfTI writer's sform code and the
        # tissue-map files beside the image follow from these (engine.nifti.io.save_volume).
        **({"space": spec.space} if spec.space else {}),
        **({"label_channels": list(spec.label_channels)} if spec.label_channels else {}),
        # What was made (size, spacing, modality, intensity handling) and what the user was warned of.
        **({"output": loop.output} if getattr(loop, "output", None) else {}),
        **({"warnings": list(loop.warnings)} if getattr(loop, "warnings", None) else {}),
        **({"model_build": source.build_notes} if getattr(source, "build_notes", None) else {}),
        "scheduler": loop.scheduler_config,
        "seed": loop.request.seed,
        "conditioning": loop.conditioning,
        "conditioning_normalised": loop.conditioning_normalised,
        "optimization": optimization,
        "backend": backend,
        "device": device,
        "device_name": device_name,
        # What the hardware can run fast (engine.machine.probe): a speed figure is only true for its machine.
        "machine": machine_record(),
        "versions": versions,
        "command": " ".join(sys.argv[:1]),
        "timings": timings,
        "step_times_s": loop.step_times_s,
        # The sampling loop's own peak (weights were loaded and settings applied before it started).
        "memory": memory,
    }


def machine_record() -> dict[str, Any]:
    """This machine's hardware probe as JSON (engine.machine.probe): info, provenance, measurements."""
    from engine.machine.probe import probe_machine

    return probe_machine().to_dict()
