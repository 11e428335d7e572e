"""Run a cohort on Ray: one actor per worker holds the model; the driver writes results as they arrive.

1. Expand the spec into items; open (resume) or create the output folder and its manifest.
2. Start a local Ray runtime (private to this user, on loopback, ended with the driver: see
   ``engine.cohort.local_ray``), or connect to a cluster (``address`` or ``RAY_ADDRESS``).
3. Start the workers: actors of ``_CohortWorker``, each with a thread budget (``num_cpus``) or one GPU
   (``num_gpus=1``), keeping its loaded model between items. Ray restarts an actor whose process died.
   For a model without tissue channels (MAISI, bundles) the worker also segments the volume it made
   (``segment_member``), so segmentation runs in parallel beside the generation, not on the driver.
4. Keep one item in flight per worker (a volume takes seconds; Ray's per-task overhead is milliseconds,
   so a deeper queue gains nothing and a killed worker would take more than its one item with it).
5. Each result comes back to the driver, which writes it (atomically, with its provenance sidecar and the
   tissue maps of a model with label channels, through ``engine.nifti.io.save_volume``) or stores it in
   the vault (maps as parts of the same item), then marks the item done in the manifest.
   A worker that died mid-item costs only that item: it is recorded as a failed attempt and resubmitted.

The run is a generator (``cohort_events``) on the protocol every engine run uses: it yields ``CohortProgress``
and returns the ``CohortSummary``; ``run_cohort`` drives it with the one relay (``engine.api.relay.drive``).

Workers only compute; the driver is the only writer, so a cluster's workers need no shared filesystem.
Each item is one request of batch size 1 with its own seed: its volume does not depend on which worker
ran it or what else ran, which is what makes a re-run and a resume bit-identical on the same device type
and the same threads per worker (on a CPU the thread count splits float32 sums differently).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.cohort.dataset import (
    STATE_DIR,
    image_sidecar_keys,
    skull_stripped,
    tissue_paths,
    volume_path,
    write_description,
    write_map_sidecars,
    write_participants,
)
from engine.cohort.manifest import DONE, FAILED, PENDING, Manifest, manifest_path, now_utc
from engine.cohort.spec import CohortItem, CohortSpec
from engine.errors import BackendUnavailable, EngineError, InvalidRequest, OutputError
from engine.formatting import count_of
from engine.metrics.pace import pace

if TYPE_CHECKING:
    from engine.api import Backend

MAX_ATTEMPTS = 3
LOCAL_OBJECT_STORE_BYTES = 256 * 1024**2  # volumes are a few MB and leave the store as soon as written


@dataclass(frozen=True)
class CohortProgress:
    """A report from a running cohort: counts, rate, ETA and what just happened.

    ``event`` is one of ``started``, ``submitted``, ``done``, ``retry``, ``failed``, ``finished``,
    ``stopped``. ``worker_pid`` is the process of the worker an item went to (``submitted``).
    """

    event: str
    done: int
    failed: int
    total: int
    retries: int
    elapsed_s: float
    rate_per_min: float = 0.0
    eta_s: float | None = None
    participant: str = ""
    path: str = ""
    message: str = ""
    worker_pid: int = 0
    step_s: float | None = None  # last measured seconds per denoising step (for estimates)


@dataclass
class CohortSummary:
    root: Path
    cohort_id: str
    total: int
    done: int
    failed: int
    retries: int
    done_this_run: int
    elapsed_s: float
    workers: int
    threads_per_worker: int
    device: str
    stopped: bool = False
    errors: list[str] = field(default_factory=list)
    # Accelerator devices the workers used (GPUs, XLA devices; 0 on CPU) and the groups they formed: one
    # worker per group (a GPU, or an XLA plan's mesh); xla_plan is the plan every item ran with.
    devices: int = 0
    device_groups: int = 0
    xla_plan: str = ""

    def devices_text(self) -> str:
        """``4 XLA devices in 2 groups of 2 (plan dp2)``, ``2 GPUs``, or "" on CPU."""
        if self.device == "xla":
            per = self.devices // self.device_groups if self.device_groups else 0
            plan = f"plan {self.xla_plan}" if self.xla_plan else "no plan"
            groups = count_of(self.device_groups, "group")
            return f"{count_of(self.devices, 'XLA device')} in {groups} of {per} ({plan})"
        return count_of(self.devices, "GPU") if self.devices else ""

    @property
    def volumes_per_min(self) -> float:
        return 60.0 * self.done_this_run / self.elapsed_s if self.elapsed_s > 0 else 0.0


class _CohortWorker:
    """A Ray actor: one loaded model (LocalBackend's cache) and a thread budget, for many items."""

    def __init__(self, model_path: str, packed_model, device: str, threads: int, xla: dict | None = None):
        import torch

        if device in ("cpu", "xla"):  # the XLA backend's loop (scheduler, noise, guidance) runs in torch
            torch.set_num_threads(max(1, threads))
        self.model_path = _model_here(model_path, packed_model)
        self.plan = (xla or {}).get("plan", "")
        if device == "xla":
            from engine.backends.xla import XlaBackend
            from engine.cohort.xla_groups import worker_devices

            if xla is None:
                raise ValueError("an XLA cohort worker needs its device group's record")
            self.backend: Backend = XlaBackend(
                devices=worker_devices(xla)
            )  # before JAX starts: its group only
        else:
            from engine.backends.factory import make_backend

            self.backend = make_backend(device)

    def pid(self) -> int:
        return os.getpid()

    def generate(self, request: dict[str, Any], segment_modality: str | None = None):
        """(SamplingResult, :func:`worker_identity`, tissue maps or None): the record crosses Ray as it is (a
        dataclass of arrays). With ``segment_modality`` (a cohort of a model without tissue channels) the volume
        is segmented here, beside its generation, as :func:`segment_member` does: workers run in parallel and
        the driver, the one writer, only writes."""
        from engine.api import SamplingRequest, run

        req = SamplingRequest.from_dict({**request, "model": self.model_path, "xla_plan": self.plan})
        result = run(self.backend.sample(req))
        identity = worker_identity()
        if segment_modality is None:
            return result, identity, None
        made = segment_member(result.member(0), segment_modality)
        identity["segmented_here"] = True
        return result, identity, made


def segment_member(member, modality: str) -> tuple[dict, dict]:
    """A generated volume's tissue maps by segmentation, contrast from the cohort's modality (T1w for a bundle,
    which names none): ``(maps, how made)``, or no maps and why (SWI; a volume that is not brain-like)."""
    from engine.anatomy.segment import contrast_from_modality, maps_or_reason

    try:
        contrast = contrast_from_modality(modality or "")
    except InvalidRequest as exc:
        return {}, {"tissue_maps_not_made": str(exc)}
    return maps_or_reason(np.asarray(member.data, dtype=np.float32), member.affine, contrast)


def worker_identity() -> dict[str, Any]:
    """Which process on which machine made a volume: pid, Ray node id, hostname and node address.

    A pid alone names nothing on a cluster (every node has a pid 4242); the node id is the one Ray's own
    tools (``ray list nodes``, the dashboard, logs) show, the hostname what a person recognises.
    """
    import socket

    identity: dict[str, Any] = {"pid": os.getpid(), "hostname": socket.gethostname()}
    try:
        import ray

        identity["node_id"] = ray.get_runtime_context().get_node_id()
        identity["node_ip"] = ray.util.get_node_ip_address()
    except Exception:  # noqa: BLE001 - outside a Ray worker (or an older Ray): the machine's own names only
        identity.setdefault("node_id", None)
    return identity


def _model_here(model_path: str, packed) -> str:
    """The model folder on this node: the driver's path if it is here, else unpacked from the object store."""
    if packed is None or Path(model_path).is_dir():
        return model_path
    import tempfile

    digest = hashlib.sha256()
    for rel in sorted(packed):  # by content: two models may have files of the same names and sizes
        digest.update(rel.encode() + b"\0" + hashlib.sha256(packed[rel]).digest())
    folder = Path(tempfile.gettempdir()) / f"volsynth-model-{digest.hexdigest()[:16]}"
    if not folder.is_dir():
        staging = Path(tempfile.mkdtemp(prefix=".volsynth-model-", dir=folder.parent))
        for rel, data in packed.items():
            (staging / rel).parent.mkdir(parents=True, exist_ok=True)
            (staging / rel).write_bytes(data)
        with contextlib.suppress(OSError):  # another worker on this node may have won the race
            os.replace(staging, folder)
    return str(folder)


def _pack_model(path: Path, limit: int = 4 * 1024**3) -> dict[str, bytes]:
    files = [p for p in sorted(path.rglob("*")) if p.is_file()]
    if sum(p.stat().st_size for p in files) > limit:
        raise InvalidRequest(f"model folder {path} is over 4 GiB; install it on the cluster's nodes instead")
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in files}


