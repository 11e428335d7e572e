"""Fetch a catalogue model from its hub into the user's models folder, checked, resumable, placed whole.

The order is what a user can rely on:

1. the licence is accepted (remembered per model and version in the user's config folder) before any
   request is made;
2. the hub is asked each file's size, commit and SHA-256 (``HEAD``; huggingface_hub's
   ``get_hf_file_metadata``): an unreachable hub ends here in one line naming the manual steps;
3. the free disk is checked against what is still to come, before the first byte;
4. each file is fetched (:func:`_stream_file`) into a staging folder beside the models folder, appending
   to what an earlier, killed or cancelled, run left (a ``Range`` request): the hub's ``hf_hub_download`` is
   not used because huggingface_hub 2 restarts a killed file from zero (it downloads to a process-unique
   temporary file that a kill leaves behind unused), and its ``http_get`` writes whatever the hub sends
   (checking the size only at the end), has no deadline on a hub that drips bytes, and sends the token to
   wherever it is pointed. Here the token goes only to the hub's own host, never across a redirect; no more
   bytes than the hub announced are written (compressed or not); every 60 s must bring 256 KiB; a full disk
   deletes the part file and says so;
5. each file's SHA-256 is checked: against the catalogue where it records one, else the hub's (the ETag of
   an LFS file is its SHA-256), and against the one recorded at this model version's first download (trust
   on first use: recorded, said to the user, and required from then on); a mismatch deletes the file and
   places nothing;
6. the staged folder is opened through the loader's own checks (JSON only, allow-listed classes, every
   checkpoint read with ``torch.load(weights_only=True)``), then renamed into the models folder whole.

Proxies and mirrors are huggingface_hub's own settings: ``HTTPS_PROXY`` and ``HF_ENDPOINT``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.errors import (
    BackendUnavailable,
    Cancelled,
    EngineError,
    InvalidRequest,
    ModelInvalid,
    OutputError,
)
from engine.formatting import format_bytes, terminal_safe
from engine.models.catalogue import CatalogueEntry, CatalogueFile
from engine.models.source import sha256_file
from engine.models.spec import one_line

PROVENANCE_FILE = "volsynth-download.json"
DEFAULT_HUB = "https://huggingface.co"
#: Space kept free beyond the files themselves: a full disk breaks more than the download.
DISK_MARGIN_BYTES = 64 << 20
HEAD_TIMEOUT_S = 10.0
#: How much is read before each write (huggingface_hub's own is 10 MiB): a write is when progress is
#: shown, Cancel is honoured and a kill loses what was read since, so VolSynth asks for 1 MiB.
WRITE_CHUNK_BYTES = 1 << 20
#: The progress deadline: every window of this many seconds must bring at least MIN_WINDOW_BYTES of a file
#: (4 KiB/s: a working link, however poor, does far better; a hub dripping a byte now and then does not).
PROGRESS_WINDOW_S = 60.0
MIN_WINDOW_BYTES = 256 << 10
#: Seconds without a single byte before a connection counts as lost (then resumed, RESUME_TRIES times).
READ_TIMEOUT_S = 30.0
RESUME_TRIES = 5

Progress = Callable[[int, int, str], None]  # (bytes done, bytes in all, what is happening)


class LicenceNotAccepted(InvalidRequest):
    """The model's licence has not been accepted; nothing was requested from the hub."""


class CopyIncomplete(ModelInvalid):
    """A folder brought by hand lacks some of the model's hub files; ``missing`` names them (folder paths)."""

    def __init__(self, message: str, missing: list[str]) -> None:
        super().__init__(message)
        self.missing = missing


class HubUnreachable(BackendUnavailable):
    """The hub could not be reached; the message names the manual steps and files.

    ``endpoint`` is the hub asked, ``reason`` the transport's own words (one line), ``entry`` the model: a front
    end that has a button for the manual steps words it itself from these.
    """

    def __init__(self, message: str, *, endpoint: str = "", reason: str = "", entry=None) -> None:
        super().__init__(message)
        self.endpoint, self.reason, self.entry = endpoint, reason, entry


# ------------------------------------------------------------------------------------------- seams


def free_disk_bytes(path: Path) -> int:
    """Free bytes on the disk holding ``path`` (its nearest existing parent): the one free-space query."""
    probe = Path(path)
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    return shutil.disk_usage(probe).free


def hub_endpoint() -> str:
    """The hub to ask, read at each call: ``HF_ENDPOINT`` (a mirror) or huggingface.co.

    huggingface_hub reads ``HF_ENDPOINT`` once, when it is first imported; reading it here and passing it
    on means a mirror set after start-up (the app's settings, a test) is the one used.
    """
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_HUB).rstrip("/")


