"""Per-user folders, one root for each kind on every OS (platformdirs).

Data (the vault, user-installed models, the app's crash-recovery folders) lives under ``user_data_dir()``:
``$XDG_DATA_HOME/volsynth`` (``~/.local/share/volsynth``) on Linux, ``~/Library/Application Support/volsynth``
on macOS, ``%LOCALAPPDATA%\\volsynth`` on Windows. Configuration (the vault anchors, the engine server's
TLS files) lives under ``user_config_dir()``. Read at each call, so tests and users can point
``XDG_DATA_HOME``/``XDG_CONFIG_HOME`` elsewhere.
"""

from __future__ import annotations

from pathlib import Path

APP_NAME = "volsynth"


def user_data_dir() -> Path:
    import platformdirs

    return platformdirs.user_data_path(APP_NAME, appauthor=False)


def user_cache_dir() -> Path:
    """Big, re-creatable working files (training checkpoints): ``~/.cache/volsynth`` on Linux."""
    import platformdirs

    return platformdirs.user_cache_path(APP_NAME, appauthor=False)


def user_config_dir() -> Path:
    import platformdirs

    return platformdirs.user_config_path(APP_NAME, appauthor=False)