def _remove_partials(folder: Path) -> None:
    """Temporaries a killed job left behind (atomic writes name them ``.<target>.<random>.partial...``)."""
    if folder.is_dir():
        for temp in folder.glob(".*.partial*"):
            with contextlib.suppress(FileNotFoundError):
                temp.unlink()


def volume_sha256(volume: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(volume, dtype=np.float32).tobytes()).hexdigest()


# -- Ray runtime -------------------------------------------------------------------------------------------


_private_runtime = None  # the local runtime's private folder and watchdog (engine.cohort.local_ray)


def start_ray(address: str | None = None, num_cpus: int | None = None) -> bool:
    """Connect to a cluster or start a local runtime (loopback only, its token and files private to this
    user, its processes ended with this one). True if this call started it."""
    global _private_runtime
    try:
        import ray
    except ImportError as exc:
        raise BackendUnavailable(
            "cohorts run on Ray, which is not installed; install it with "
            "`pip install 'volsynth-studio[cohort]'` (or `pip install ray`)"
        ) from exc
    if ray.is_initialized():
        return False
    import logging

    address = address or os.environ.get("RAY_ADDRESS") or None
    # Ray's driver runs gc.collect() from a thread of its own when its core asks (PythonGCThread). The driver is
    # the desktop app's process when a cohort runs from the app: a collection off the GUI thread deletes Qt
    # objects there, which crashed the process (a segmentation fault) and deadlocked it (a signal's disconnect
    # waiting forever) in tests after a cohort. Python's own collections still run, on the thread that allocates.
    os.environ.setdefault("RAY_start_python_gc_manager_thread", "0")
    private = None
    try:
        if address:
            ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
        else:
            from engine.cohort import local_ray

            private = local_ray.prepare()
            ray.init(
                num_cpus=num_cpus,
                _node_ip_address="127.0.0.1",
                _temp_dir=str(private.ray_temp_dir),
                include_dashboard=False,
                object_store_memory=LOCAL_OBJECT_STORE_BYTES,
                logging_level=logging.WARNING,
                log_to_driver=False,
            )
    except (ConnectionError, RuntimeError, ValueError) as exc:
        if private is not None:
            private.close()
        where = f"the Ray cluster at {address}" if address else "a local Ray runtime"
        raise BackendUnavailable(
            f"could not start or reach {where}: {str(exc).splitlines()[0][:200]}"
        ) from exc
    except BaseException:
        if private is not None:
            private.close()
        raise
    _private_runtime = private
    return True