def default_models_dir() -> Path:
    from engine.models.registry import user_models_dir

    return user_models_dir()


def staging_dir(models_dir: Path, entry: CatalogueEntry) -> Path:
    """Where a model is assembled: beside the models folder (same disk, so placing it is one rename) and
    outside it, so the registry never lists a half-fetched folder."""
    return models_dir.parent / f".{models_dir.name}-downloads" / entry.folder


# ---------------------------------------------------------------------------- remembered decisions


class _JsonStore:
    def __init__(self, name: str, path: Path | None = None) -> None:
        if path is None:
            from engine.files.user_folders import user_config_dir

            path = user_config_dir() / name
        self.path = path

    def read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def write(self, data: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True), encoding="utf-8")
        os.replace(tmp, self.path)


class LicenceAcceptances(_JsonStore):
    """Which model versions' licences the user accepted, and when (``accepted-licences.json``)."""

    def __init__(self, path: Path | None = None) -> None:
        super().__init__("accepted-licences.json", path)

    def accepted(self, entry: CatalogueEntry) -> bool:
        record = self.read().get(entry.key)
        return isinstance(record, dict) and record.get("licence") == entry.licence.name

    def accept(self, entry: CatalogueEntry) -> None:
        data = self.read()
        data[entry.key] = {
            "licence": entry.licence.name,
            "url": entry.licence.url,
            "accepted_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        self.write(data)


#: Where a recorded hash came from: a download checked against its hub, or a copy added by hand.
DOWNLOADED = "download"
ON_TRUST = "on trust"


class RecordedHashes(_JsonStore):
    """SHA-256 of each file as first fetched, per model version (``model-hashes.json``)."""

    def __init__(self, path: Path | None = None) -> None:
        super().__init__("model-hashes.json", path)

    def _item(self, entry: CatalogueEntry, path: str) -> dict[str, str]:
        record = self.read().get(entry.key)
        item = record.get(path) if isinstance(record, dict) else None
        if isinstance(item, str):  # recorded before the origin was kept: by a download
            return {"sha256": item, "origin": DOWNLOADED}
        return item if isinstance(item, dict) and isinstance(item.get("sha256"), str) else {}

    def get(self, entry: CatalogueEntry, path: str) -> str | None:
        return self._item(entry, path).get("sha256")

    def origin(self, entry: CatalogueEntry, path: str) -> str | None:
        """``DOWNLOADED`` (checked against the hub or the catalogue when fetched) or ``ON_TRUST`` (a copy
        added by hand: nothing checked it against its publisher)."""
        return self._item(entry, path).get("origin")

    def record(self, entry: CatalogueEntry, hashes: dict[str, str], origin: str = DOWNLOADED) -> None:
        data = self.read()
        data.setdefault(entry.key, {}).update({p: {"sha256": h, "origin": origin} for p, h in hashes.items()})
        self.write(data)

    def forget(self, entry: CatalogueEntry, origin: str | None = None) -> list[str]:
        """Forget the hashes recorded for ``entry`` (only those of ``origin`` when given); returns their paths."""
        data = self.read()
        record = data.get(entry.key)
        if not isinstance(record, dict):
            return []
        gone = [p for p in record if origin is None or self.origin(entry, p) == origin]
        for path in gone:
            del record[path]
        if not record:
            del data[entry.key]
        self.write(data)
        return sorted(gone)


# ------------------------------------------------------------------------------------------ the plan


@dataclass
class FilePlan:
    file: CatalogueFile
    size: int | None
    expected_sha256: str | None  # None: trust on first use (nothing published to check against)
    checked_against: str  # "the catalogue", "the hub's LFS SHA-256", "the first download", "nothing yet"
    url: str = ""
    commit: str | None = None
    etag: str | None = None
    have: int = 0  # bytes already staged (a finished file counts whole)


@dataclass
class DownloadPlan:
    entry: CatalogueEntry
    models_dir: Path
    files: list[FilePlan] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(f.size or 0 for f in self.files)

    @property
    def remaining(self) -> int:
        return sum(max(0, (f.size or 0) - f.have) for f in self.files)

    @property
    def target(self) -> Path:
        return self.models_dir / self.entry.folder

    @property
    def staging(self) -> Path:
        return staging_dir(self.models_dir, self.entry)


def manual_steps(entry: CatalogueEntry) -> str:
    """One line: the files to fetch by hand and the command that installs them."""
    files = "; ".join(f"{f.repo}/resolve/{f.revision}/{f.filename} -> {f.path}" for f in entry.hub_files)
    return (
        f"on a machine that can reach it, download {files} (from https://huggingface.co/), put them in one "
        f"folder with those paths, then run `volsynth models add FOLDER --model {entry.name}` here"
    )


def _unreachable(entry: CatalogueEntry, endpoint: str, exc: BaseException) -> HubUnreachable:
    reason = terminal_safe(one_line(str(exc)), newlines=False)[:160] or type(exc).__name__
    return HubUnreachable(
        f"cannot reach the model hub {endpoint} ({reason}); behind a proxy set HTTPS_PROXY, for a mirror set "
        f"HF_ENDPOINT; or {manual_steps(entry)}",
        endpoint=endpoint,
        reason=reason,
        entry=entry,
    )


def _expected(entry: CatalogueEntry, file: CatalogueFile, etag: str | None, hashes: RecordedHashes):
    """The SHA-256 a fetched file must have, and what it comes from. The publisher's word ranks first (the
    catalogue, then the hub's LFS SHA-256); a hash VolSynth recorded itself only where neither says one,
    and one recorded on trust (a copy added by hand) never outranks the hub's."""
    recorded = hashes.get(entry, file.path)
    trusted = hashes.origin(entry, file.path) == ON_TRUST
    if file.sha256:
        return file.sha256, "the catalogue"
    if is_sha256(etag):
        if recorded and recorded != etag:
            return etag, "the hub's LFS SHA-256 (the hash recorded before differs; the hub's is used)"
        return etag, "the hub's LFS SHA-256"
    if recorded:
        if trusted:
            return recorded, "a hash recorded on trust when a copy was added by hand (not the publisher's)"
        return recorded, "the first download"
    return None, "nothing yet (recorded now, required from now on)"


def require_hub_client(entry: CatalogueEntry) -> None:
    """Refuse in one line when huggingface_hub is not installed (a build without it)."""
    try:
        import huggingface_hub  # noqa: F401
    except ImportError:
        raise BackendUnavailable(
            "fetching models needs huggingface_hub, which this installation lacks "
            f"(pip install 'huggingface-hub>=2.4,<3'); or {manual_steps(entry)}"
        ) from None


def hub_file_metadata(entry: CatalogueEntry, file: CatalogueFile, endpoint: str):
    """The hub's answer to a HEAD of ``file`` (size, commit, ETag: an LFS file's SHA-256); no file data.

    Raises:
        ModelInvalid: The hub has no such file at that revision (the catalogue may be out of date).
        HubUnreachable: The hub cannot be reached.
    """
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.errors import (
        EntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    repo, filename = file.hub_source
    url = hf_hub_url(repo, filename, revision=file.revision, endpoint=endpoint)
    try:
        return get_hf_file_metadata(url, timeout=HEAD_TIMEOUT_S, endpoint=endpoint)
    except (RepositoryNotFoundError, RevisionNotFoundError, EntryNotFoundError) as exc:
        raise ModelInvalid(
            f"the hub {endpoint} has no {file.repo}/{file.filename} at revision {file.revision} "
            f"({type(exc).__name__}); the catalogue may be out of date"
        ) from None
    except OfflineModeIsEnabled as exc:
        raise _unreachable(entry, endpoint, exc) from None
    except Exception as exc:  # noqa: BLE001 - httpx2 and OS errors: every way a hub is out of reach
        if isinstance(exc, EngineError):
            raise
        raise _unreachable(entry, endpoint, exc) from None


def is_sha256(text: str | None) -> bool:
    return text is not None and len(text) == 64 and all(c in "0123456789abcdef" for c in text)


def plan_download(
    entry: CatalogueEntry, models_dir: Path | None = None, *, hashes: RecordedHashes | None = None
) -> DownloadPlan:
    """Ask the hub each file's size and SHA-256 (HEAD requests only; no file data)."""
    require_hub_client(entry)
    models_dir = Path(models_dir) if models_dir else default_models_dir()
    hashes = hashes or RecordedHashes()
    plan = DownloadPlan(entry, models_dir)
    endpoint = hub_endpoint()
    for file in entry.files:
        staged = plan.staging / file.path
        if not file.from_hub:
            size = file.shipped.stat().st_size if file.shipped else 0
            plan.files.append(FilePlan(file, size, file.sha256, "the catalogue", have=0))
            continue
        meta = hub_file_metadata(entry, file, endpoint)
        expected, against = _expected(entry, file, meta.etag, hashes)
        have = 0
        if staged.is_file():
            have = staged.stat().st_size
        elif _part(staged).is_file():
            have = _part(staged).stat().st_size
        plan.files.append(
            FilePlan(file, meta.size, expected, against, meta.location, meta.commit_hash, meta.etag, have)
        )
    return plan


def _part(path: Path) -> Path:
    return path.with_name(path.name + ".part")


# --------------------------------------------------------------------------------------- fetching


class _CountingFile:
    """The staged file as the fetch sees it: every chunk counted for the progress, and a cancel honoured
    between chunks (what was written stays, for the next run to resume)."""

    def __init__(self, handle, on_bytes: Callable[[int], None]) -> None:
        self._handle = handle
        self._on_bytes = on_bytes

    def write(self, data: bytes) -> int:
        written = self._handle.write(data)
        self._handle.flush()
        self._on_bytes(len(data))
        return written

    def seek(self, *args):
        return self._handle.seek(*args)

    def tell(self) -> int:
        return self._handle.tell()

    def truncate(self, *args):
        return self._handle.truncate(*args)


class HubMisbehaved(ModelInvalid):
    """The hub sent more than it announced, or answered a file request in a way VolSynth does not accept."""


class HubTooSlow(HubUnreachable):
    """The hub kept the connection open but sent too little for too long (what arrived stays staged)."""


def _auth_for(url: str, endpoint: str, headers: dict[str, str]) -> dict[str, str]:
    """``headers`` for a request to ``url``: the token only when ``url`` is on the hub's own host.

    A file's location (the HEAD's final ``Location``) is often a CDN; a token sent there is a credential
    given to another party, and an S3-style CDN refuses a signed URL that also carries one.
    """
    from urllib.parse import urlsplit

    mine = urlsplit(endpoint)
    there = urlsplit(url)
    same = (there.scheme, there.hostname, there.port) == (mine.scheme, mine.hostname, mine.port)
    return dict(headers) if same else {k: v for k, v in headers.items() if k.lower() != "authorization"}


def _stream_file(
    url: str,
    handle: _CountingFile,
    *,
    have: int,
    size: int | None,
    endpoint: str,
    headers: dict[str, str],
    name: str,
) -> None:
    """GET ``url`` from byte ``have`` into ``handle``: at most ``size`` bytes in all, with a progress deadline.

    Redirects are followed by hand (at most 5), and the token goes only to the hub's own host: never across
    a redirect to another one. Bytes beyond what the hub announced are never written, also when they come
    compressed. Each ``PROGRESS_WINDOW_S`` must bring ``MIN_WINDOW_BYTES`` (or the rest of the file), so a hub
    that drips a byte now and then ends in a one-line error instead of holding the download forever.
    """
    import httpx

    request_headers = {**headers, "Accept-Encoding": "identity"}
    if have:
        request_headers["Range"] = f"bytes={have}-"
    timeout = httpx.Timeout(HEAD_TIMEOUT_S, read=min(PROGRESS_WINDOW_S, READ_TIMEOUT_S))
    with httpx.Client(timeout=timeout, follow_redirects=False, trust_env=True) as client:
        for _ in range(6):
            request = client.build_request("GET", url, headers=_auth_for(url, endpoint, request_headers))
            response = client.send(request, stream=True)
            if response.is_redirect and "location" in response.headers:
                url = str(response.url.join(response.headers["location"]))
                response.close()
                continue
            break
        else:
            raise HubMisbehaved(f"the hub redirected {name} more than 5 times; nothing more was fetched")
        try:
            if response.status_code >= 400:
                raise HubUnreachable(f"the hub answered {response.status_code} for {name}")
            if have and response.status_code == 200:  # the whole file again, not the rest: start over
                handle.seek(0)
                handle.truncate()
                have = 0
            limit = None if size is None else size - have
            received = 0
            window_start = time.monotonic()
            window_bytes = 0
            buffer = bytearray()
            for piece in response.iter_bytes():
                if limit is not None and received + len(piece) > limit:
                    raise HubMisbehaved(
                        f"the hub sent more of {name} than the {format_bytes(size or 0)} it announced; the "
                        "extra bytes were not written and the file was deleted: fetch it again later"
                    )
                received += len(piece)
                window_bytes += len(piece)
                buffer += piece
                if len(buffer) >= WRITE_CHUNK_BYTES:
                    handle.write(bytes(buffer))
                    buffer.clear()
                now = time.monotonic()
                if now - window_start >= PROGRESS_WINDOW_S:
                    done = limit is not None and received >= limit
                    if window_bytes < MIN_WINDOW_BYTES and not done:
                        raise HubTooSlow(
                            f"the hub sent only {format_bytes(window_bytes)} of {name} in the last "
                            f"{PROGRESS_WINDOW_S:g} s; what arrived is kept: run the same command later to "
                            "resume"
                        )
                    window_start, window_bytes = now, 0
            if buffer:
                handle.write(bytes(buffer))
        finally:
            response.close()
    if limit is not None and received != limit:
        raise _CutShort(f"{name} ended after {received} of {limit} bytes")


def _fetch(
    plan: DownloadPlan, item: FilePlan, advance: Callable[[int], None], endpoint: str | None = None
) -> None:
    from huggingface_hub.utils import build_hf_headers

    staged = plan.staging / item.file.path
    if staged.is_file():
        return
    staged.parent.mkdir(parents=True, exist_ok=True)
    part = _part(staged)
    have = part.stat().st_size if part.is_file() else 0
    if item.size is not None and have > item.size:  # not this file's prefix: start again
        part.unlink()
        have = 0
    headers = build_hf_headers()
    endpoint = endpoint or hub_endpoint()
    try:
        with open(part, "ab") as handle:
            counting = _CountingFile(handle, advance)
            tries = 0
            retried: tuple[type[Exception], ...] = (OSError, *_transport_errors())
            while have != (item.size or -1):
                try:
                    _stream_file(
                        item.url,
                        counting,
                        have=have,
                        size=item.size,
                        endpoint=endpoint,
                        headers=headers,
                        name=item.file.path,
                    )
                    break
                except retried as exc:
                    if _disk_full(exc) or tries >= RESUME_TRIES:
                        raise
                    tries += 1  # a connection lost mid-file: ask for the rest in the same run
                    handle.flush()
                    have = part.stat().st_size
    except HubMisbehaved:
        part.unlink(missing_ok=True)
        raise
    except OSError as exc:
        if _disk_full(exc):
            part.unlink(missing_ok=True)
            raise OutputError(
                f"the disk of {plan.staging} is full: {item.file.path} could not be written; the part "
                "fetched was deleted and nothing was placed: free some space and fetch it again"
            ) from None
        raise
    digest = sha256_file(part)
    if item.expected_sha256 and digest != item.expected_sha256:
        part.unlink()
        raise ModelInvalid(
            f"{item.file.path} from {item.file.repo} has SHA-256 {digest[:16]}..., not "
            f"{item.expected_sha256[:16]}... ({item.checked_against}); it was deleted and nothing was "
            "placed: fetch it again, and if this repeats the hub or a proxy is changing the file"
        )
    os.replace(part, staged)


class _CutShort(Exception):
    """A file's answer ended before its last byte (resumed in the same run, RESUME_TRIES times)."""


def _transport_errors() -> tuple[type[Exception], ...]:
    import httpx

    return (httpx.TransportError, _CutShort)


def _disk_full(exc: BaseException) -> bool:
    import errno

    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def _copy_shipped(plan: DownloadPlan, item: FilePlan) -> None:
    staged = plan.staging / item.file.path
    staged.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(item.file.shipped_copy, staged)
    digest = sha256_file(staged)
    if item.expected_sha256 and digest != item.expected_sha256:
        staged.unlink()
        raise ModelInvalid(
            f"VolSynth's own copy of {item.file.path} is damaged (SHA-256 {digest[:16]}...); reinstall VolSynth"
        )


def verify_folder(folder: Path):
    """Open ``folder`` through the loader's checks and read every checkpoint with weights_only=True."""
    from engine.models.copy_check import check_copy
    from engine.models.maisi import _read_checkpoint
    from engine.models.registry import open_model_folder

    source = open_model_folder(folder)
    for path in sorted(set(source.weight_files.values())):
        if path.suffix == ".pt":
            _read_checkpoint(path)  # refuses anything that needs pickled objects, in one line
    check_copy(source)  # every tensor's shape, against the networks the folder's own config describes
    return source


def get_model(
    entry: CatalogueEntry,
    *,
    models_dir: Path | None = None,
    accept_licence: bool = False,
    progress: Progress | None = None,
    should_stop: Callable[[], bool] | None = None,
    licences: LicenceAcceptances | None = None,
    hashes: RecordedHashes | None = None,
) -> Path:
    """Fetch ``entry`` into ``models_dir`` (the user's models folder by default); returns the placed folder.

    Raises:
        LicenceNotAccepted: The licence was not accepted (no request was made).
        HubUnreachable: The hub cannot be reached (one line with the manual steps).
        OutputError: Not enough free disk (nothing fetched), or the folder is already there.
        ModelInvalid: A file failed its SHA-256 check or the folder fails the loader's checks.
        Cancelled: ``should_stop()`` became true; what was fetched stays staged for the next run.
    """
    licences = licences or LicenceAcceptances()
    hashes = hashes or RecordedHashes()
    report = progress or (lambda done, total, text: None)
    if accept_licence:
        licences.accept(entry)
    if not licences.accepted(entry):
        raise LicenceNotAccepted(
            f"{entry.title} {entry.version} is under the {entry.licence.name} ({entry.licence.url}); read it, "
            f"then accept it: `volsynth models get {entry.name} --accept-licence` or the app's Get Models"
        )
    models_dir = Path(models_dir) if models_dir else default_models_dir()
    target = models_dir / entry.folder
    if target.exists():
        raise OutputError(
            f"{target} already exists; {entry.name} is installed (remove the folder to fetch it again)"
        )
    with _only_get(entry, models_dir):
        return _get_locked(entry, models_dir, report, should_stop, hashes)


@contextlib.contextmanager
def _only_get(entry: CatalogueEntry, models_dir: Path):
    """One get of a model at a time (a lock file beside its staging folder, dropped by the kernel if the
    holder dies): a second get at once says the first is running, instead of both writing one part file."""
    from engine.files.durable import try_lock, unlock

    lock = staging_dir(models_dir, entry).with_name(f"{entry.folder}.lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        if not try_lock(fd):
            raise OutputError(
                f"{entry.name} is being fetched already (another `volsynth models get` or the app's Get Models "
                "is running); wait for it to finish, or stop it, then run this again"
            )
        try:
            yield
        finally:
            unlock(fd)
    finally:
        os.close(fd)


def _get_locked(entry, models_dir: Path, report: Progress, should_stop, hashes: RecordedHashes) -> Path:
    target = models_dir / entry.folder
    if target.exists():  # placed by a get that held the lock meanwhile
        raise OutputError(
            f"{target} already exists; {entry.name} is installed (remove the folder to fetch it again)"
        )
    report(0, 0, "asking the hub")
    plan = plan_download(entry, models_dir, hashes=hashes)
    need = plan.remaining + DISK_MARGIN_BYTES
    free = free_disk_bytes(plan.staging)
    if need > free:
        raise OutputError(
            f"{entry.name} needs {format_bytes(plan.remaining)} more on the disk of {models_dir} (and "
            f"{format_bytes(DISK_MARGIN_BYTES)} spare), but only {format_bytes(free)} is free; free some space"
        )
    total = plan.total
    completed = 0  # bytes of the files finished so far
    done = 0
    current = [""]

    def advance(count: int) -> None:
        nonlocal done
        done += count
        report(done, total, current[0])
        if should_stop is not None and should_stop():
            raise Cancelled(f"download of {entry.name} cancelled; run it again to resume")

    plan.staging.mkdir(parents=True, exist_ok=True)
    try:
        for item in plan.files:
            current[0] = f"fetching {item.file.path}"
            done = completed + min(item.have, item.size or 0)  # a resumed file starts where it was left
            report(done, total, current[0])
            if item.file.from_hub:
                _fetch(plan, item, advance)
            else:
                _copy_shipped(plan, item)
            completed += item.size or 0
            done = completed
            if should_stop is not None and should_stop():
                raise Cancelled(f"download of {entry.name} cancelled; run it again to resume")
    except (Cancelled, EngineError):
        raise
    except OSError as exc:
        raise OutputError(f"cannot write {plan.staging}: {one_line(str(exc))}") from None
    except Exception as exc:  # noqa: BLE001 - a connection lost for good mid-file: resumable later
        raise _unreachable(entry, hub_endpoint(), exc) from None
    return _place(plan, hashes, report)


def _place(plan: DownloadPlan, hashes: RecordedHashes, report: Progress) -> Path:
    entry = plan.entry
    report(plan.total, plan.total, "checking the folder")
    sums = {item.file.path: sha256_file(plan.staging / item.file.path) for item in plan.files}
    first_use = [i.file.path for i in plan.files if i.expected_sha256 is None]
    provenance: dict[str, Any] = {
        "model": entry.name,
        "version": entry.version,
        "licence": {"name": entry.licence.name, "url": entry.licence.url},
        "files": {
            i.file.path: {
                "source": i.file.source_text,
                "commit": i.commit,
                "sha256": sums[i.file.path],
                "checked_against": i.checked_against,
            }
            for i in plan.files
        },
    }
    stated = metadata_licence(plan.staging)
    if stated:
        provenance["licence"]["bundle_metadata"] = stated
    (plan.staging / PROVENANCE_FILE).write_text(json.dumps(provenance, indent=2), encoding="utf-8")
    _write_readme(plan.staging, entry)
    try:
        verify_folder(plan.staging)
    except EngineError as exc:
        # Deleted, not kept for a resume: these files passed their SHA-256 checks, so fetching them again
        # would give the same refused folder.
        shutil.rmtree(plan.staging, ignore_errors=True)
        raise ModelInvalid(
            f"the fetched {entry.name} does not pass VolSynth's checks ({one_line(str(exc))}); it was deleted "
            "and nothing was placed"
        ) from None
    hashes.record(entry, {i.file.path: sums[i.file.path] for i in plan.files if i.file.from_hub})
    if plan.target.exists():
        raise OutputError(f"{plan.target} appeared meanwhile; the fetched copy stays in {plan.staging}")
    plan.target.parent.mkdir(parents=True, exist_ok=True)
    os.rename(plan.staging, plan.target)
    _remove_empty(plan.staging.parent)
    if first_use:
        report(plan.total, plan.total, "recorded SHA-256 (first use): " + ", ".join(first_use))
    return plan.target


def metadata_licence(folder: Path) -> str:
    """What a MONAI bundle's ``configs/metadata.json`` says of its licence ("" when it says nothing)."""
    path = folder / "configs" / "metadata.json"
    if not path.is_file() or path.stat().st_size > 4 << 20:
        return ""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ""
    if not isinstance(data, dict):
        return ""
    said = [
        terminal_safe(f"{k}: {one_line(str(v))[:300]}", newlines=False)
        for k, v in data.items()
        if "licen" in str(k).lower() and v
    ]
    return "; ".join(said)


def _write_readme(folder: Path, entry: CatalogueEntry) -> None:
    """NV-Generate's folder states its weights' licence in README.md's variant table, which the loader reads
    (engine.models.maisi): the fetched folder gets that table, written from the catalogue."""
    if entry.layout != "nv-generate" or (folder / "README.md").exists():
        return
    licence = entry.licence
    (folder / "README.md").write_text(
        f"# {entry.title} {entry.version}\n\n"
        f"Fetched by VolSynth from the sources in {PROVENANCE_FILE}; configs from "
        f"{entry.raw.get('configs_from', {}).get('repository', 'NVIDIA')} (Apache-2.0, LICENSE.configs).\n\n"
        "| | `rflow-mr-brain` |\n|---|---|\n"
        f"| **License** | [{licence.name}]({licence.url}) |\n",
        encoding="utf-8",
    )


def _remove_empty(folder: Path) -> None:
    with contextlib.suppress(OSError):
        folder.rmdir()


# ----------------------------------------------------------------------------------- add a folder


def add_folder(
    folder: Path,
    entry: CatalogueEntry | None = None,
    *,
    models_dir: Path | None = None,
    accept_licence: bool = False,
    licences: LicenceAcceptances | None = None,
    hashes: RecordedHashes | None = None,
) -> Path:
    """Install a model folder brought by hand (a USB stick): checked as a download is, copied into place.

    With ``entry``, the folder must hold that entry's hub files (each checked against the catalogue's or the
    first download's SHA-256, recorded when neither is known); VolSynth's shipped files are added. Without
    it, the folder is copied as it is and must open through the loader's checks.
    """
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise InvalidRequest(f"no folder at {folder}")
    models_dir = Path(models_dir) if models_dir else default_models_dir()
    hashes = hashes or RecordedHashes()
    if entry is not None:
        licences = licences or LicenceAcceptances()
        if accept_licence:
            licences.accept(entry)
        if not licences.accepted(entry):
            raise LicenceNotAccepted(
                f"{entry.title} {entry.version} is under the {entry.licence.name} ({entry.licence.url}); read "
                "it, then add --accept-licence"
            )
    refuse_outside_links(folder)
    name = entry.folder if entry is not None else folder.name
    target = models_dir / name
    if target.exists():
        raise OutputError(f"{target} already exists; remove it first to add this copy")
    staging = models_dir.parent / f".{models_dir.name}-downloads" / f"{name}.add"
    if staging.exists():
        shutil.rmtree(staging)
    try:
        if entry is None:
            shutil.copytree(folder, staging, symlinks=True)
            source_files = {}
        else:
            source_files = _copy_entry_files(folder, entry, staging, hashes)
            _write_readme(staging, entry)
        verify_folder(staging)
    except EngineError:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise OutputError(f"cannot copy {folder} into {models_dir}: {one_line(str(exc))}") from None
    if entry is not None:
        # Nothing here came from the publisher: the hashes are kept as recorded on trust, said so, and
        # never preferred to the hub's (`volsynth models verify NAME --forget-trusted` forgets them).
        hub_paths = {f.path for f in entry.hub_files}
        hashes.record(entry, {p: h for p, h in source_files.items() if p in hub_paths}, ON_TRUST)
    models_dir.mkdir(parents=True, exist_ok=True)
    os.rename(staging, target)
    _remove_empty(staging.parent)
    return target


def _copy_entry_files(folder: Path, entry: CatalogueEntry, staging: Path, hashes: RecordedHashes):
    sums = {}
    missing = [f.path for f in entry.hub_files if not _find(folder, f).is_file()]
    if missing:
        raise CopyIncomplete(
            f"{folder} lacks {', '.join(missing)} of {entry.name}; {manual_steps(entry)}", missing
        )
    free = free_disk_bytes(staging)
    need = sum(_find(folder, f).stat().st_size for f in entry.hub_files) + DISK_MARGIN_BYTES
    if need > free:
        raise OutputError(f"copying {entry.name} needs {format_bytes(need)} free, {format_bytes(free)} is")
    for file in entry.files:
        destination = staging / file.path
        destination.parent.mkdir(parents=True, exist_ok=True)
        source = _find(folder, file) if file.from_hub else file.shipped_copy
        shutil.copyfile(source, destination)  # copies the bytes a link points to, never the link
        digest = sha256_file(destination)
        # The catalogue's hash, or one a download checked against the hub; a hash an earlier add recorded
        # on trust proves nothing, so it does not refuse a different copy (the networks check below does).
        downloaded = file.from_hub and hashes.origin(entry, file.path) == DOWNLOADED
        expected = file.sha256 or (hashes.get(entry, file.path) if downloaded else None)
        if expected and digest != expected:
            raise ModelInvalid(
                f"{file.path} in {folder} has SHA-256 {digest[:16]}..., not {expected[:16]}...; it is not the "
                f"file {entry.name} {entry.version} was published with; nothing was placed"
            )
        sums[file.path] = digest
    return sums


#: A folder brought by hand is walked for links before anything is copied; more entries than this: refused.
MAX_FOLDER_ENTRIES = 10_000


def refuse_outside_links(folder: Path) -> None:
    """Refuse a folder holding any link that points outside it, whether or not the file would be read: a
    copy is installed whole, and a link out of it would make VolSynth's models folder reach elsewhere."""
    root = folder.resolve()
    seen = 0
    for top, dirs, files in os.walk(folder, followlinks=False):
        for name in dirs + files:
            seen += 1
            if seen > MAX_FOLDER_ENTRIES:
                raise ModelInvalid(
                    f"{folder} holds more than {MAX_FOLDER_ENTRIES:,} files and folders; it is not a model folder"
                )
            path = Path(top) / name
            if not path.is_symlink():
                continue
            try:
                real = path.resolve(strict=False)
            except (OSError, RuntimeError):
                real = None
            if real is None or (real != root and root not in real.parents):
                raise ModelInvalid(
                    f"{path.relative_to(folder)} in {folder} is a link to {real or 'a loop'}, outside the "
                    "folder; refusing the copy (copy the file itself into the folder)"
                )


def _find(folder: Path, file: CatalogueFile) -> Path:
    """The file at its folder path, or by name at the top (a stick may hold the files side by side)."""
    at = folder / file.path
    return at if at.is_file() else folder / Path(file.path).name


def is_installed(entry: CatalogueEntry, models_dir: Path | None = None) -> Path | None:
    models_dir = Path(models_dir) if models_dir else default_models_dir()
    target = models_dir / entry.folder
    return target if target.is_dir() else None


def staged_bytes(entry: CatalogueEntry, models_dir: Path | None = None) -> int:
    """Bytes an earlier, unfinished download left staged (what a resume will not fetch again)."""
    models_dir = Path(models_dir) if models_dir else default_models_dir()
    staging = staging_dir(models_dir, entry)
    if not staging.is_dir():
        return 0
    return sum(p.stat().st_size for p in staging.rglob("*") if p.is_file())
