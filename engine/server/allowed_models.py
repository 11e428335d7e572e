"""The models a request may name: the backend's registered ones, by id (never a path)."""

from __future__ import annotations

from engine import wire
from engine.errors import BackendUnavailable, EngineError, ModelNotFound


def registered_sources(backend) -> list | None:
    """The backend's registered models (``ModelSource``), or None when it has no registry to ask."""
    registry = getattr(backend, "registry", None)
    if registry is None:
        return None
    try:
        return registry.list()
    except EngineError:
        raise
    except Exception as exc:  # a broken model folder must not turn into a 500
        raise BackendUnavailable(
            f"the engine server cannot list its models ({type(exc).__name__}); see `volsynth models` there"
        ) from exc


def registered_model_ids(backend) -> list[str] | None:
    """The ids a request may name, or None when the backend has no registry to ask."""
    sources = registered_sources(backend)
    return None if sources is None else [source.id for source in sources]


def check_model(backend, model: str) -> None:
    """Only the server's registered models, by id: never a path, and no hint of which paths exist."""
    ids = registered_model_ids(backend)
    if ids is None:
        if any(c in model for c in "/\\") or model.startswith((".", "~")):
            raise ModelNotFound("this engine server runs its registered models only, chosen by id")
        return
    if model == "":
        from engine.models.registry import DEFAULT_MODEL_ID

        if DEFAULT_MODEL_ID in ids:
            return
        raise ModelNotFound(f"this engine server has no default model; choose one of: {', '.join(ids)}")
    if model not in ids:
        known = ", ".join(ids) or "none"
        raise ModelNotFound(
            f"this engine server has no model with id {wire.short(model, 60)!r}; it runs its registered "
            f"models only, chosen by id (never a path): {known}"
        )