def stop_ray() -> None:
    global _private_runtime
    import ray

    ray.shutdown()
    if _private_runtime is not None:
        _private_runtime.close()
        _private_runtime = None


# -- the cohort folder -------------------------------------------------------------------------------------


def prepare_folder(spec: CohortSpec, root: Path, registry=None) -> tuple[Manifest, list[CohortItem], Any]:
    """Open ``root`` as this spec's cohort (resume) or create it. Returns the manifest, items, model source."""
    from engine.models.registry import ModelRegistry

    source = (registry or ModelRegistry()).get(spec.request.model or None)
    items = spec.expand(source.spec)
    root = Path(root).expanduser()
    if manifest_path(root).is_file():
        manifest = Manifest.load(root)
        if manifest.data["spec_sha256"] != spec.sha256:
            raise InvalidRequest(
                f"{root} holds another cohort ({manifest.cohort_id}); resume it with "
                f"`volsynth cohort resume {root}` or choose another --out"
            )
        return manifest, items, source
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise OutputError(f"{root} exists and is not empty; choose a new or empty folder for the cohort")
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot create the cohort folder {root}: {exc.strerror or exc}") from exc
    model: dict[str, Any] = {
        "id": source.spec.id,
        "name": source.spec.name,
        "path": str(source.path),
        "weights_sha256": source.weights_sha256(),
    }
    if source.spec.space:
        model["space"] = source.spec.space
    if source.spec.label_channels:
        model["label_channels"] = list(source.spec.label_channels)
    if source.spec.modalities:
        # The report's brain and ventricle measurements assume a T1-like contrast: it reads this.
        model["modality"] = spec.request.modality or source.spec.default_modality
    if not source.spec.label_channels and source.spec.source in SEGMENTED_SOURCES:
        from engine.anatomy.segment import METHOD

        # Their volumes get tissue maps by segmentation (the writer makes them; the report measures them).
        model["tissue_maps_method"] = METHOD
    # BIDS SkullStripped (REQUIRED in each image's sidecar): what the modality or the model says it makes.
    model["skull_stripped"] = skull_stripped(model.get("modality"), source.spec.description)
    if spec.target == "folder":
        write_description(root, spec.cohort_id, model, spec.to_json())
    else:
        from engine.cohort.dataset import write_text_atomic

        write_text_atomic(root / STATE_DIR / "spec.json", spec.to_json() + "\n")
    return Manifest.create(root, spec, items, model), items, source


#: Models whose volumes have no tissue maps of their own and are segmented as they are written: NV-Generate-MR-Brain
#: (MAISI v2) and MONAI bundles. Other models without label channels (the test models) are not brain models.
SEGMENTED_SOURCES = ("nv-generate", "monai-bundle")


