"""Compiled unit analyses and finished plans, kept on disk so that planning a model again takes seconds.

Two kinds of entries under ``<user cache>/plans/`` (``~/.cache/volsynth/plans`` on Linux):

* ``units/<key>.json``: one compiled U-Net unit's FLOPs, bytes, temporaries and collectives
  (``engine.xla.block_analysis``), keyed by the sha256 of its jaxpr, the plan's mesh and shardings, the
  device platform and the JAX version. Shared by every model and plan with that block.
* ``results/<key>.json``: a finished :class:`engine.xla.planner.PlanResult`, keyed by
  :func:`plan_key` (the network's architecture hash, the topology, batch, CFG, precision, the pruning
  settings, the analysis mode and the planner version). A result cut short by the time limit is not kept.

Weights never decide a plan (only shapes do), so the key hashes the architecture and the parameter shapes,
not the parameter values: a model and its fine-tune share plans. ``VOLSYNTH_PLAN_CACHE=0`` turns the cache
off; ``VOLSYNTH_PLAN_CACHE=/some/dir`` puts it elsewhere. Unreadable or foreign entries count as misses.

XLA's own compiled programs (JAX's persistent compilation cache) are kept under ``xla/`` in the same folder
while planning (:func:`use_for_xla`), and not at all when the plan cache is off: a JAX cache set elsewhere
(``JAX_COMPILATION_CACHE_DIR``, a folder left by an earlier setup) made a "cold" plan warm at the compiler
and its time a property of the machine's history, not of the planner.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

FORMAT = 1


def default_cache() -> PlanCache | None:
    """The cache at the place ``VOLSYNTH_PLAN_CACHE`` names (default: the user cache), or None when off."""
    setting = os.environ.get("VOLSYNTH_PLAN_CACHE", "")
    if setting == "0":
        return None
    if setting:
        return PlanCache(Path(setting))
    from engine.files.user_folders import user_cache_dir

    return PlanCache(user_cache_dir() / "plans")


def architecture_hash(network) -> str:
    """sha256 of what a plan depends on in the network: its block structure, parameter shapes and input."""
    digest = hashlib.sha256(repr(network.arch).encode())
    for name in sorted(network.params):
        s = network.params[name]
        digest.update(f"{name}:{tuple(s.shape)}:{s.dtype};".encode())
    digest.update(f"{tuple(network.spatial)}:{network.in_channels}:{network.context_dim}".encode())
    return digest.hexdigest()


def plan_key(network, topology, facts: dict[str, Any]) -> str:
    """The key of a finished plan: architecture, topology, effective batch, CFG, precision and ``facts``."""
    data = {
        "format": FORMAT,
        "architecture": architecture_hash(network),
        "topology": topology.summary(),
        "batch": network.batch,
        "cfg": network.cfg,
        "precision": network.precision,
        **facts,
    }
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:32]


class PlanCache:
    """JSON files under ``root``; every write is atomic (a temporary file renamed into place)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.hits = 0
        self.misses = 0

    def _path(self, kind: str, key: str) -> Path:
        return self.root / kind / f"{key}.json"

    def _load(self, kind: str, key: str) -> dict | None:
        try:
            data = json.loads(self._path(kind, key).read_text())
        except (OSError, ValueError):
            self.misses += 1
            return None
        if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("key") != key:
            self.misses += 1
            return None
        self.hits += 1
        return data["value"]

    def _save(self, kind: str, key: str, value: dict) -> None:
        path = self._path(kind, key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_suffix(f".{os.getpid()}.tmp")
            partial.write_text(json.dumps({"format": FORMAT, "key": key, "value": value}))
            partial.replace(path)
        except OSError:
            pass  # a read-only or full cache folder costs the next run time, not this one its result

    def load_unit(self, key: str) -> dict | None:
        return self._load("units", key)

    def save_unit(self, key: str, value: dict) -> None:
        self._save("units", key, value)

    def load_result(self, key: str) -> dict | None:
        return self._load("results", key)

    def save_result(self, key: str, value: dict) -> None:
        self._save("results", key, value)


def use_for_xla(cache: PlanCache | None) -> str | None:
    """Point JAX's persistent compilation cache at ``<cache>/xla`` (None: turn it off) for this process;
    returns the folder in effect. Called before planning compiles anything."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    folder = None if cache is None else str(cache.root / "xla")
    enabled = cache is not None
    if (jax.config.jax_compilation_cache_dir, jax.config.jax_enable_compilation_cache) != (folder, enabled):
        jax.config.update("jax_enable_compilation_cache", enabled)
        jax.config.update("jax_compilation_cache_dir", folder)
        compilation_cache.reset_cache()  # JAX opens its cache once per process: the next compile reopens it
    return folder
