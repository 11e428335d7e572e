"""Cohort workers on XLA devices: one worker per device group, a group being one plan's mesh.

A cohort on ``--device xla`` splits the host's XLA devices into equal groups; each group is one Ray worker
process that runs the XLA backend on its devices only, every item with the cohort's plan
(``SamplingRequest.xla_plan``) over them. No plan = one device per worker. 8 devices and a plan of 2
devices (``dp2``, ``d2``) give 4 workers; ``best`` lets each worker's backend choose the best plan for its
group of TPU chips (``--xla-devices`` and ``--workers`` then say how large a group is).

How a worker process gets its devices:

* On a TPU VM (Ray's ``TPU`` resource is on the node): only one process may open a chip, so each worker
  asks Ray for ``{"TPU": n}``; Ray gives it whole chips and sets ``TPU_VISIBLE_CHIPS`` before the worker
  starts. The worker then sets the bounds libtpu reads for a process that owns a sub-slice of the host
  (``TPU_CHIPS_PER_PROCESS_BOUNDS`` / ``TPU_PROCESS_BOUNDS``, and their newer names
  ``TPU_CHIPS_PER_HOST_BOUNDS`` / ``TPU_HOST_BOUNDS``, which Ray itself sets for 1 and 2 chips) and a
  mesh-controller port of its own, before JAX starts (``tpu_process_env``). Ray accepts 1, 2, 4 or 8 chips
  per actor. One chip is taken to be one JAX device (v4, v5e, v5p, v6e).
* On a host without TPUs: fake host devices. Each worker process starts JAX with its own
  ``jax_num_cpu_devices`` (``engine.xla.runtime.configure_jax``) and uses ``n`` of them; the groups share
  the host's CPU cores. This proves the sharded runs right, not their speed.

The driver never starts JAX (on a TPU VM it would take every chip), and none of this enters the cohort id
or the items' seeds: the same spec gives the same items whatever the device and the number of groups.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from typing import Any

from engine.api.request_fields import XLA_PLAN_PATTERN
from engine.errors import BackendUnavailable, InvalidRequest
from engine.formatting import count_of

TPU_CHIPS_PER_WORKER = (1, 2, 4, 8)  # what Ray's TPU resource accepts per actor
# Chip bounds of a sub-slice of a TPU VM host, as libtpu reads them (x, y, z).
_TPU_CHIP_BOUNDS = {1: "1,1,1", 2: "1,2,1", 4: "2,2,1", 8: "2,4,1"}
TPU_MESH_CONTROLLER_BASE_PORT = 8476  # libtpu's default; each worker process on a host needs its own
_PLAN = re.compile(f"^({XLA_PLAN_PATTERN})$")


def plan_devices(plan: str) -> int | None:
    """How many devices a plan's mesh uses: ``""`` / ``single`` 1, ``dp2xd2`` 4, ``d4/cut@2`` 4; None for
    ``best`` (its backend chooses among its devices)."""
    plan = (plan or "").strip()
    if not plan or plan == "single":
        return 1
    if plan == "best":
        return None
    if not _PLAN.match(plan):
        raise InvalidRequest(
            f"--xla-plan {plan!r} is not a plan name; use best or a name as `volsynth plan` prints it "
            "(dp2, d2xh2, dp2xd2/cut@2)"
        )
    return math.prod(int(n) for n in re.findall(r"(?:dp|d|h)(\d+)", plan.split("/")[0]))


@dataclass(frozen=True)
class DeviceGroups:
    """How a cohort uses a host's XLA devices: ``groups`` workers of ``devices_per_group`` devices each."""

    platform: str  # "tpu" (Ray's TPU chips) or "cpu" (fake host devices, one set per worker process)
    groups: int
    devices_per_group: int
    plan: str  # the request's xla_plan for every item ("" = one device)

    @property
    def devices(self) -> int:
        return self.groups * self.devices_per_group

    def actor_options(self) -> dict[str, Any]:
        """The Ray resources of one worker: its TPU chips (Ray sets TPU_VISIBLE_CHIPS), or one CPU."""
        if self.platform == "tpu":
            return {"num_cpus": 1, "resources": {"TPU": self.devices_per_group}}
        return {"num_cpus": 1}

    def describe(self) -> str:
        plan = f"plan {self.plan}" if self.plan else "no plan"
        where = "TPU chips" if self.platform == "tpu" else "fake host CPU devices"
        devices, groups = count_of(self.devices, "XLA device"), count_of(self.groups, "group")
        return f"{devices} ({where}) in {groups} of {self.devices_per_group}, {plan}"

    def to_record(self) -> dict[str, Any]:
        return {
            "platform": self.platform,
            "plan": self.plan,
            "groups": self.groups,
            "devices_per_group": self.devices_per_group,
            "devices": self.devices,
        }