def load_folder_spec(root: str | Path) -> CohortSpec:
    import json

    path = Path(root).expanduser() / STATE_DIR / "spec.json"
    if not path.is_file():
        raise InvalidRequest(f"{root} is not a cohort folder (no {STATE_DIR / 'spec.json'})")
    return CohortSpec.from_dict(json.loads(path.read_text(encoding="utf-8")))


# -- running -----------------------------------------------------------------------------------------------


class _Writer:
    """Where finished volumes go: the BIDS folder or the vault. The driver's only writer.

    ``labels`` are the model's tissue maps: an item is stored only when its volume and every map are.
    """

    def __init__(self, spec: CohortSpec, manifest: Manifest, units: dict[str, str], vault=None, labels=()):
        self.spec, self.manifest, self.units, self.vault = spec, manifest, units, vault
        self.labels = tuple(labels)
        # The image's BIDS suffix (T1w, T2w, FLAIR...): the modality the manifest's model record names.
        self.modality = manifest.data.get("model", {}).get("modality")
        # The template space of the model's volumes: the files' space-<label> entity (none without one).
        self.space = manifest.data.get("model", {}).get("space")
        # A model without tissue channels whose volumes are segmented: by the worker that made each one (beside
        # its generation, in parallel), here only when a result comes without its maps.
        self.segmented = bool(manifest.data.get("model", {}).get("tissue_maps_method"))
        if spec.target == "vault" and vault is None:
            raise InvalidRequest("this cohort goes into a vault; unlock it first (pass the passphrase)")

    def already_stored(self, participant: str) -> bool:
        entry = self.manifest.items[participant]
        if entry["state"] != DONE:
            return False
        if self.spec.target == "folder":
            root = self.manifest.root
            return volume_path(root, participant, self.modality, self.space).is_file() and all(
                p.is_file() for p in tissue_paths(root, participant, self.labels, self.modality, self.space)
            )
        return bool(self._vault_matches(participant))

    def _label(self, participant: str) -> str:
        return f"{self.manifest.cohort_id} {participant}"

    def _vault_matches(self, participant: str, *, complete: bool = True) -> list:
        """This cohort's items for ``participant`` in the vault (with every tissue map, unless not
        ``complete``)."""
        label = self._label(participant)
        return [
            i
            for i in self.vault.search(label, kind="synthetic")
            if i.label == label and (not complete or set(self.labels) <= set(i.tissue_maps))
        ]

    @property
    def segment_modality(self) -> str | None:
        """What a worker segments its volume as (the cohort's modality, "" for none), None when it need not."""
        return (self.modality or "") if self.segmented else None

    def write(self, participant: str, result, worker: dict[str, Any], made=None) -> tuple[str, str]:
        """Store one SamplingResult (a batch of one) made by ``worker`` (:func:`worker_identity`), with the tissue
        maps the worker made of it (``made``: ``(maps, record)`` of :func:`segment_member`); returns (where,
        volume sha256)."""
        from engine.nifti.io import generated_volumes, save_volume

        member = result.member(0)  # the image and the tissue maps decoded with it ({} without label channels)
        volume = np.ascontiguousarray(member.data, dtype=np.float32)
        digest = volume_sha256(volume)
        provenance = dict(result.provenance)
        entry = self.manifest.items[participant]
        provenance["cohort"] = {
            "id": self.manifest.cohort_id,
            "participant": participant,
            "index": entry["index"],
            "spec_sha256": self.manifest.data["spec_sha256"],
        }
        provenance["volume_sha256"] = digest
        # The worker's argv is Ray's default_worker.py; what made this volume is the driver's command.
        provenance["command"] = " ".join(sys.argv[:1]) + " (Ray cohort driver)"
        provenance["worker"] = {**worker, "backend": provenance.get("backend")}
        tissue = member.tissue
        if not self.segmented:
            made = None
        elif made is None:  # a result without the worker's maps (made before workers segmented): make them
            made = segment_member(member, self.modality or "")
        if made is not None:
            tissue = made[0]
            if not tissue:  # why this volume has no maps travels with it
                provenance.update(made[1])
            else:
                provenance["tissue_maps_made"] = made[1]
        if self.spec.target == "vault":
            # A crash after the vault stored the item but before the manifest said so must not store it twice.
            existing = self._vault_matches(participant)
            if existing:
                return existing[0].id, digest
            info = self.vault.add_synthetic(
                replace(member, data=volume, provenance=provenance, tissue=tissue or {}),
                label=self._label(participant),
                # An item of this cohort without its maps (from a model without label channels) stays;
                # the same image comes again, now with them.
                allow_duplicate=bool(self._vault_matches(participant, complete=False)),
            )
            return info.id, digest
        path = volume_path(self.manifest.root, participant, self.modality, self.space)
        path.parent.mkdir(parents=True, exist_ok=True)
        model = self.manifest.data.get("model", {})
        # The result as it came, with the cohort's provenance and the BIDS keys of its sidecar: save_volume
        # writes the maps beside the image; then each map's sidecar (an item is done only after this).
        (written,) = generated_volumes(
            replace(result, provenance={**provenance, **image_sidecar_keys(model)}), [made] if made else None
        )
        save_volume(written, path)
        write_map_sidecars(path, tuple(made[0]) if made else self.labels, model)
        return path.relative_to(self.manifest.root).as_posix(), digest

    def participants(self) -> None:
        if self.spec.target != "folder":
            return
        rows = [
            {"participant": p, "seed": e["seed"], "conditioning": e["conditioning"]}
            for p, e in self.manifest.items.items()
            if e["state"] == DONE
        ]
        write_participants(self.manifest.root, rows, self.units)


