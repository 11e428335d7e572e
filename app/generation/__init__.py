"""Generating from the form: ``install_generation(services, ...)`` (the main window's one call) makes Generate, Cancel
and Random Seed and owns the run lifecycle (progress, previews, telemetry marks)."""

from app.generation.controller import GenerationController, install_generation

__all__ = ["GenerationController", "install_generation"]
