"""Accelerator topologies for the planner: device sets, hop distances and alpha-beta collective costs.

A topology name is ``<family>:<shape>`` for TPU slices (``v5e:2x4``, ``v5p:2x2x2``) or ``<N>x<GPU>-<link>``
for a GPU box (``8xH100-nvlink``, ``8xH100-pcie``). Physical devices are numbered by their coordinates,
first axis fastest (index = x + X*(y + Y*z)); the planner maps logical mesh positions onto these indices
(a *placement*) and costs each collective with :func:`collective_time`.

Cost model (alpha-beta, one step at a time). A collective is a sequence of steps; in each step every
participant sends ``m`` bytes to one peer. A transfer follows a route (list of directed links); the step
takes ``step_latency + max_hops * hop_latency + max_link_load * m / link_bandwidth``, where the load of a
link is the number of transfers of that step routed through it, so groups that share links slow each
other down. Ring algorithms are assumed (what XLA uses for bandwidth-bound collectives):

* all-reduce of n bytes over p devices: reduce-scatter then all-gather, 2(p-1) steps of n/p bytes;
* all-gather producing n bytes / reduce-scatter consuming n bytes: p-1 steps of n/p bytes;
* all-to-all of n bytes: p-1 steps (peer i+k for k = 1..p-1) of n/p bytes;
* collective-permute: one step with the given source-target pairs.

The *topology-unaware* variant sees every pair as one hop on its own link (no sharing), which is what a
planner that only counts bytes assumes.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

COLLECTIVE_KINDS = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all")


# The logical mesh axes of every plan: data parallel over the batch, then the depth and height splits.
AXES = ("data", "depth", "height")


@dataclass(frozen=True)
class Chip:
    name: str
    peak_flops: float  # bf16 dense FLOP/s
    hbm_bytes: float
    hbm_bandwidth: float  # bytes/s

    def compute_s(self, flops: float, bytes_accessed: float) -> float:
        """Seconds of compute on this chip: bound by its peak or by its HBM bandwidth, whichever is slower."""
        return max(flops / self.peak_flops, bytes_accessed / self.hbm_bandwidth)


# Cloud TPU v5e (cloud.google.com/tpu/docs/v5e): 197 TFLOP/s bf16, 16 GB HBM2 at 819 GB/s.
V5E = Chip("TPU v5e", 197e12, 16e9, 819e9)
# Cloud TPU v5p (cloud.google.com/tpu/docs/v5p): 459 TFLOP/s bf16, 95 GiB HBM at 2765 GB/s.
V5P = Chip("TPU v5p", 459e12, 95 * 2**30, 2765e9)
# NVIDIA H100 SXM5 (nvidia.com/en-us/data-center/h100, datasheet): 989 TFLOP/s bf16 dense, 80 GB HBM3
# at 3.35 TB/s.
H100_SXM = Chip("H100 SXM", 989e12, 80e9, 3.35e12)
# NVIDIA H100 PCIe (same datasheet): 756 TFLOP/s bf16 dense, 80 GB HBM2e at 2.0 TB/s.
H100_PCIE = Chip("H100 PCIe", 756e12, 80e9, 2.0e12)

# Per-link, per-direction bandwidths.
# v5e: 400 GB/s bidirectional ICI per chip (cloud.google.com/tpu/docs/v5e) over 4 links of the 2-D torus
# -> 100 GB/s bidirectional, 50 GB/s each way, per link.
V5E_LINK_BANDWIDTH = 50e9
# v5p: 1200 GB/s bidirectional ICI per chip (cloud.google.com/tpu/docs/v5p) over 6 links of the 3-D torus
# -> 200 GB/s bidirectional, 100 GB/s each way, per link.
V5P_LINK_BANDWIDTH = 100e9
# H100 SXM: NVLink 4, 900 GB/s bidirectional per GPU to the NVSwitches (H100 datasheet) -> 450 GB/s each way.
NVLINK_H100_BANDWIDTH = 450e9
# H100 PCIe: PCIe Gen5 x16, 128 GB/s bidirectional (H100 datasheet) -> 64 GB/s each way. GPU pairs without
# NVLink bridges go through PCIe switches; across the two CPU sockets traffic crosses the host's
# inter-socket link, assumed here to be no faster than one x16 link.
PCIE_GEN5_BANDWIDTH = 64e9
PCIE_GPUS_PER_SWITCH = 4  # common 8-GPU PCIe servers: 4 GPUs behind each socket's PCIe switch (assumption)

# Latencies are not published by Google or NVIDIA; these are order-of-magnitude assumptions (a few hundred
# ns per ICI router hop; a microsecond or so of launch/synchronisation per collective step). They only
# matter for small messages (halo exchanges of small levels, GroupNorm statistics).
ICI_HOP_LATENCY = 0.5e-6
ICI_STEP_LATENCY = 1.0e-6
NVLINK_HOP_LATENCY = 0.7e-6
NVLINK_STEP_LATENCY = 2.0e-6
PCIE_HOP_LATENCY = 1.0e-6
PCIE_STEP_LATENCY = 3.0e-6

KNOWN_TOPOLOGIES = (
    "v5e:2x2",
    "v5e:2x4",
    "v5e:4x4",
    "v5e:4x8",
    "v5e:8x8",
    "v5p:2x2x1",
    "v5p:2x2x2",
    "v5p:2x4x4",
    "8xH100-nvlink",
    "8xH100-pcie",
    "4xH100-nvlink",
    "4xH100-pcie",
)


class UnknownTopology(ValueError):
    pass


@dataclass(frozen=True)
class Topology:
    """One slice or box: how many devices, how they are wired, what each can do."""

    name: str
    family: str  # "v5e", "v5p", "h100"
    network: str  # "torus", "nvswitch", "pcie"
    shape: tuple[int, ...]  # torus dimensions (first axis fastest); (N,) for GPU boxes
    chip: Chip
    link_bandwidth: float  # bytes/s per link, per direction
    hop_latency: float  # seconds per link traversed
    step_latency: float  # seconds of fixed cost per collective step
    # v5e: wraparound on every axis, the model (Google does not say whether sub-pod v5e slices have
    # them; on an axis of 2 it changes nothing). v5p: only for slices of whole 4x4x4 cubes (parse_topology).
    wraparound: bool = True
    _coords: tuple[tuple[int, ...], ...] = field(default=(), repr=False, compare=False)

    @property
    def n_devices(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def is_tpu(self) -> bool:
        return self.family in ("v5e", "v5p")

    def coords(self, index: int) -> tuple[int, ...]:
        """Physical coordinates of device ``index`` (first axis fastest)."""
        out = []
        for s in self.shape:
            out.append(index % s)
            index //= s
        return tuple(out)

    def index(self, coords: Sequence[int]) -> int:
        index, stride = 0, 1
        for c, s in zip(coords, self.shape, strict=True):
            index += c * stride
            stride *= s
        return index

    def _axis_steps(self, a: int, b: int, size: int) -> int:
        """Signed shortest move from a to b along one axis (positive on ties)."""
        forward = (b - a) % size
        if not self.wraparound:
            return b - a
        return forward if forward <= size - forward else forward - size

    def hops(self, a: int, b: int) -> int:
        """Links a message from device a to device b traverses (0 for a == b)."""
        if a == b:
            return 0
        if self.network == "torus":
            ca, cb = self.coords(a), self.coords(b)
            return sum(abs(self._axis_steps(x, y, s)) for x, y, s in zip(ca, cb, self.shape, strict=True))
        if self.network == "nvswitch":
            return 1  # GPU -> NVSwitch -> GPU: one switch traversal for every pair
        same_switch = a // PCIE_GPUS_PER_SWITCH == b // PCIE_GPUS_PER_SWITCH
        return 1 if same_switch else 3  # via the root complex and the inter-socket link

    def route(self, a: int, b: int) -> list[tuple]:
        """Directed links of the route from a to b: dimension-ordered shortest path on a torus."""
        if a == b:
            return []
        if self.network == "torus":
            links = []
            cur = list(self.coords(a))
            target = self.coords(b)
            for axis, size in enumerate(self.shape):
                move = self._axis_steps(cur[axis], target[axis], size)
                step = 1 if move > 0 else -1
                for _ in range(abs(move)):
                    links.append(("ici", tuple(cur), axis, step))
                    cur[axis] = (cur[axis] + step) % size
            return links
        if self.network == "nvswitch":
            return [("up", a), ("down", b)]
        sa, sb = a // PCIE_GPUS_PER_SWITCH, b // PCIE_GPUS_PER_SWITCH
        if sa == sb:
            return [("up", a), ("down", b)]
        return [("up", a), ("socket", sa, sb), ("down", b)]

    def summary(self) -> dict:
        return {
            "name": self.name,
            "chip": self.chip.name,
            "devices": self.n_devices,
            "network": self.network,
            "shape": list(self.shape),
            "wraparound": self.wraparound if self.network == "torus" else None,
            "link_gb_s": self.link_bandwidth / 1e9,
            "hop_latency_us": self.hop_latency * 1e6,
            "peak_tflops": self.chip.peak_flops / 1e12,
            "hbm_gb": self.chip.hbm_bytes / 1e9,
        }


def parse_topology(name: str) -> Topology:
    """``v5e:2x4`` / ``v5p:2x2x2`` / ``8xH100-nvlink``; raises :class:`UnknownTopology` listing known ones."""
    text = name.strip()
    known = ", ".join(KNOWN_TOPOLOGIES)
    m = re.fullmatch(r"(v5e|v5p):(\d+(?:x\d+)+)", text, flags=re.IGNORECASE)
    if m:
        family = m.group(1).lower()
        shape = tuple(int(s) for s in m.group(2).split("x"))
        dims = 2 if family == "v5e" else 3
        if len(shape) != dims or any(s < 1 for s in shape):
            raise UnknownTopology(
                f"topology {name!r}: {family} slices are {dims}-D ({'AxB' if dims == 2 else 'AxBxC'}); "
                f"known: {known}"
            )
        if family == "v5e":
            return Topology(
                text.lower(),
                family,
                "torus",
                shape,
                V5E,
                V5E_LINK_BANDWIDTH,
                ICI_HOP_LATENCY,
                ICI_STEP_LATENCY,
            )
        return Topology(
            text.lower(),
            family,
            "torus",
            shape,
            V5P,
            V5P_LINK_BANDWIDTH,
            ICI_HOP_LATENCY,
            ICI_STEP_LATENCY,
            # cloud.google.com/tpu/docs/v5p: only slices made of whole 4x4x4 cubes have wraparound links.
            wraparound=all(size % 4 == 0 for size in shape),
        )
    m = re.fullmatch(r"(\d+)xH100-(nvlink|pcie)", text, flags=re.IGNORECASE)
    if m:
        n, link = int(m.group(1)), m.group(2).lower()
        if not 1 <= n <= 8:
            raise UnknownTopology(f"topology {name!r}: a GPU box has 1 to 8 GPUs; known: {known}")
        if link == "nvlink":
            return Topology(
                f"{n}xH100-nvlink",
                "h100",
                "nvswitch",
                (n,),
                H100_SXM,
                NVLINK_H100_BANDWIDTH,
                NVLINK_HOP_LATENCY,
                NVLINK_STEP_LATENCY,
            )
        return Topology(
            f"{n}xH100-pcie",
            "h100",
            "pcie",
            (n,),
            H100_PCIE,
            PCIE_GEN5_BANDWIDTH,
            PCIE_HOP_LATENCY,
            PCIE_STEP_LATENCY,
        )
    raise UnknownTopology(f"unknown topology {name!r}; known: {known}")


def physical_devices(topology: Topology) -> list:
    """JAX devices indexed by physical index: compile-only TPU devices from libtpu for TPU slices, fake
    host CPU devices for GPU boxes (their collectives are costed by the model, not by XLA's GPU backend)."""
    import jax

    if topology.is_tpu:
        import os

        from jax.experimental import topologies

        # Compile-only devices need no exclusive access to chips: without this, a second process that
        # plans (or a test run next to a CLI run) fails on libtpu's /tmp/libtpu_lockfile.
        os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
        from engine.machine.probe import tpu_present

        if not tpu_present():
            # Off a TPU VM libtpu looks for the VM's metadata server and worker list, fails, and prints a
            # screenful of warnings before describing the topology anyway. Compile-only devices need
            # neither: say so. (Any accelerator type will do; the topology name decides the devices.)
            os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
            os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
            os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-8")

        name = f"{topology.family}:{'x'.join(str(s) for s in topology.shape)}"
        try:
            devices = topologies.get_topology_desc(name, platform="tpu").devices
        except Exception as exc:  # noqa: BLE001 - libtpu's errors are RuntimeErrors with long texts
            raise UnknownTopology(f"libtpu cannot describe topology {name!r}: {str(exc)[:300]}") from exc
        by_index: dict[int, object] = {}
        for d in devices:
            coords = tuple(d.coords)[: len(topology.shape)]
            by_index[topology.index(coords)] = d
        if sorted(by_index) != list(range(topology.n_devices)):
            raise UnknownTopology(f"libtpu's {name} devices do not cover the {topology.shape} grid")
        return [by_index[i] for i in range(topology.n_devices)]
    cpus = jax.devices("cpu")
    if len(cpus) < topology.n_devices:
        raise UnknownTopology(
            f"{topology.name} needs {topology.n_devices} host devices, this process has {len(cpus)} "
            "(engine.xla.runtime.configure_jax must run before JAX starts)"
        )
    return list(cpus[: topology.n_devices])


def default_order(topology: Topology, devices: Sequence) -> list[int]:
    """Physical indices in the order JAX lists the devices (by id): what ``np.array(jax.devices())``
    reshaped to a mesh gives a user who does not think about placement."""
    ids = [getattr(d, "id", i) for i, d in enumerate(devices)]
    return sorted(range(len(devices)), key=lambda i: ids[i])


@dataclass(frozen=True)
class Collective:
    """One collective of a program, in logical device ids (positions in the mesh's flattened devices).

    ``nbytes``: per-device size — the operand for all-reduce / reduce-scatter / all-to-all /
    collective-permute, the result for all-gather. ``groups``: replica groups; ``pairs``: the
    source-target pairs of a collective-permute.
    """

    kind: str
    nbytes: int
    groups: tuple[tuple[int, ...], ...] = ()
    pairs: tuple[tuple[int, int], ...] = ()
    count: int = 1  # identical collectives folded together

    def to_dict(self) -> dict:
        return {
            "kind": self.kind,
            "bytes": self.nbytes,
            "count": self.count,
            "groups": [list(g) for g in self.groups][:8],
            "pairs": [list(p) for p in self.pairs][:16],
        }


def step_time(
    topology: Topology, pairs: Iterable[tuple[int, int]], nbytes: float, aware: bool = True
) -> float:
    """One step: each (src, dst) pair (physical indices) moves ``nbytes`` at the same time."""
    pairs = [(a, b) for a, b in pairs if a != b]
    if not pairs or nbytes <= 0:
        return 0.0
    if not aware:
        return topology.step_latency + topology.hop_latency + nbytes / topology.link_bandwidth
    load: Counter = Counter()
    max_hops = 0
    for a, b in pairs:
        route = topology.route(a, b)
        max_hops = max(max_hops, len(route) if topology.network == "torus" else topology.hops(a, b))
        load.update(route)
    return (
        topology.step_latency
        + max_hops * topology.hop_latency
        + max(load.values()) * nbytes / (topology.link_bandwidth)
    )


def _ring_pairs(groups: Sequence[Sequence[int]], shift: int = 1) -> list[tuple[int, int]]:
    pairs = []
    for g in groups:
        p = len(g)
        pairs += [(g[i], g[(i + shift) % p]) for i in range(p)]
    return pairs


def collective_time(
    topology: Topology,
    kind: str,
    nbytes: float,
    groups: Sequence[Sequence[int]] = (),
    pairs: Sequence[tuple[int, int]] = (),
    aware: bool = True,
) -> float:
    """Seconds for one collective; ``groups`` / ``pairs`` in physical device indices."""
    if kind == "collective-permute":
        return step_time(topology, pairs, nbytes, aware)
    groups = [tuple(g) for g in groups if len(g) > 1]
    if not groups:
        return 0.0
    p = max(len(g) for g in groups)
    if kind == "all-reduce":
        return 2 * (p - 1) * step_time(topology, _ring_pairs(groups), nbytes / p, aware)
    if kind in ("all-gather", "reduce-scatter"):
        return (p - 1) * step_time(topology, _ring_pairs(groups), nbytes / p, aware)
    if kind == "all-to-all":
        return sum(step_time(topology, _ring_pairs(groups, k), nbytes / p, aware) for k in range(1, p))
    raise ValueError(f"unknown collective kind {kind!r}")


def program_comm_time(
    topology: Topology, collectives: Iterable[Collective], placement: Sequence[int], aware: bool = True
) -> float:
    """Sum of the collectives' times (no overlap with compute or each other assumed), logical ids mapped
    to physical devices by ``placement[logical] = physical``."""
    total = 0.0
    for c in collectives:
        groups = [tuple(placement[i] for i in g) for g in c.groups]
        pairs = [(placement[a], placement[b]) for a, b in c.pairs]
        total += c.count * collective_time(topology, c.kind, c.nbytes, groups, pairs, aware)
    return total


def placements(topology: Topology, devices: Sequence | None = None) -> dict[str, list[int]]:
    """A handful of logical -> physical orders: JAX's id order, row-major and snake (boustrophedon, so
    consecutive logical devices are neighbours) orders for each priority of the torus axes."""
    n = topology.n_devices
    out: dict[str, list[int]] = {}
    if devices is not None:
        out["id-order"] = default_order(topology, devices)
    else:
        out["id-order"] = list(range(n))
    if topology.network != "torus":
        return out
    axes = range(len(topology.shape))
    letters = "xyz"
    for priority in itertools.permutations(axes):
        label = "".join(letters[a] for a in priority)
        for snake in (False, True):
            order = _grid_order(topology, priority, snake)
            name = f"{'snake' if snake else 'row'}-{label}"
            if order not in out.values():
                out[name] = order
    return out


def _grid_order(topology: Topology, priority: Sequence[int], snake: bool) -> list[int]:
    """Visit the grid with ``priority[0]`` fastest; with ``snake`` every other line runs backwards."""
    shape = topology.shape
    order = []
    sizes = [shape[a] for a in priority]
    for flat in range(topology.n_devices):
        digits = []
        rest = flat
        for s in sizes:
            digits.append(rest % s)
            rest //= s
        if snake:
            # Reverse a digit when the sum of the slower digits is odd: a Hamiltonian path through the grid.
            # Slowest first, so each flip sees the slower digits as already placed (in 3-D the unflipped
            # ones would give 2-hop jumps between planes).
            for k in range(len(digits) - 2, -1, -1):
                if sum(digits[k + 1 :]) % 2:
                    digits[k] = sizes[k] - 1 - digits[k]
        coords = [0] * len(shape)
        for a, d in zip(priority, digits, strict=True):
            coords[a] = d
        order.append(topology.index(coords))
    return order
