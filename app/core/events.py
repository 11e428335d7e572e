"""A minimal observer list for the Qt-free models of app/core (napari's evented models, much smaller)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Event:
    """A minimal observer list: ``event.connect(callback)``; ``event.emit(*args)`` calls them in order."""

    def __init__(self) -> None:
        self._callbacks: list[Callable[..., Any]] = []

    def connect(self, callback: Callable[..., Any]) -> None:
        if callback not in self._callbacks:
            self._callbacks.append(callback)

    def disconnect(self, callback: Callable[..., Any]) -> None:
        if callback in self._callbacks:
            self._callbacks.remove(callback)

    def emit(self, *args: Any) -> None:
        for callback in list(self._callbacks):
            callback(*args)
