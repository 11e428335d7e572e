"""Metrics sources: a ring buffer of :class:`Sample` objects plus run markers, fed locally or remotely.

* :class:`Sampler` measures this machine on a background thread (default 4 Hz).
* :class:`FeedSource` is fed samples from elsewhere, e.g. the JSON lines a remote backend streams from its
  server, and offers the same API, so the app's metrics dock does not care where numbers come from.

Both satisfy the :class:`MetricsSource` protocol. Everything here is thread-safe and Qt-free. Listeners are
called on the thread that produced the sample (the sampler thread, or the caller of ``feed``); a Qt client
should re-emit from a listener through a signal, or simply poll :meth:`~MetricsSource.history` with
``after_seq`` from a timer.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import json
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from engine.errors import InvalidRequest
from engine.telemetry.collector import LocalCollector, TorchMode
from engine.telemetry.samples import Sample
from engine.telemetry.summary import RunAccumulator

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 0.25
"""4 Hz: smooth enough for live plots, cheap enough to leave on during generation."""

DEFAULT_HISTORY_S = 600.0
"""Ten minutes of history in the ring buffer."""

_MAX_FINISHED_RUNS = 256  # summaries kept for run_summary(); older ones are dropped first

_T = TypeVar("_T")

Listener = Callable[[Sample], None]


class RingBuffer(Generic[_T]):
    """A fixed-capacity, thread-safe FIFO: appending to a full buffer drops the oldest item.

    Args:
        capacity: Most items held (at least 1).
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise InvalidRequest(f"ring buffer capacity must be at least 1, not {capacity}")
        self._items: collections.deque[_T] = collections.deque(maxlen=capacity)
        self._lock = threading.Lock()

    @property
    def capacity(self) -> int:
        """Most items held."""
        return self._items.maxlen or 0

    def append(self, item: _T) -> None:
        """Add ``item`` as the newest, dropping the oldest if full."""
        with self._lock:
            self._items.append(item)

    def items(self) -> list[_T]:
        """A copy of the contents, oldest first."""
        with self._lock:
            return list(self._items)

    def newest(self) -> _T | None:
        """The newest item, or ``None`` when empty."""
        with self._lock:
            return self._items[-1] if self._items else None

    def tail(self, count: int) -> list[_T]:
        """The newest ``count`` items, oldest first."""
        with self._lock:
            if count <= 0:
                return []
            skip = max(0, len(self._items) - count)
            return list(itertools.islice(self._items, skip, None))

    def clear(self) -> None:
        """Remove everything."""
        with self._lock:
            self._items.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def __iter__(self) -> Iterator[_T]:
        return iter(self.items())


@runtime_checkable
class MetricsSource(Protocol):
    """What the app's metrics view (or the CLI) needs from a source of samples, local or remote."""

    def start(self) -> None:
        """Begin producing samples (no-op for sources fed from outside)."""

    def stop(self) -> None:
        """Stop producing samples; history stays readable."""

    def latest(self) -> Sample | None:
        """The newest sample, or ``None`` before the first."""

    def history(self, *, after_seq: int | None = None, last_seconds: float | None = None) -> list[Sample]:
        """Buffered samples, oldest first, optionally only newer than ``after_seq`` or the last seconds."""

    def add_listener(self, callback: Listener) -> Callable[[], None]:
        """Call ``callback(sample)`` for every new sample; returns a function that removes it."""

    def mark_run_start(self, run_id: str) -> None:
        """Start accumulating a summary for ``run_id``."""

    def mark_run_end(self, run_id: str) -> dict[str, Any]:
        """Finish ``run_id`` and return its summary dict."""

    def run_summary(self, run_id: str) -> dict[str, Any] | None:
        """The summary of a finished run, or ``None`` if unknown (or long forgotten)."""


