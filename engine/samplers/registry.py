"""The sampler registry: the adapter base class, ``register_sampler`` and the look-ups by name and family.

The package (``engine.samplers``) re-exports all of it and registers the built-in samplers
(``engine.samplers.monai_schedulers``); the registry lives in a module of its own so that the adapters import it
without importing the package that imports them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

NOISE_SCHEDULE = "noise-schedule"  # betas and their cumulative products; the network predicts noise, v or x0
FLOW = "flow"  # rectified flow: the network predicts a velocity from noise to data
FAMILIES = (NOISE_SCHEDULE, FLOW)


class StepResult:
    """One step of a sampler: the next sample, and the clean-sample estimate of this step (for previews).

    A scheduler that computes the estimate anyway hands it over; for the others it is computed when read, so a
    step whose preview is not due costs nothing more.
    """

    def __init__(self, sample: Any, x0: Any | Callable[[], Any]) -> None:
        self.sample = sample
        self._x0 = x0

    @property
    def x0(self) -> Any:
        if callable(self._x0):
            self._x0 = self._x0()
        return self._x0


class SchedulerAdapter:
    """One sampler: builds its scheduler from a model's training schedule and runs its steps.

    A subclass names the scheduler class it wraps (``scheduler_class``: module and class, so a model file's
    ``_target_`` finds the sampler) and the schedule arguments that class takes (``schedule_args``; the others
    are dropped so that one training schedule drives every sampler of its family). One instance serves one run:
    schedulers keep per-run state (PNDM's history).

    Attributes:
        name: the sampler's name in requests, model files and the CLI.
        family: ``NOISE_SCHEDULE`` or ``FLOW``: models of that family offer it.
        title: the sampler in a few words, for people.
    """

    name: ClassVar[str] = ""
    family: ClassVar[str] = ""
    title: ClassVar[str] = ""
    scheduler_class: ClassVar[tuple[str, str]] = ("", "")
    schedule_args: ClassVar[frozenset[str]] = frozenset()
    schedule_defaults: ClassVar[Mapping[str, Any]] = {}

    def __init__(self, schedule: Mapping[str, Any]) -> None:
        """Build the scheduler; ``TypeError`` or ``ValueError`` when the schedule does not fit it."""
        module, cls = self.scheduler_class
        args = {**self.schedule_defaults, **{k: v for k, v in schedule.items() if k in self.schedule_args}}
        self.scheduler = getattr(importlib.import_module(module), cls)(**args)

    @property
    def timesteps(self) -> Any:
        """The run's timesteps, first to last (a 1-D tensor), after ``set_timesteps``."""
        return self.scheduler.timesteps

    @property
    def num_train_timesteps(self) -> int:
        return int(self.scheduler.num_train_timesteps)

    def set_timesteps(self, steps: int, device: Any, sample_shape: tuple[int, ...]) -> None:
        """Choose the run's ``steps`` timesteps on ``device``; ``sample_shape`` is (batch, channels, x, y, z)."""
        self.scheduler.set_timesteps(steps, device=device)

    def step(self, model_output: Any, t: Any, next_t: Any, sample: Any, generator: Any) -> StepResult:
        """From ``sample`` at ``t`` to the sample at ``next_t`` (0 after the last step). ``generator`` drives
        a stochastic sampler's noise (the same seed, the same volume)."""
        raise NotImplementedError

    def estimate_x0(self, model_output: Any, t: Any, sample: Any) -> Any:
        """The clean-sample estimate a model output at ``t`` implies."""
        raise NotImplementedError


_ADAPTERS: dict[str, type[SchedulerAdapter]] = {}  # name -> adapter, in the order of registration


def register_sampler(adapter: type[SchedulerAdapter]) -> type[SchedulerAdapter]:
    """Register ``adapter`` under its name (a class decorator). A name registered twice is refused."""
    if not adapter.name or adapter.family not in FAMILIES:
        raise ValueError(
            f"sampler {adapter.__name__} needs a name and a family ({' or '.join(FAMILIES)}), "
            f"got {adapter.name!r} and {adapter.family!r}"
        )
    if adapter.name in _ADAPTERS:
        raise ValueError(f"sampler {adapter.name!r} is registered already")
    _ADAPTERS[adapter.name] = adapter
    return adapter


def unregister_sampler(name: str) -> None:
    """Remove a registered sampler (for tests that register one of their own)."""
    _ADAPTERS.pop(name, None)


def sampler_names() -> tuple[str, ...]:
    """Every registered sampler's name, in the order they were registered."""
    return tuple(_ADAPTERS)


def sampler_adapter(name: str) -> type[SchedulerAdapter]:
    """The adapter registered as ``name``; ``KeyError`` when there is none."""
    return _ADAPTERS[name]


def family_of(name: str) -> str:
    """The family of the sampler ``name``; ``KeyError`` when there is none."""
    return _ADAPTERS[name].family


def samplers_of(family: str) -> tuple[str, ...]:
    """The registered samplers of ``family``: what a model of that family offers."""
    return tuple(name for name, adapter in _ADAPTERS.items() if adapter.family == family)


def sampler_for_scheduler_class(class_name: str) -> str | None:
    """The sampler that wraps the scheduler class ``class_name`` (a model file's ``_target_``), first
    registered first; None when none does."""
    return next(
        (name for name, adapter in _ADAPTERS.items() if adapter.scheduler_class[1] == class_name),
        None,
    )