def _request_for(spec: CohortSpec, item: dict[str, Any]) -> dict[str, Any]:
    """One item's request (the spec's template with the item's seed and conditioning), as it crosses to a worker."""
    return spec.request.replace(seed=item["seed"], conditioning=item["conditioning"]).to_dict()


def _worker_errors():
    import ray.exceptions as rex

    return (rex.RayActorError, rex.WorkerCrashedError, rex.ObjectLostError, rex.ActorUnavailableError)


def _restarted_pid(ray, actor, errors_types, wait_s: float = 120.0) -> int:
    """The new process of an actor Ray is restarting (calls fail while it restarts); 0 if it stays dead."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return int(ray.get(actor.pid.remote(), timeout=wait_s))
        except errors_types:
            if time.monotonic() > deadline:
                return 0
            time.sleep(0.2)
        except ray.exceptions.GetTimeoutError:
            return 0


def _check_xla_settings(spec: CohortSpec, local: bool) -> None:
    """What an XLA cohort cannot run, refused once before any worker starts (not once per item)."""
    import importlib.util

    if not spec.request.optimization.is_default:
        raise InvalidRequest(
            "the cohort's [optimization] settings are torch settings; --device xla runs float32 XLA programs. "
            "Remove [optimization] from the spec, or use --device cpu / cuda"
        )
    if local and importlib.util.find_spec("jax") is None:  # found without starting it: it would take the TPUs
        raise BackendUnavailable("--device xla needs JAX: pip install 'volsynth-studio[xla]'")


def _check_settings_here(spec: CohortSpec, source, device: str) -> None:
    """A local runtime's workers run on this machine: settings expected slower than fp32 here are refused now,
    once, with the reason, instead of failing every item (on a cluster each worker's engine decides)."""
    from engine.machine.devices import resolve_device
    from engine.optimization.apply import check_combination
    from engine.optimization.tune_store import load_result

    config = spec.request.optimization
    where = resolve_device("cpu" if device == "cpu" else "auto")
    check_combination(config, where, measured=load_result(source.weights_sha256()))


def run_cohort(
    spec: CohortSpec,
    root: str | Path,
    *,
    on_progress: Callable[[CohortProgress], Any] | None = None,
    **options: Any,
) -> CohortSummary:
    """Generate (or finish) a cohort in ``root``. Safe to call again on the same folder: it resumes.

    :func:`cohort_events` (``options`` are its keyword arguments) driven by the one relay
    (:func:`engine.api.relay.drive`) in this thread; ``on_progress`` is called with each
    :class:`CohortProgress` here.
    """
    from engine.api.relay import drive

    # should_stop goes to the run (in options), not to drive: a stopped cohort still ends with its summary.
    return drive(cohort_events(spec, root, **options), on_progress=on_progress)


def cohort_events(
    spec: CohortSpec,
    root: str | Path,
    *,
    address: str | None = None,
    workers: int | None = None,
    threads_per_worker: int | None = None,
    device: str = "auto",
    num_cpus: int | None = None,
    vault=None,
    max_attempts: int = MAX_ATTEMPTS,
    should_stop: Callable[[], bool] | None = None,
    registry=None,
    xla_plan: str | None = None,
    xla_devices: int | None = None,
) -> Generator[CohortProgress, None, CohortSummary]:
    """The cohort run as a generator, on the protocol every engine run uses: it yields
    :class:`CohortProgress` and returns the :class:`CohortSummary`.

    ``should_stop`` stops after the items in flight and still returns the summary; closing the generator
    stops too (the workers are ended and the manifest saved), without one.

    Args:
        spec: The cohort spec.
        root: The output folder (a BIDS-derivative dataset; for a vault target, only the manifest).
        address: A Ray cluster (``ray://host:10001`` or ``host:6379``); None = ``RAY_ADDRESS`` or a new
            local runtime. A runtime already initialised in this process is used as it is.
        workers: Number of worker actors; default one per GPU, else one.
        threads_per_worker: CPU threads per worker; default the thread count this cohort first ran
            with (so a resume stays bit-identical), else the cluster's CPUs divided among the workers.
        device: ``auto`` (GPU when the cluster has one), ``cpu``, ``cuda`` or ``xla`` (the XLA backend: one
            worker per group of XLA devices, see ``engine.cohort.xla_groups``).
        num_cpus: CPUs a new local runtime may use (None = all).
        vault: An unlocked :class:`engine.vault.store.Vault` for a vault target.
        max_attempts: Tries per item when workers die (an engine error in an item is not retried).
        should_stop: Polled about twice a second; True stops the run (finished items stay done).
        registry: Where models are found (a :class:`engine.models.registry.ModelRegistry`; None = the default).
        xla_plan: With ``device="xla"``: every item's plan over its worker's group ("" = one device per
            worker, ``best``, or a name like ``dp2``); None = the plan this cohort first ran with (so a resume
            stays on the same numbers), else "".
        xla_devices: With ``device="xla"``: XLA devices to use in all (default: every TPU chip, or on a host
            without TPUs one group per worker).
    """
    root = Path(root).expanduser().absolute()
    manifest, items, source = prepare_folder(spec, root, registry)
    # A job killed while it rewrote participants.tsv (or another table at the top) left that write's temporary.
    _remove_partials(root)
    if device != "xla" and (xla_plan or xla_devices):
        raise InvalidRequest("--xla-plan and --xla-devices are for --device xla")
    if device == "xla":
        from engine.cohort.xla_groups import plan_devices

        plan_devices(xla_plan or "")  # a name that is no plan is refused before Ray starts
        _check_xla_settings(spec, local=not (address or os.environ.get("RAY_ADDRESS")))
    elif not (address or os.environ.get("RAY_ADDRESS")):
        _check_settings_here(spec, source, device)
    units = {c.name: c.unit for c in source.spec.conditioning}
    writer = _Writer(spec, manifest, units, vault, labels=source.spec.label_channels)
    todo = _items_to_make(spec, root, manifest, writer, items)
    if not todo:  # nothing missing: no runtime, no workers
        return (yield from _nothing_to_make(root, manifest, writer, len(items), device))

    started_here = start_ray(address, num_cpus)
    import ray

    run = _CohortRun(ray, spec, root, manifest, writer, len(items), todo, max_attempts, address)
    try:
        device = yield from run.start(source, device, workers, threads_per_worker, xla_plan, xla_devices)
        yield from run.submit()
        while run.inflight:
            if should_stop is not None and should_stop():
                run.stopped = True
                break
            ready, _ = ray.wait(list(run.inflight), num_returns=1, timeout=0.5)
            for ref in ready:
                yield from run.collect(ref)
            if not run.idle and not run.inflight and run.todo:
                raise BackendUnavailable("every Ray worker died and could not be restarted; see the manifest")
            yield from run.submit()
    except (KeyboardInterrupt, SystemExit, GeneratorExit):  # Ctrl-C, SIGTERM (Ray's handler exits), or closed
        run.stopped = True  # done stays done
        raise
    finally:
        run.end(started_here)
    yield run.progress("stopped" if run.stopped else "finished")
    return run.summary(device)


def _items_to_make(spec: CohortSpec, root: Path, manifest: Manifest, writer: _Writer, items) -> deque[str]:
    """The participants still to make, in order; an item the manifest calls done whose file is gone is made
    again, and the partial files of those to make are removed."""
    todo: deque[str] = deque()
    for item in items:
        entry = manifest.items[item.participant]
        if entry["state"] == DONE and not writer.already_stored(item.participant):
            entry["state"] = PENDING  # the manifest said done but the file is gone: make it again
        if entry["state"] != DONE:
            entry["state"] = PENDING
            todo.append(item.participant)
            if spec.target == "folder":
                _remove_partials(volume_path(root, item.participant).parent)
    return todo


def _nothing_to_make(
    root: Path, manifest: Manifest, writer: _Writer, total: int, device: str
) -> Generator[CohortProgress, None, CohortSummary]:
    """A cohort with every item stored: the tables rewritten, "finished" reported, no runtime started."""
    writer.participants()
    manifest.save()
    failed = manifest.count(FAILED)
    yield CohortProgress("finished", total - failed, failed, total, manifest.retries, 0.0)
    return CohortSummary(
        root, manifest.cohort_id, total, manifest.count(DONE), failed, manifest.retries, 0, 0.0, 0, 0, device
    )


class _CohortRun:
    """What the driver keeps while a cohort runs on Ray: the workers, the items in flight, the counts."""

    def __init__(self, ray, spec, root, manifest, writer, total, todo, max_attempts, address) -> None:
        self.ray, self.spec, self.root, self.manifest, self.writer = ray, spec, root, manifest, writer
        self.total, self.todo, self.max_attempts = total, todo, max_attempts
        self.started = time.perf_counter()
        self.record: dict[str, Any] = {
            "started_utc": now_utc(),
            "address": address or os.environ.get("RAY_ADDRESS"),
        }
        manifest.data["runs"].append(self.record)
        self.remote = bool(address or os.environ.get("RAY_ADDRESS"))
        self.done_this_run = 0
        self.last_step_s: float | None = None
        self.actors: list[Any] = []
        self.pids: list[int] = []
        self.inflight: dict[Any, tuple[str, int]] = {}  # object ref -> (participant, actor index)
        self.idle: deque[int] = deque()
        self.tries: dict[str, int] = {}  # attempts in this run (the manifest's attempts count over all runs)
        self.stopped = False
        self.errors: list[str] = []
        self.elapsed_s = 0.0

    def progress(self, event: str, **kwargs) -> CohortProgress:
        manifest = self.manifest
        elapsed = time.perf_counter() - self.started
        remaining = self.total - manifest.count(DONE) - manifest.count(FAILED)
        per_s, eta = pace(self.done_this_run, elapsed, remaining)
        return CohortProgress(
            event,
            manifest.count(DONE),
            manifest.count(FAILED),
            self.total,
            manifest.retries,
            elapsed,
            60.0 * per_s if per_s else 0.0,
            eta,
            step_s=self.last_step_s,
            **kwargs,
        )

    def start(
        self, source, device: str, workers, threads_per_worker, xla_plan=None, xla_devices=None
    ) -> Generator[CohortProgress, None, str]:
        """Start the worker actors; yields "started" and returns the device they run on."""
        ray = self.ray
        resources = ray.cluster_resources()
        gpus = int(resources.get("GPU", 0))
        if device == "auto":
            device = "cuda" if gpus else "cpu"
        if device == "cuda" and not gpus:
            raise BackendUnavailable(
                "device cuda asked for, but the Ray cluster has no GPUs; use --device cpu"
            )
        # Earlier runs of this cohort: a resume keeps what decides the numbers unless told otherwise.
        runs = self.manifest.data["runs"][:-1]
        groups = None
        if device == "xla":
            from engine.cohort.xla_groups import device_groups

            if xla_plan is None:
                earlier_plans = [r["xla"]["plan"] for r in runs if isinstance(r.get("xla"), dict)]
                xla_plan = earlier_plans[0] if earlier_plans else ""
            groups = device_groups(
                int(resources.get("TPU", 0)), plan=xla_plan, workers=workers, devices=xla_devices
            )
            n_workers = groups.groups
        else:
            n_workers = workers or (gpus if device == "cuda" else 1)
        if n_workers < 1:
            raise InvalidRequest(f"workers must be at least 1, got {n_workers}")
        cpus = int(resources.get("CPU", 1))
        # A CPU float32 sum split among 2 threads can differ in the last bits from 1 thread (1.7e-6 on the
        # demo model), so a resume keeps the thread count the cohort started with unless told otherwise.
        earlier = [r["threads_per_worker"] for r in runs if r.get("threads_per_worker")]
        threads = threads_per_worker or (
            earlier[0] if earlier and device in ("cpu", "xla") else max(1, cpus // n_workers)
        )
        self.record.update(workers=n_workers, threads_per_worker=threads, device=device)
        if groups is not None:
            self.record["xla"] = groups.to_record()
        # A cluster's nodes may not have the model folder: ship it through the object store.
        packed = ray.put(_pack_model(source.path)) if self.remote else None
        options: dict[str, Any] = {"max_restarts": self.max_attempts, "max_task_retries": 0}
        if device == "cuda":
            options.update(num_gpus=1, num_cpus=1)
        elif groups is not None:
            options.update(groups.actor_options())
        else:
            options.update(num_cpus=min(threads, cpus))
        worker_cls = ray.remote(**options)(_CohortWorker)
        xla = groups.to_record() if groups is not None else None
        self.actors = [
            worker_cls.remote(str(source.path), packed, device, threads, xla) for _ in range(n_workers)
        ]
        self.pids = ray.get([a.pid.remote() for a in self.actors])
        self.idle = deque(range(n_workers))
        where = groups.describe() if groups is not None else device
        yield self.progress("started", message=f"{n_workers} worker(s) x {threads} thread(s) on {where}")
        return device

    def submit(self) -> Iterator[CohortProgress]:
        """One item to each idle worker while items remain."""
        while self.idle and self.todo:
            index = self.idle.popleft()
            participant = self.todo.popleft()
            entry = self.manifest.items[participant]
            entry["attempts"] += 1
            self.tries[participant] = self.tries.get(participant, 0) + 1
            ref = self.actors[index].generate.remote(
                _request_for(self.spec, entry), self.writer.segment_modality
            )
            self.inflight[ref] = (participant, index)
            yield self.progress("submitted", participant=participant, worker_pid=self.pids[index])

    def collect(self, ref) -> Iterator[CohortProgress]:
        """Take one finished item: store it, or record the failure (a dead worker's item is retried)."""
        ray, manifest = self.ray, self.manifest
        participant, index = self.inflight.pop(ref)
        entry = manifest.items[participant]
        errors_types = _worker_errors()
        try:
            result, worker, made = ray.get(ref)
        except errors_types as exc:
            message = f"worker {self.pids[index]} died: {type(exc).__name__}"
            entry["errors"].append({"attempt": entry["attempts"], "error": message, "at": now_utc()})
            if self.tries[participant] < self.max_attempts:
                self.todo.appendleft(participant)
                event = "retry"
            else:
                entry["state"] = FAILED
                event = "failed"
            manifest.save()
            pid = _restarted_pid(ray, self.actors[index], errors_types)
            if pid:
                self.pids[index] = pid
                self.idle.append(index)
            else:
                self.errors.append(f"worker {index} could not be restarted")
            yield self.progress(event, participant=participant, message=message)
            return
        except ray.exceptions.RayTaskError as exc:
            cause = exc.cause if isinstance(exc.cause, EngineError) else None
            message = str(cause) if cause else str(exc).strip().splitlines()[-1][:300]
            entry["errors"].append({"attempt": entry["attempts"], "error": message, "at": now_utc()})
            entry["state"] = FAILED
            self.errors.append(f"{participant}: {message}")
            manifest.save()
            self.idle.append(index)
            yield self.progress("failed", participant=participant, message=message)
            return
        self.idle.append(index)
        worker_pid = int(worker["pid"])
        where, digest = self.writer.write(participant, result, worker, made)
        prov = result.provenance
        step_times = prov.get("step_times_s") or []
        if step_times:
            self.last_step_s = float(np.median(step_times))
        entry.update(
            state=DONE,
            file=where,
            volume_sha256=digest,
            seconds=round(float(prov.get("timings", {}).get("total_s", 0.0)), 3),
            worker_pid=worker_pid,
            worker_node=worker.get("node_id"),
            worker_host=worker.get("hostname"),
            finished_utc=now_utc(),
        )
        self.done_this_run += 1
        manifest.save()
        self.writer.participants()
        shown = where if self.spec.target == "vault" else str(self.root / where)
        yield self.progress("done", participant=participant, path=shown, worker_pid=worker_pid)

    def end(self, started_here: bool) -> None:
        """End the workers, record the run in the manifest, and stop a runtime this run started."""
        self.elapsed_s = time.perf_counter() - self.started
        for actor in self.actors:
            with contextlib.suppress(Exception):
                self.ray.kill(actor)
        self.record.update(
            ended_utc=now_utc(),
            elapsed_s=round(self.elapsed_s, 3),
            done=self.done_this_run,
            stopped=self.stopped,
        )
        with contextlib.suppress(EngineError):
            self.manifest.save()
            self.writer.participants()  # Ctrl-C may have come between an item's manifest entry and this table
        if started_here:
            stop_ray()

    def summary(self, device: str) -> CohortSummary:
        manifest = self.manifest
        return CohortSummary(
            root=self.root,
            cohort_id=manifest.cohort_id,
            total=self.total,
            done=manifest.count(DONE),
            failed=manifest.count(FAILED),
            retries=manifest.retries,
            done_this_run=self.done_this_run,
            elapsed_s=self.elapsed_s,
            workers=self.record.get("workers", 0),
            threads_per_worker=self.record.get("threads_per_worker", 0),
            device=self.record.get("device", device),
            stopped=self.stopped,
            errors=self.errors,
            **_devices_used(self.record),
        )


def _devices_used(record: dict[str, Any]) -> dict[str, Any]:
    """A run record's devices, groups and plan, as the summary reports them."""
    xla = record.get("xla")
    if isinstance(xla, dict):
        return {"devices": xla["devices"], "device_groups": xla["groups"], "xla_plan": xla["plan"]}
    workers = int(record.get("workers", 0))
    gpus = workers if record.get("device") == "cuda" else 0
    return {"devices": gpus, "device_groups": workers, "xla_plan": ""}


def resume_cohort(root: str | Path, **kwargs) -> CohortSummary:
    """Finish a cohort folder: only items not done are generated."""
    return run_cohort(load_folder_spec(root), root, **kwargs)