class _BufferedSource:
    """Ring buffer, sequence numbers, listeners and run accounting shared by every source."""

    def __init__(self, capacity: int) -> None:
        self._buffer: RingBuffer[Sample] = RingBuffer(capacity)
        self._lock = threading.Lock()  # guards _next_seq, _listeners, _active, _finished
        self._next_seq = 0
        self._listeners: list[Listener] = []
        self._active: dict[str, RunAccumulator] = {}
        self._finished: collections.OrderedDict[str, dict[str, Any]] = collections.OrderedDict()
        self._listener_errors = 0

    # -- time base: the clock of the samples, which for a remote source is the server's -----------------

    def _now(self) -> tuple[float, float] | None:
        """``(monotonic, wall)`` now on the samples' clock, or ``None`` if not known yet."""
        raise NotImplementedError

    # -- reading ----------------------------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        """Samples the ring buffer holds before dropping the oldest."""
        return self._buffer.capacity

    def latest(self) -> Sample | None:
        """The newest sample, or ``None`` before the first."""
        return self._buffer.newest()

    def history(self, *, after_seq: int | None = None, last_seconds: float | None = None) -> list[Sample]:
        """Buffered samples, oldest first.

        Args:
            after_seq: Only samples with ``seq > after_seq`` -- what a plot polling on a timer asks for,
                passing the last ``seq`` it has.
            last_seconds: Only samples from the last so many seconds (by the newest sample's clock).

        Returns:
            A new list; the samples themselves are immutable and shared.
        """
        if after_seq is not None:
            newest = self._buffer.newest()
            if newest is None or newest.seq <= after_seq:
                return []
            # seq increases by one per sample, so the wanted samples are exactly the newest few.
            samples = self._buffer.tail(newest.seq - after_seq)
            samples = [s for s in samples if s.seq > after_seq]
        else:
            samples = self._buffer.items()
        if last_seconds is not None and samples:
            cutoff = samples[-1].monotonic - last_seconds
            samples = [s for s in samples if s.monotonic >= cutoff]
        return samples

    def add_listener(self, callback: Listener) -> Callable[[], None]:
        """Call ``callback(sample)`` after each new sample is stored.

        The callback runs on the producing thread and must be quick; exceptions it raises are logged and
        swallowed so that one bad listener cannot stop sampling.

        Returns:
            A function that removes the listener (safe to call twice).
        """
        with self._lock:
            self._listeners.append(callback)

        def remove() -> None:
            with self._lock:
                if callback in self._listeners:
                    self._listeners.remove(callback)

        return remove

    # -- runs -------------------------------------------------------------------------------------------

    def mark_run_start(self, run_id: str) -> None:
        """Start a run now. Samples from here on are summarised for it (several runs may overlap).

        Starting an id that is already running restarts it: telemetry must not fail a generation run.
        """
        now = self._now()
        with self._lock:
            if run_id in self._active:
                log.warning("run %r was already started; restarting its telemetry", run_id)
            start, started_at = now if now is not None else (None, None)
            self._active[run_id] = RunAccumulator(
                run_id, start=start, started_at=started_at, previous=self.latest()
            )

    def mark_run_end(self, run_id: str) -> dict[str, Any]:
        """End a run now and return its summary, ready for a volume's provenance.

        Raises:
            InvalidRequest: ``run_id`` was never started (or has already ended).

        Returns:
            The dict described in :meth:`engine.telemetry.summary.RunAccumulator.finish`.
        """
        now = self._now()
        with self._lock:
            accumulator = self._active.pop(run_id, None)
            if accumulator is None:
                raise InvalidRequest(f"no telemetry run {run_id!r} is in progress")
            end, ended_at = now if now is not None else (None, None)
            summary = accumulator.finish(end, ended_at)
            self._finished[run_id] = summary
            self._finished.move_to_end(run_id)
            while len(self._finished) > _MAX_FINISHED_RUNS:
                self._finished.popitem(last=False)
            return summary

    def run_summary(self, run_id: str) -> dict[str, Any] | None:
        """The summary of a finished run, or ``None``."""
        with self._lock:
            return self._finished.get(run_id)

    def active_runs(self) -> list[str]:
        """Ids of runs started and not yet ended."""
        with self._lock:
            return list(self._active)

    # -- writing ----------------------------------------------------------------------------------------

    def _publish(self, sample: Sample) -> Sample:
        with self._lock:
            sample = dataclasses.replace(sample, seq=self._next_seq)
            self._next_seq += 1
            self._buffer.append(sample)
            for accumulator in self._active.values():
                accumulator.add(sample)
            listeners = list(self._listeners)
        for callback in listeners:
            try:
                callback(sample)
            except Exception:
                self._listener_errors += 1
                # The first failure with a traceback, then a reminder now and then instead of a flood.
                if self._listener_errors == 1 or self._listener_errors % 1000 == 0:
                    log.exception("metrics listener %r failed (%d times)", callback, self._listener_errors)
        return sample


