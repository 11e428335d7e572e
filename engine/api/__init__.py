"""The engine's public data types: what a caller asks for, hears while it runs, and gets back.

Callers import them from here; ``types`` holds the request, progress and result records, ``request_fields`` the
request's fields described once (bounds, help, flag, wire rule) and ``optimization_config`` the speed and precision
settings a request carries, as data only (the code that applies them is :mod:`engine.optimization`, several
layers up); ``relay`` is the one loop that drives a sampling generator.
"""

from engine.api.optimization_config import OptimizationConfig
from engine.api.relay import drive, relay
from engine.api.request_fields import (
    MAX_BATCH,
    MAX_EDGE,
    MAX_PROFILED_STEPS,
    MAX_STEPS,
    REQUEST_FIELDS,
    XLA_PLAN_PATTERN,
    RequestField,
)
from engine.api.types import (
    STAGES,
    Backend,
    BackendInfo,
    Progress,
    SamplingRequest,
    SamplingResult,
    run,
)

__all__ = [
    "MAX_BATCH",
    "MAX_EDGE",
    "MAX_PROFILED_STEPS",
    "MAX_STEPS",
    "STAGES",
    "XLA_PLAN_PATTERN",
    "Backend",
    "BackendInfo",
    "OptimizationConfig",
    "Progress",
    "REQUEST_FIELDS",
    "RequestField",
    "SamplingRequest",
    "SamplingResult",
    "drive",
    "relay",
    "run",
]
