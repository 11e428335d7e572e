"""The collectives of a compiled XLA program, read from its HLO text: what the planner, the block analysis
and the sharded decoder count (kind, bytes per device, replica groups or source-target pairs)."""

from __future__ import annotations

import re
from collections import Counter

import numpy as np

from engine.xla.topology import Collective

_HLO_OP = re.compile(
    r"=\s*(?P<type>.*?)\s+(?P<op>all-reduce|all-gather|reduce-scatter|collective-permute|all-to-all)"
    r"(?P<start>-start)?\("
)
_ARRAY = re.compile(r"\b(pred|[suf]\d+|bf16|f8\w*|c64|c128)\[([\d,]*)\]")
_ITEMSIZE = {"pred": 1, "bf16": 2, "c64": 8, "c128": 16}


def _arrays(text: str) -> list[int]:
    sizes = []
    for dtype, dims in _ARRAY.findall(text):
        n = int(np.prod([int(d) for d in dims.split(",") if d])) if dims else 1
        item = _ITEMSIZE.get(dtype) or (1 if dtype.startswith("f8") else max(1, int(dtype[1:]) // 8))
        sizes.append(n * item)
    return sizes


def _braced(line: str, key: str) -> str | None:
    """The ``{...}`` value of ``key=`` with nested braces."""
    start = line.find(key + "={")
    if start < 0:
        return None
    i = start + len(key) + 1
    depth = 0
    for j in range(i, len(line)):
        depth += {"{": 1, "}": -1}.get(line[j], 0)
        if depth == 0:
            return line[i : j + 1]
    return None


def _parse_groups(line: str, n_devices: int) -> tuple[tuple[int, ...], ...]:
    explicit = _braced(line, "replica_groups")
    if explicit is not None:
        groups = tuple(
            tuple(int(v) for v in g.split(",") if v) for g in re.findall(r"\{([\d,]*)\}", explicit[1:-1])
        )
        return groups or (tuple(range(n_devices)),)
    m = re.search(r"replica_groups=\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", line)
    if m:
        shape = [int(v) for v in m.group(1).split(",")]
        ids = np.arange(int(np.prod([int(v) for v in m.group(2).split(",")]))).reshape(
            [int(v) for v in m.group(2).split(",")]
        )
        if m.group(3):
            ids = ids.transpose([int(v) for v in m.group(3).split(",")])
        return tuple(tuple(int(v) for v in row) for row in ids.reshape(shape[0], -1))
    m = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", line)
    if m:
        axes = re.findall(r"'([^']+)'=(\d+)", m.group(1))
        names = [a for a, _ in axes]
        sizes = [int(s) for _, s in axes]
        varying = [names.index(a) for a in re.findall(r"'([^']+)'", m.group(2)) if a in names]
        fixed = [i for i in range(len(names)) if i not in varying]
        ids = np.arange(int(np.prod(sizes))).reshape(sizes).transpose(fixed + varying)
        size = int(np.prod([sizes[i] for i in varying])) if varying else 1
        return tuple(tuple(int(v) for v in row) for row in ids.reshape(-1, size))
    # Unknown syntax: assume one group of everything (the costliest reading), so the plan is not favoured.
    return (tuple(range(n_devices)),)


def parse_hlo_collectives(hlo_text: str, n_devices: int) -> list[Collective]:
    """Collectives of a compiled (SPMD-partitioned) HLO module, identical ones folded with a count."""
    found: Counter = Counter()
    for line in hlo_text.splitlines():
        m = _HLO_OP.search(line)
        if not m:
            continue
        kind, start = m.group("op"), bool(m.group("start"))
        sizes = _arrays(m.group("type"))
        if not sizes:
            continue
        if kind == "collective-permute":
            nbytes = sizes[0]
            pairs_text = _braced(line, "source_target_pairs") or "{}"
            pairs = tuple((int(a), int(b)) for a, b in re.findall(r"\{(\d+),(\d+)\}", pairs_text))
            found[(kind, nbytes, (), pairs)] += 1
            continue
        groups = _parse_groups(line, n_devices)
        p = max(len(g) for g in groups)
        if kind == "all-gather" and start:
            nbytes = sum(sizes[len(sizes) // 2 :])  # (operands..., results...)
        elif kind == "reduce-scatter":
            nbytes = sum(sizes) * p  # the result is 1/p of the operand
        else:
            nbytes = sum(sizes)
        found[(kind, nbytes, groups, ())] += 1
    return [Collective(k, int(b), g, pr, n) for (k, b, g, pr), n in found.items()]