class Sampler(_BufferedSource):
    """Samples this machine on a background thread into a ring buffer. Implements :class:`MetricsSource`.

    Example::

        sampler = Sampler()            # 4 Hz, ten minutes of history
        sampler.start()
        sampler.mark_run_start(run_id)
        ...                            # generate
        provenance["telemetry"] = sampler.mark_run_end(run_id)
        sampler.stop()

    Args:
        interval_s: Seconds between samples (default 0.25, i.e. 4 Hz).
        history_s: Seconds of history the ring buffer keeps (default 600).
        collector: What measures; default a :class:`LocalCollector` of this machine.
        torch_mode: Passed to the default collector (``"auto"``: only if torch is already imported).

    Raises:
        InvalidRequest: ``interval_s`` or ``history_s`` is not a positive number.
    """

    def __init__(
        self,
        interval_s: float = DEFAULT_INTERVAL_S,
        history_s: float = DEFAULT_HISTORY_S,
        *,
        collector: LocalCollector | None = None,
        torch_mode: TorchMode = "auto",
    ) -> None:
        if not (isinstance(interval_s, int | float) and math.isfinite(interval_s) and interval_s > 0):
            raise InvalidRequest(
                f"sampling interval must be a positive number of seconds, not {interval_s!r}"
            )
        if not (isinstance(history_s, int | float) and math.isfinite(history_s) and history_s > 0):
            raise InvalidRequest(f"history must be a positive number of seconds, not {history_s!r}")
        super().__init__(capacity=max(1, math.ceil(history_s / interval_s - 1e-9)))
        self.interval_s = float(interval_s)
        self.history_s = float(history_s)
        self._collector = collector if collector is not None else LocalCollector(torch_mode=torch_mode)
        self._thread: threading.Thread | None = None
        self._stop_event = threading.Event()
        self._state_lock = threading.Lock()  # serialises start/stop
        self._thread_cpu_s = 0.0
        self._thread_wall_s = 0.0
        self._thread_samples = 0
        self._errors = 0

    def _now(self) -> tuple[float, float]:
        return time.monotonic(), time.time()

    @property
    def running(self) -> bool:
        """``True`` while the sampling thread is alive."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    def start(self) -> None:
        """Start the sampling thread (no-op if it is running). The first sample is taken at once."""
        with self._state_lock:
            if self.running:
                return
            self._stop_event.clear()
            self._thread_cpu_s = self._thread_wall_s = 0.0
            self._thread_samples = self._errors = 0
            self._thread = threading.Thread(target=self._run, name="volsynth-telemetry", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread, wait for it, and release NVML. History and run summaries stay readable.

        Args:
            timeout: Seconds to wait for an in-progress sample to finish.
        """
        with self._state_lock:
            thread = self._thread
            self._stop_event.set()
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout)
            self._thread = None
            try:
                self._collector.close()
            except Exception:
                log.debug("closing the collector failed", exc_info=True)

    def sample_now(self) -> Sample:
        """Measure once on the calling thread, store and publish the sample, and return it.

        For callers that want a reading without a thread (and for tests); safe alongside the thread.
        """
        return self._publish(self._collector.collect())

    def stats(self) -> dict[str, float]:
        """The sampling thread's own cost since it started.

        Returns:
            ``{"samples", "cpu_s", "wall_s", "cpu_pct_of_core", "errors"}``: CPU seconds the thread used
            (``time.thread_time``, so other threads do not count), wall seconds it ran, and their ratio.
        """
        wall = self._thread_wall_s
        return {
            "samples": float(self._thread_samples),
            "cpu_s": self._thread_cpu_s,
            "wall_s": wall,
            "cpu_pct_of_core": 100.0 * self._thread_cpu_s / wall if wall > 0 else 0.0,
            "errors": float(self._errors),
        }

    def __enter__(self) -> Sampler:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _run(self) -> None:
        cpu0 = time.thread_time()
        wall0 = time.monotonic()
        next_tick = wall0
        while True:  # sample first, then wait: every start() yields at least one sample
            try:
                self._publish(self._collector.collect())
                self._thread_samples += 1
            except Exception:
                # The collector never raises by design; this guards against bugs so the thread lives on.
                self._errors += 1
                if self._errors == 1 or self._errors % 100 == 0:
                    log.exception("telemetry sample failed (%d times)", self._errors)
            now = time.monotonic()
            self._thread_cpu_s = time.thread_time() - cpu0
            self._thread_wall_s = now - wall0
            next_tick += self.interval_s
            if next_tick < now:
                # Fell behind (a slow NVML call, a suspended laptop): skip the missed ticks, don't burst.
                next_tick = now + self.interval_s
            if self._stop_event.wait(next_tick - now):
                break
        self._thread_wall_s = time.monotonic() - wall0
        self._thread_cpu_s = time.thread_time() - cpu0


