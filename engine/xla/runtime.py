"""Process-wide JAX set-up shared by everything in ``engine.xla`` (planner, converted networks, tests).

Two settings must be made before JAX initialises its CPU backend, and only once per process:

* ``JAX_PLATFORMS=cpu`` when this machine has no TPU. With libtpu installed, JAX otherwise probes for TPU
  chips at first use, prints libtpu start-up noise and waits on a TPU that is not there. Compile-only TPU
  topologies (``jax.experimental.topologies.get_topology_desc(..., platform="tpu")``) do not need the TPU
  backend, so they keep working with this setting.
* ``jax_num_cpu_devices``: fake host devices, so sharded programs can run (and be checked against the
  single-device result) on a machine with one CPU backend.

Call :func:`configure_jax` before the first ``jax.devices()`` / ``jit`` call. Later calls are harmless: once
the backend exists the device count can no longer change, and the function reports what it got.
"""

from __future__ import annotations

import os

from engine.machine.probe import tpu_present

_DEFAULT_CPU_DEVICES = 8


def _backend_initialised() -> bool:
    from jax._src import xla_bridge

    # After the first backend use the CPU device count is fixed.
    return xla_bridge.backends_are_initialized()


def configure_jax(cpu_devices: int = _DEFAULT_CPU_DEVICES) -> int:
    """Prepare JAX for host-CPU use with ``cpu_devices`` fake devices; return the CPU device count in effect.

    Idempotent. If the CPU backend already exists with fewer devices than asked for, nothing can be done
    any more; the caller sees the smaller count in the return value and can skip or fail clearly.
    """
    if not tpu_present():
        # setdefault: an explicit JAX_PLATFORMS from the user (e.g. "cuda") wins.
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    if not _backend_initialised():
        current = jax.config.jax_num_cpu_devices
        if current is None or current < cpu_devices:
            jax.config.update("jax_num_cpu_devices", int(cpu_devices))
    return len(jax.devices("cpu"))
