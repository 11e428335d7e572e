"""XLA compiles that a planning-time limit stops waiting for, without losing their work.

The planner checks its limit before each unit's compile, but one compile for a TPU slice takes 2-290 s here
(bundle U-Net, 2-core CPU), so a limit of 120 s was overrun to 147.5 s by a compile already under way. A
compile cannot be interrupted in-process, but XLA's compiler releases the GIL while it runs (a Python loop on
the main thread kept turning throughout a 14 s TPU compile on another thread, 2-core machine). So the compile
runs on a daemon thread and the planner waits for it only as long as the limit allows; past that it raises
:class:`OutOfTime` and returns its best plan so far on time. The compile goes on in the background and
``keep`` (the plan cache's save) stores its result, so planning again continues from there; a compile of
the same key still under way is joined, not started twice. A process that exits meanwhile drops it (daemon
threads do not hold up exit): ``volsynth plan`` prints its result on the limit, then waits in
:func:`finish_in_flight` (Ctrl+C skips), else a block longer than the limit would never be compiled.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TypeVar

T = TypeVar("T")

_in_flight: dict[str, Future] = {}
_lock = threading.Lock()


class OutOfTime(Exception):
    """The planning-time limit was reached before (or while) a unit was compiled."""


def in_flight() -> list[str]:
    """The keys of the compiles under way (after planning returned: those its limit stopped waiting for)."""
    with _lock:
        return list(_in_flight)


def finish_in_flight() -> int:
    """Wait for the compiles still under way (each lands in the plan cache); returns how many there were."""
    with _lock:
        futures = list(_in_flight.values())
    for future in futures:
        with contextlib.suppress(Exception):  # nothing is kept: planning again compiles it and reports why
            future.result()
    return len(futures)


def compile_within(
    key: str, work: Callable[[], T], seconds: float | None, keep: Callable[[T], None] | None = None
) -> T:
    """``work()`` (compile and read the analyses) on a background thread, waited for at most ``seconds``
    (None: as long as it takes). ``keep(result)`` runs on that thread when it succeeds, whether anyone
    still waits or not. Raises OutOfTime when the time is up first, and whatever ``work`` raised."""
    with _lock:
        future = _in_flight.get(key)
        if future is None:
            future = Future()
            _in_flight[key] = future
            threading.Thread(
                target=_run, args=(key, future, work, keep), name=f"xla-compile-{key[:8]}", daemon=True
            ).start()
    try:
        return future.result(timeout=None if seconds is None else max(0.0, seconds))
    except FutureTimeout:
        raise OutOfTime("the compile under way was left to finish in the background") from None


def _run(key: str, future: Future, work: Callable, keep: Callable | None) -> None:
    try:
        result = work()
        if keep is not None:
            keep(result)
    except BaseException as exc:  # noqa: BLE001 - handed to whoever waits (the planner records the failure)
        with _lock:
            _in_flight.pop(key, None)
        future.set_exception(exc)
        return
    with _lock:
        _in_flight.pop(key, None)
    future.set_result(result)