class FeedSource(_BufferedSource):
    """A :class:`MetricsSource` filled from outside, e.g. by a remote backend reading its server's stream.

    Run markers use the samples' own clock: a run starts at the newest sample received when it is marked
    (or at the next one, if none has arrived yet), since a remote server's monotonic clock cannot be compared
    with ours.

    Args:
        history_s: Seconds of history to keep, at ``interval_s`` between samples.
        interval_s: Expected seconds between fed samples (sizes the buffer only).
    """

    def __init__(self, history_s: float = DEFAULT_HISTORY_S, interval_s: float = DEFAULT_INTERVAL_S) -> None:
        if not (interval_s > 0 and history_s > 0):
            raise InvalidRequest("history_s and interval_s must be positive")
        super().__init__(capacity=max(1, math.ceil(history_s / interval_s - 1e-9)))

    def _now(self) -> tuple[float, float] | None:
        newest = self.latest()
        return None if newest is None else (newest.monotonic, newest.timestamp)

    def start(self) -> None:
        """Nothing to start: samples arrive through :meth:`feed`."""

    def stop(self) -> None:
        """Nothing to stop."""

    def feed(self, item: Sample | Mapping[str, Any] | str | bytes) -> Sample:
        """Store one sample received from elsewhere and notify listeners.

        Args:
            item: A :class:`Sample`, its ``to_dict()`` form, or that form as a JSON text line (what
                ``volsynth monitor --json`` prints).

        Returns:
            The stored sample, with this source's ``seq``.

        Raises:
            InvalidRequest: ``item`` is not valid JSON or not a sample.
        """
        if isinstance(item, Sample):
            sample = item
        else:
            try:
                data = json.loads(item) if isinstance(item, str | bytes) else item
                if not isinstance(data, Mapping):
                    raise TypeError(f"expected a JSON object, got {type(data).__name__}")
                sample = Sample.from_dict(data)
            except (ValueError, TypeError, AttributeError) as exc:
                raise InvalidRequest(f"not a metrics sample: {exc}") from exc
        return self._publish(sample)
