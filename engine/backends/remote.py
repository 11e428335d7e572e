"""Run requests on a VolSynth engine server (``volsynth serve``) over HTTP(S).

The generator contract is the same as the local backend's: iterate for ``Progress``, get the
``SamplingResult`` from ``StopIteration``; closing the generator cancels the job on the server.

What the client refuses before anything is sent: a token over plain ``http://`` to a host that is not
this machine (use ``https://``, or an SSH tunnel to 127.0.0.1), and a certificate fingerprint for an
``http://`` address. With a fingerprint (``fingerprint=``, the CLI's ``--server-fingerprint``), the
server's certificate must have exactly that SHA-256 (what ``volsynth serve --tls-self-signed`` prints)
and no certificate authority is asked; without one, an ``https://`` server needs a certificate this
machine trusts.

The wire format is :mod:`engine.wire`; this module never imports the server or FastAPI.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
import threading
from collections.abc import Generator
from typing import Any
from urllib.parse import urlsplit

from engine import errors, wire
from engine.api import BackendInfo, Progress, SamplingRequest, SamplingResult
from engine.errors import BackendUnavailable, EngineError, InvalidRequest

STREAM_READ_TIMEOUT_S = 90.0  # the server sends a keepalive line at least every 15 s on a quiet stream
MAX_EMPTY_STREAMS = 3  # streams in a row that end with no event and no reconnect: the server is gone
PLAN_TIMEOUT_S = 900.0  # a full-size plan compiles a few programs on the server: minutes, not seconds


def check_connection(url: str, token: str | None, fingerprint: str | None) -> tuple[str, str | None]:
    """The address and normalised fingerprint, or ``InvalidRequest`` saying why they must not be used.

    Nothing is sent: this looks at the address only (no name is resolved).
    """
    url = str(url).strip().rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidRequest(
            f"{wire.short(url, 80)!r} is not an http(s) address; use e.g. https://gpu-box:8765"
        )
    pin = wire.normalise_fingerprint(fingerprint) if fingerprint else None
    if pin and parts.scheme != "https":
        raise InvalidRequest(
            "a certificate fingerprint pins an https server's certificate; use the https:// address "
            "(`volsynth serve --tls-self-signed` prints it)"
        )
    if token and parts.scheme == "http" and not wire.is_loopback(parts.hostname):
        raise InvalidRequest(
            f"refusing to send the token in clear over http:// to {parts.hostname}: anyone on the network "
            "could read it and the volumes. Use https:// (start the server with --tls-self-signed and "
            "pin the fingerprint it prints) or an SSH tunnel to 127.0.0.1"
        )
    return url, pin


#: How long ``sample`` waits for a place in a full queue (429s, in all), and then for its job's line to move
#: (each time it moves up), before it gives up.
DEFAULT_QUEUE_WAIT_S = 600.0
#: A place farther back than any queue: the first place a job is told is nearer.
MAX_PLACE = 1 << 30
#: The longest single wait between two tries, whatever the server's Retry-After says.
MAX_RETRY_WAIT_S = 60.0
#: How long abandoning a run (or closing with one abandoned) tries to have the server cancel it.
ABANDON_DEADLINE_S = 5.0

log = logging.getLogger(__name__)


def _busy_retry_after(response, default_s: float) -> float | None:
    """For a busy answer (429: a full queue; 503 with a Retry-After: requests in flight), the seconds the server
    asks to wait before trying again (``default_s`` when it does not say a number); None for any other answer."""
    if not (
        response.status_code == 429 or (response.status_code == 503 and "retry-after" in response.headers)
    ):
        return None
    try:
        return float(response.headers.get("retry-after", default_s))
    except ValueError:
        return default_s


def _json_or_none(response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


class _Pin:
    """What a pinned TLS handshake saw, for the error message."""

    def __init__(self, expected: str) -> None:
        self.expected = expected
        self.seen: str | None = None

    @property
    def mismatched(self) -> bool:
        return self.seen is not None and self.seen != self.expected

    def context(self) -> ssl.SSLContext:
        """A TLS context that accepts exactly the certificate with the pinned fingerprint."""
        pin = self

        class PinnedSocket(ssl.SSLSocket):
            def do_handshake(self, block=False):
                super().do_handshake(block)
                der = self.getpeercert(binary_form=True)
                pin.seen = wire.certificate_fingerprint(der) if der else "none"
                if pin.seen != pin.expected:
                    raise ssl.SSLCertVerificationError(
                        f"certificate fingerprint {pin.seen} is not the pinned {pin.expected}"
                    )

        # The pin replaces the certificate authority and the name check: the certificate is self-signed.
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        context.sslsocket_class = PinnedSocket
        return context


class RemoteBackend:
    name = "remote"

    def __init__(
        self,
        url: str,
        token: str | None = None,
        timeout_s: float = 30.0,
        fingerprint: str | None = None,
        queue_wait_s: float = DEFAULT_QUEUE_WAIT_S,
    ):
        import httpx

        self.url, self.fingerprint = check_connection(url, token, fingerprint)
        self.timeout_s = timeout_s
        self.queue_wait_s = queue_wait_s
        self._pin = _Pin(self.fingerprint) if self.fingerprint else None
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = httpx.Client(
            base_url=self.url,
            headers=headers,
            timeout=timeout_s,
            verify=self._pin.context() if self._pin else True,
        )
        self._open_lock = threading.Lock()
        self._open_jobs: dict[str, Any] = {}  # job id -> its open event stream (None between streams)
        self._abandoned: set[str] = set()
        # Abandoned jobs the server has not yet confirmed it forgot. Telling it holds ``_telling``, and so does
        # ``close``: a window that quits right after abandoning a run closes this backend while the thread
        # that tells the server may not have sent its DELETE yet, and a closed client would never send it.
        self._untold: set[str] = set()
        self._telling = threading.Lock()
        self._closed = False

    def close(self) -> None:
        """Abandon the jobs still open (no one will read them once the connection closes), tell the server
        within ``ABANDON_DEADLINE_S``, then close the connection."""
        self._give_up_open_jobs()
        with self._telling:
            self._tell_abandoned()
            self._closed = True
            self._client.close()

    def abandon(self) -> None:
        """Give up on every job this client is running; safe from any thread, returns within seconds.

        For a step that never ends (a stuck server): the server is asked to cancel each job and the open
        event stream is cut, so the thread iterating ``sample`` gets ``Cancelled`` at once instead of
        waiting on keepalives for a step that does not come.
        """
        self._give_up_open_jobs()
        with self._telling:
            if not self._closed:  # else ``close`` gave up on the same jobs and told the server
                self._tell_abandoned()

    def _give_up_open_jobs(self) -> None:
        """Mark every open job abandoned and not yet told, and cut its event stream."""
        with self._open_lock:
            jobs = dict(self._open_jobs)
            self._abandoned.update(jobs)
            self._untold.update(jobs)
        for stream in jobs.values():
            if stream is not None:
                _cut(stream)

    def _tell_abandoned(self) -> None:
        """DELETE each abandoned job the server has not confirmed, retrying a busy answer (429, or 503 with a
        Retry-After) as it says until ``ABANDON_DEADLINE_S``; a job the server still holds then is logged,
        so a run left on a shared server is never silent. Called holding ``_telling``."""
        import time

        import httpx

        deadline = time.monotonic() + ABANDON_DEADLINE_S
        with self._open_lock:
            jobs = sorted(self._untold)
        for job_id in jobs:
            answer = "no answer"
            while True:
                left = deadline - time.monotonic()
                try:
                    response = self._client.delete(f"/jobs/{job_id}", timeout=max(0.5, left))
                except httpx.HTTPError as exc:
                    answer = wire.short(str(exc) or type(exc).__name__, 200)
                    break
                if response.status_code < 400 or response.status_code == 404:  # cancelled, or already gone
                    with self._open_lock:
                        self._untold.discard(job_id)
                    answer = ""
                    break
                answer = f"it answered {response.status_code}"
                retry = _busy_retry_after(response, default_s=1.0)
                left = deadline - time.monotonic()
                if retry is None or left <= 0:
                    break
                time.sleep(max(0.05, min(retry, left)))
            if answer:
                log.warning(
                    "the engine server at %s was not told to cancel abandoned job %s (%s); it may go on "
                    "running there until it ends",
                    self.url,
                    job_id,
                    answer,
                )

    def _unreachable(self, exc: Exception) -> BackendUnavailable:
        if self._pin is not None and self._pin.mismatched:
            return BackendUnavailable(
                f"the engine server at {self.url} presented a certificate with fingerprint {self._pin.seen}, "
                f"not the pinned {self._pin.expected}; it is not the server you pinned (or its certificate "
                "changed). Nothing was sent. Check the fingerprint `volsynth serve` printed"
            )
        if "CERTIFICATE_VERIFY_FAILED" in str(exc):
            return BackendUnavailable(
                f"the engine server at {self.url} has a certificate this computer does not trust; if it "
                "runs with --tls-self-signed, pin the fingerprint it printed (--server-fingerprint, or the "
                "Fingerprint field in the app)"
            )
        return BackendUnavailable(
            f"cannot reach the engine server at {self.url} ({wire.short(str(exc), 200)}); check the address "
            "and that `volsynth serve` is running"
        )

    def _refusal(self, response) -> EngineError:
        """The engine error a 4xx/5xx answer stands for."""
        try:
            body = response.json()
        except ValueError:
            body = None
        detail = wire.detail_of(body)
        status = response.status_code
        if status == 401:
            return BackendUnavailable(f"the engine server at {self.url} refused the token; check --token")
        if status == 429:
            retry = response.headers.get("retry-after", "a few")
            return BackendUnavailable(f"{detail} (the engine server is busy; try again in {retry} s)")
        if status in (413, 422):
            cls = wire.error_class(body.get("error_class")) if isinstance(body, dict) else InvalidRequest
            return (cls if cls is not EngineError else InvalidRequest)(detail)
        return BackendUnavailable(f"the engine server answered {status}: {detail}")

    def _call(self, method: str, path: str, **kwargs):
        import httpx

        try:
            response = self._client.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from exc
        if response.status_code >= 400:
            raise self._refusal(response)
        return response

    def info(self) -> BackendInfo:
        data = self._call("GET", "/info").json()
        return BackendInfo(
            name=self.name,
            device=f"{self.url} ({data['device']})",
            device_name=data["device_name"],
            details=data.get("details", {}),
        )

    def models(self) -> list[dict[str, Any]]:
        data = self._call("GET", "/models").json()
        return [m for m in data if isinstance(m, dict)] if isinstance(data, list) else []

    def plan(
        self,
        model: str,
        topology: str,
        batch: int = 1,
        cfg: bool = True,
        compile_top: int | None = None,
        time_limit_s: float | None = None,
    ) -> dict[str, Any]:
        """The server's ``volsynth plan`` for one of its models (or ``brain-ldm-bundle``) on a topology.

        Planning compiles several programs on the server and can take minutes for a full-size model;
        ``time_limit_s`` (else the server's default, 120 s) is when it answers with the best plan so far.
        """
        import httpx

        body: dict[str, Any] = {"model": model, "topology": topology, "batch": batch, "cfg": cfg}
        if compile_top is not None:  # else the server's default
            body["compile_top"] = compile_top
        timeout = PLAN_TIMEOUT_S
        if time_limit_s is not None:
            body["time_limit_s"] = time_limit_s
            timeout = max(PLAN_TIMEOUT_S, time_limit_s + PLAN_TIMEOUT_S / 3)  # tracing and answering too
        try:
            return self._call("POST", "/plan", json=body, timeout=timeout).json()
        except BackendUnavailable as exc:
            if isinstance(exc.__cause__, httpx.ReadTimeout):
                raise BackendUnavailable(
                    f"the engine server {self.url} was still planning after {PLAN_TIMEOUT_S:.0f} s; it goes on "
                    "and refuses new plans until it finishes. Try fewer compiled plans (compile top N)."
                ) from exc
            raise

    def metrics(self) -> dict[str, Any] | None:
        try:
            return self._call("GET", "/metrics").json()
        except BackendUnavailable:
            return None

    def _until_text(self, started: float) -> str:
        """``waiting up to 600 s in all, until 15:42:10``: the deadline this client keeps, for people."""
        import time

        left = started + self.queue_wait_s - time.monotonic()
        clock = time.strftime("%H:%M:%S", time.localtime(time.time() + max(0.0, left)))
        return f"waiting up to {self.queue_wait_s:g} s in all, until {clock}"

    def _submit(self, request: SamplingRequest, started: float) -> Generator[Progress, None, str]:
        """POST the job; while the server answers 429 (its queue, or this client's share of it, is full) or
        503 with a Retry-After (its requests in flight are), wait as it says and try again, until
        ``queue_wait_s`` after ``started``, saying so in a ``load`` progress every second (``gen.close()``
        stops the wait at the next one)."""
        import time

        import httpx

        deadline = started + self.queue_wait_s
        while True:
            try:
                response = self._client.request(
                    "POST",
                    "/jobs",
                    content=wire.encode_request(request),
                    headers={"Content-Type": "application/json"},
                )
            except httpx.HTTPError as exc:
                raise self._unreachable(exc) from exc
            if response.status_code < 400:
                return str(response.json()["id"])
            refusal = self._refusal(response)
            now = time.monotonic()
            retry = _busy_retry_after(response, default_s=5.0)
            if retry is None or now >= deadline:
                if retry is not None and self.queue_wait_s > 0:
                    raise errors.BackendUnavailable(
                        f"{refusal} - gave up after waiting {now - started:.0f} s, the most this client waits "
                        f"(--queue-wait {self.queue_wait_s:g})"
                    )
                raise refusal
            wait = max(1.0, min(retry, MAX_RETRY_WAIT_S, deadline - now))
            until = now + wait
            detail = wire.detail_of(_json_or_none(response))
            message = f"{detail}; trying again in {wait:.0f} s ({self._until_text(started)})"
            while (left := until - time.monotonic()) > 0:
                yield Progress("load", 0, 0, time.monotonic() - started, message)
                time.sleep(min(1.0, left))

    def _in_line(self, place: tuple[int, float, float], moved_at: float, started: float) -> Progress:
        """A ``load`` progress for a job waiting its turn: its place, the server's estimate counted down
        since it was told, and how long this client waits for the line to move. ``queue_wait_s`` after the
        job last moved up (or was queued), ``BackendUnavailable`` - unless the server said it starts at once.

        A deadline on the whole time in line would give up on the last jobs of an honest load (12 jobs of
        about a minute each: the last two gave up at 600 s); one on the line's moves still ends a wait behind
        a job that never ends.
        """
        import time

        number, wait_s, told_at = place
        now = time.monotonic()
        in_line = wire.queue_message(number, max(0.0, wait_s - (now - told_at)))
        if now >= moved_at + self.queue_wait_s and not (number == 1 and wait_s < 1):
            raise BackendUnavailable(
                f"the engine server's line did not move for {now - moved_at:.0f} s ({in_line}), the most this "
                f"client waits for it (--queue-wait {self.queue_wait_s:g}); the job was cancelled"
            )
        clock = time.strftime("%H:%M:%S", time.localtime(time.time() + moved_at + self.queue_wait_s - now))
        return Progress(
            "load",
            0,
            0,
            now - started,
            f"{in_line}; waiting up to {self.queue_wait_s:g} s for the line to move, until {clock}",
        )

    def sample(self, request: SamplingRequest) -> Generator[Progress, None, SamplingResult]:
        import time

        import httpx

        started = time.monotonic()  # a full queue's retries take at most queue_wait_s from here
        job_id = yield from self._submit(request, started)
        with self._open_lock:
            self._open_jobs[job_id] = None
        try:
            index, empty_streams, result_event = 0, 0, None
            place: tuple[int, float, float] | None = None  # in line: (place, wait_s, when told)
            moved_at = time.monotonic()  # when it was queued, or last moved nearer the front
            best = MAX_PLACE  # the nearest the front it has been
            running = False
            timeout = httpx.Timeout(self.timeout_s, read=STREAM_READ_TIMEOUT_S)
            while result_event is None:
                received = reconnect = False
                try:
                    with self._client.stream(
                        "GET", f"/jobs/{job_id}/events", params={"since": index}, timeout=timeout
                    ) as stream:
                        if stream.status_code >= 400:
                            stream.read()
                            raise self._refusal(stream)
                        with self._open_lock:
                            self._open_jobs[job_id] = stream
                            if job_id in self._abandoned:
                                raise errors.Cancelled("the job was abandoned")
                        for line in stream.iter_lines():
                            if not line:
                                continue
                            event = wire.decode_event(line)
                            kind = event["type"]
                            if kind == wire.KEEPALIVE:
                                if place is not None and not running:  # count the wait down, check it
                                    yield self._in_line(place, moved_at, started)
                                continue
                            if kind == wire.RECONNECT:  # the server ends long quiet streams; resume
                                reconnect = True
                                break
                            index += 1
                            received = True
                            if kind == wire.QUEUED and not running:
                                told = wire.queue_place(event)  # None from a server that does not say
                                if told is not None:
                                    if told[0] < best:  # nearer the front than ever: the line moved
                                        moved_at, best = time.monotonic(), told[0]
                                    place = (*told, time.monotonic())
                                    if told != (1, 0.0):  # not "next to start" (it starts at once)
                                        yield self._in_line(place, moved_at, started)
                            elif kind == wire.PROGRESS:
                                running = True
                                yield wire.progress_from_event(event)
                            elif kind == wire.ERROR:
                                raise wire.error_from_event(event)
                            elif kind == wire.CANCELLED:
                                raise errors.Cancelled("the job was cancelled on the engine server")
                            elif kind == wire.RESULT:
                                result_event = event
                                break
                except httpx.HTTPError as exc:
                    if job_id in self._abandoned:
                        raise errors.Cancelled("the job was abandoned") from exc
                    raise BackendUnavailable(
                        f"lost the connection to the engine server at {self.url} ({wire.short(str(exc), 200)})"
                    ) from exc
                if job_id in self._abandoned:
                    raise errors.Cancelled("the job was abandoned")
                empty_streams = 0 if (received or reconnect) else empty_streams + 1
                if result_event is None and empty_streams >= MAX_EMPTY_STREAMS:
                    raise BackendUnavailable(f"the engine server at {self.url} closed the job stream early")
            volumes = wire.decode_volumes(self._call("GET", f"/jobs/{job_id}/volumes").content)
            return wire.result_from_event(result_event, volumes, self.url)
        finally:
            with self._open_lock:
                self._open_jobs.pop(job_id, None)
                abandoned = job_id in self._abandoned
                self._abandoned.discard(job_id)
            # Cancelled by the caller (closing this generator), failed mid-way, or done: the server stops
            # the job if it still runs and frees its volumes (an abandoned job was asked already).
            if not abandoned:
                with contextlib.suppress(httpx.HTTPError):
                    self._client.delete(f"/jobs/{job_id}")


def _cut(stream) -> None:
    """Shut an open response's socket down, which wakes a thread blocked reading it (closing would not)."""
    network_stream = stream.extensions.get("network_stream")
    sock = network_stream.get_extra_info("socket") if network_stream is not None else None
    if sock is not None:
        with contextlib.suppress(OSError):
            # socket.socket's own shutdown: SSLSocket's would drop its TLS state under the reading thread.
            socket.socket.shutdown(sock, socket.SHUT_RDWR)