def device_groups(
    tpu_chips: int,
    *,
    plan: str = "",
    workers: int | None = None,
    devices: int | None = None,
) -> DeviceGroups:
    """Split a host's XLA devices into groups for ``plan``.

    Args:
        tpu_chips: TPU chips Ray sees on the cluster (its ``TPU`` resource); 0 = a host without TPUs, where
            each worker starts its own fake host devices.
        plan: The cohort's ``xla_plan``: "" (one device per worker), ``best`` or a plan name.
        workers: The number of groups; default as many as fit (``devices`` or all chips / group size), or
            one on a host without TPUs and without ``devices``.
        devices: XLA devices to use in all; default every TPU chip, or (without TPUs) one group per worker.
    """
    per_group = plan_devices(plan)
    for name, value in (("workers", workers), ("--xla-devices", devices)):
        if value is not None and value < 1:
            raise InvalidRequest(f"{name} must be at least 1, got {value}")
    if per_group is None:  # best: the group size comes from the chips and workers
        if not tpu_chips:
            raise InvalidRequest(
                "--xla-plan best is costed on a TPU slice's topology; on fake host devices name a plan "
                "(dp2, d2xh2...: `volsynth plan` lists them)"
            )
        total = devices or tpu_chips
        if total % (workers or 1):
            raise InvalidRequest(f"{total} XLA devices do not split into {workers} equal groups")
        per_group = total // (workers or 1)
    if tpu_chips:
        platform = "tpu"
        total = devices or tpu_chips
        if total > tpu_chips:
            raise BackendUnavailable(f"{total} TPU chips asked for, but the Ray cluster has {tpu_chips}")
        if per_group not in TPU_CHIPS_PER_WORKER:
            raise InvalidRequest(
                f"a worker holds {per_group} TPU chips for plan {plan or '(none)'}, but Ray gives an actor "
                f"{', '.join(map(str, TPU_CHIPS_PER_WORKER))} chips; choose a plan of that many devices"
            )
    else:
        platform = "cpu"
        total = devices or per_group * (workers or 1)
    if total % per_group:
        raise InvalidRequest(
            f"{total} XLA devices do not split into groups of {per_group} (the mesh of plan {plan}); "
            "give --xla-devices a multiple of it"
        )
    groups = workers or total // per_group
    if groups * per_group > total:
        raise InvalidRequest(
            f"{groups} workers x {per_group} devices (plan {plan or 'none: one device each'}) need "
            f"{groups * per_group} XLA devices; there are {total}"
        )
    return DeviceGroups(platform, groups, per_group, (plan or "").strip())


def tpu_process_env(chips: list[int] | list[str]) -> dict[str, str]:
    """The environment that keeps one process to ``chips`` of a TPU VM host (set before JAX starts).

    ``TPU_VISIBLE_CHIPS`` names the chips; the bounds say the process owns a sub-slice of that shape and is
    the only process of its slice; the mesh-controller port is this process's own (the first chip's
    number picks it, so the workers of one host never share one). The whole host needs none of it.
    """
    ids = sorted(int(c) for c in chips)
    bounds = _TPU_CHIP_BOUNDS.get(len(ids))
    if bounds is None:
        raise InvalidRequest(f"a worker can hold 1, 2, 4 or 8 TPU chips, not {len(ids)}")
    port = TPU_MESH_CONTROLLER_BASE_PORT + ids[0]
    return {
        "TPU_VISIBLE_CHIPS": ",".join(str(c) for c in ids),
        "TPU_CHIPS_PER_PROCESS_BOUNDS": bounds,
        "TPU_PROCESS_BOUNDS": "1,1,1",
        "TPU_CHIPS_PER_HOST_BOUNDS": bounds,
        "TPU_HOST_BOUNDS": "1,1,1",
        "TPU_MESH_CONTROLLER_ADDRESS": f"localhost:{port}",
        "TPU_MESH_CONTROLLER_PORT": str(port),
    }


def worker_devices(groups_record: dict[str, Any]) -> list:
    """In a worker process, before anything else starts JAX: restrict it to its group; returns the group's
    jax devices (the backend's ``devices``)."""
    n = int(groups_record["devices_per_group"])
    if groups_record["platform"] == "tpu":
        import ray

        chips = ray.get_runtime_context().get_accelerator_ids().get("TPU") or []
        if len(chips) != n:
            raise BackendUnavailable(f"this worker was given TPU chips {chips}, not {n}")
        os.environ.update(tpu_process_env(chips))
    from engine.xla.runtime import configure_jax

    configure_jax(max(n, 8))  # the backend's default of 8 fake host devices, or more for a larger group
    import jax

    found = jax.devices()
    if len(found) < n:
        raise BackendUnavailable(
            f"this worker sees {len(found)} XLA device(s) ({found[0].platform}), its group needs {n}"
        )
    return found[:n]
