"""The samplers (noise schedulers) the one denoising loop runs, as registered adapters.

A sampler is one :class:`SchedulerAdapter` subclass registered with :func:`register_sampler`: its name, its
family, the scheduler it builds from a model's training schedule, ``set_timesteps`` and ``step`` (the next
sample and the clean-sample estimate). The loop (``engine.sampling``) calls only those, so it never asks which
sampler runs; the request's validation, the server's schema, the CLI's choices and the models' offers read the
names here (:func:`sampler_names`), never a list of their own.

A model offers every sampler of its family (:func:`samplers_of`): the family is what the model was trained for,
a DDPM-style noise schedule (``NOISE_SCHEDULE``: any of its samplers runs on the same betas) or a flow
(``FLOW``: the network predicts a velocity).

Importing this package imports no torch, numpy or MONAI (the adapters import them when they run): the CLI offers
the names as choices at its start-up.
"""

from engine.samplers import monai_schedulers  # registers the built-in samplers
from engine.samplers.registry import (
    FAMILIES,
    FLOW,
    NOISE_SCHEDULE,
    SchedulerAdapter,
    StepResult,
    family_of,
    register_sampler,
    sampler_adapter,
    sampler_for_scheduler_class,
    sampler_names,
    samplers_of,
    unregister_sampler,
)

__all__ = [
    "FAMILIES",
    "FLOW",
    "NOISE_SCHEDULE",
    "SchedulerAdapter",
    "StepResult",
    "family_of",
    "monai_schedulers",
    "register_sampler",
    "sampler_adapter",
    "sampler_for_scheduler_class",
    "sampler_names",
    "samplers_of",
    "unregister_sampler",
]
