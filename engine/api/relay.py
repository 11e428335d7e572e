"""The one relay that drives a sampling generator: next, relay Progress, honour cancel, close.

Every backend's ``sample`` (and the comparison and cohort runs built on them) is a generator that yields
progress events and returns its result. ``drive`` runs one to the end in the calling thread; ``relay``
re-yields one from inside another generator, mapping its events. Both close the generator they were given
however they end (result, cancel, exception), in the thread that iterated it, so the backend's ``finally``
blocks release memory, files and child processes before they return.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable
from typing import Any, TypeVar, overload

Result = TypeVar("Result")
Event = TypeVar("Event")


@overload
def drive(
    events: Generator[Event, Any, Result],
    *,
    on_progress: Callable[[Event], Any] | None = None,
    should_stop: None = None,
) -> Result: ...


@overload
def drive(
    events: Generator[Event, Any, Result],
    *,
    on_progress: Callable[[Event], Any] | None = None,
    should_stop: Callable[[], bool] | None,
) -> Result | None: ...


def drive(
    events: Generator[Event, Any, Result],
    *,
    on_progress: Callable[[Event], Any] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> Result | None:
    """Drive ``events`` to the end and return its result (the ``StopIteration`` value).

    Each event goes to ``on_progress`` in order. ``should_stop`` is asked before every step of the
    generator; when it says stop, the generator is closed and None is returned (a caller whose generator
    may itself return None tells the two apart by asking ``should_stop`` again).
    """
    try:
        while True:
            if should_stop is not None and should_stop():
                return None
            try:
                event = next(events)
            except StopIteration as done:
                return done.value
            if on_progress is not None:
                on_progress(event)
    finally:
        events.close()


def relay(
    events: Generator[Event, Any, Result],
    each: Callable[[Event], Iterable[Any]] | None = None,
) -> Generator[Any, None, Result]:
    """Re-yield ``events`` from a generator and return its result: ``result = yield from relay(job, each)``.

    ``each(event)`` gives what to yield in the event's place (none, one or several events); without it
    each event is yielded as it is. Closing the outer generator closes ``events``.
    """
    try:
        while True:
            try:
                event = next(events)
            except StopIteration as done:
                return done.value
            if each is None:
                yield event
            else:
                yield from each(event)
    finally:
        events.close()
