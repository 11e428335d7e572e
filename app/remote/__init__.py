"""Engine servers in the app: run generations on another machine's GPU (``volsynth serve`` there).

Generate > Connect to Engine Server... asks for the address and token, checks them (``GET /info`` and
``/models`` in a worker thread) and adds the server to the Device picker as ``remote:<url>``. With it
selected:

- generations and comparisons run there through ``engine.backends.remote.RemoteBackend`` (the app's
  ``BackendPool`` makes one for the ``remote:`` id); the request names the model by id, because the
  server resolves ids in its own registry, and Generate is blocked, with the reason, if the server lacks
  the selected model;
- the Metrics dock shows the server's GPU/CPU (``GET /metrics`` polled once a second into a
  ``FeedSource``), and runs are marked on the server's clock;
- the optimization settings are checked by the server when the run starts.

The token is kept in memory only; the address is remembered for the next start.
"""

from __future__ import annotations

from app.core.remote_connection import MetricsFeed, ServerConnection, normalise_url, probe_server
from app.remote.controller import RemoteController, ServerDialog, install_remote

__all__ = [
    "MetricsFeed",
    "RemoteController",
    "ServerConnection",
    "ServerDialog",
    "install_remote",
    "normalise_url",
    "probe_server",
]
