"""The server's limits: what one client may take from it (jobs, queue, body, streams, tokens, sockets)."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.server.connections import ConnectionLimits


@dataclass(frozen=True)
class ServerLimits:
    """What one client may take from the server. The defaults suit one device and a few users."""

    max_concurrent_jobs: int = 1  # jobs running at once (one device: one)
    max_queued_jobs: int = 8  # jobs waiting to run; one more is answered 429
    max_queued_per_client: int = 4  # ... of one client (token): its fair share, so others still get in
    max_body_bytes: int = 64 * 1024  # a request is < 2 kB; 413 beyond this, before parsing
    max_streams: int = 256  # open event streams; one more is answered 429
    # ... of one client, with several clients (--tokens-file): max_streams // clients each; and of one
    # source address, with any number of clients
    max_streams_per_address: int = 128
    keepalive_s: float = 15.0  # a quiet stream gets a keepalive line this often
    stream_idle_s: float = 120.0  # ... and ends (``reconnect``) after this long without an event
    finished_jobs_kept: int = 16  # finished jobs (with their volumes) held per client; its oldest go first
    job_ttl_s: float = 15 * 60.0  # an unread result is kept this long (other clients' jobs never evict it)
    read_ttl_s: float = 60.0  # ... a result its owner has read, this long (for a retry)
    shutdown_grace_s: float = 30.0  # on SIGTERM, a running job may finish within this, then is cancelled
    auth_free_failures: int = 3  # wrong tokens per client answered at once; later ones wait
    auth_base_delay_s: float = 0.25  # the first wait; it doubles with every further failure
    auth_max_delay_s: float = 10.0  # ... up to this
    auth_max_waiting: int = 16  # wrong guesses of one address waiting their turn; more are answered 429
    auth_max_waiting_total: int = 64  # ... and of all addresses together (many addresses are cheap)
    # sockets and request deadlines (idle and slow-header connections), see engine.server.connections
    connections: ConnectionLimits = field(default_factory=ConnectionLimits)
