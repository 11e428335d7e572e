"""A local Ray runtime that is private to this user, listens on loopback only and ends with its driver.

Measured with Ray 2.60 on Linux (issue 24), and what this module does about each:

* ``ray.init`` creates ``~/.ray/auth_token`` with the umask (0644: readable by every local user) and its
  session folders 0777 (``_temp_dir`` too is chmod'ed 0777). Here the token is made by us, written 0600 into
  a folder made 0700 by ``tempfile.mkdtemp``, and handed to Ray with ``RAY_AUTH_MODE=token`` and
  ``RAY_AUTH_TOKEN_PATH`` (Ray's token loader reads them; ``~/.ray`` is never touched). Ray's temp folder
  (sessions, sockets, logs) is a subfolder of that 0700 folder: Ray's own 0777 below it no longer
  matters, nobody else can traverse into it.
* ``_node_ip_address="127.0.0.1"`` is turned back into the machine's address by
  ``services.resolve_ip_for_localhost`` unless ``ray_constants.ENABLE_RAY_CLUSTER`` is false (Ray's own
  switch for single-machine use on macOS/Windows: ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER``). With it false the
  node address stays 127.0.0.1 and the GCS, raylet, workers and the runtime-env agent all bind to loopback
  (without it they listened on ``*`` and the agent on the external address). It is read at call time, so
  it is set for the runtime's life and restored after; the variable is also set for Ray's child processes.
* After the driver is SIGKILLed, the GCS and raylet die with it, but agents polled for the raylet and kept
  listening for about a minute. A small watchdog process (its own session, so Ctrl-C's signal to the
  terminal's process group does not take it first) waits for EOF on a pipe from the driver, which comes
  when the driver exits or is killed, then ends every process carrying this runtime's token path in its
  environment (Ray's processes inherit it; workers rename themselves, so names cannot be used) and
  deletes the private folder.

None of this applies to a cluster given by address: that cluster's own settings rule there.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

_ENV_KEYS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")

# Run as ``python -c`` (no engine import: it must start fast and depend on nothing but psutil).
_WATCHDOG = r"""
import os, shutil, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
folder, driver = sys.argv[1], int(sys.argv[2])
marker = os.path.join(folder, "auth_token")
sys.stdin.buffer.read()  # EOF: the driver stopped the runtime, exited or was killed
import psutil
me = os.getpid()
def ours():
    found = []
    for proc in psutil.process_iter():
        if proc.pid in (me, driver):
            continue
        try:
            if proc.environ().get("RAY_AUTH_TOKEN_PATH") == marker:
                found.append(proc)
        except (psutil.Error, OSError):
            pass
    return found
procs = ours()
for proc in procs:
    try:
        proc.terminate()
    except psutil.Error:
        pass
gone, alive = psutil.wait_procs(procs, timeout=3)
for proc in alive + ours():
    try:
        proc.kill()
    except psutil.Error:
        pass
psutil.wait_procs(alive, timeout=3)
shutil.rmtree(folder, ignore_errors=True)
"""


@dataclass
class PrivateRuntime:
    """The private folder, token and watchdog of one local Ray runtime."""

    folder: Path
    token_path: Path
    ray_temp_dir: Path
    watchdog: subprocess.Popen
    saved_env: dict[str, str | None]
    saved_cluster_flag: bool | None

    def close(self, wait_s: float = 15.0) -> None:
        """After ``ray.shutdown()``: let the watchdog end stragglers and delete the folder, then restore."""
        with contextlib.suppress(OSError):
            if self.watchdog.stdin is not None:
                self.watchdog.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.watchdog.wait(wait_s)
        for key, value in self.saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if self.saved_cluster_flag is not None:
            import ray._private.ray_constants as ray_constants

            ray_constants.ENABLE_RAY_CLUSTER = self.saved_cluster_flag


def prepare() -> PrivateRuntime:
    """Make the private folder and token, set Ray's environment, start the watchdog. Before ``ray.init``."""
    base = "/tmp" if os.path.isdir("/tmp") else None  # short: Ray's Unix socket paths must stay < 108 bytes
    folder = Path(tempfile.mkdtemp(prefix="volsynth-ray-", dir=base))  # 0700
    token_path = folder / "auth_token"
    fd = os.open(token_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(secrets.token_hex(32))
    ray_temp_dir = folder / "r"
    saved_env = {key: os.environ.get(key) for key in _ENV_KEYS}
    os.environ.update(
        {
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(token_path),
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # for Ray's child processes
        }
    )
    import ray._private.ray_constants as ray_constants

    saved_flag = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False  # keeps the node address 127.0.0.1 (see the module docstring)
    # Both are in the compiled module; ray's _raylet.pyi stub does not list them.
    from ray._raylet import AuthenticationTokenLoader, Config  # type: ignore[attr-defined]

    Config.initialize("")  # Ray caches RAY_AUTH_MODE in its config at import (as its _enable_token_auth does)
    AuthenticationTokenLoader.instance().reset_cache()  # ... and a token read earlier in this process
    watchdog_env = {k: v for k, v in os.environ.items() if k not in _ENV_KEYS}
    watchdog = subprocess.Popen(
        [sys.executable, "-c", _WATCHDOG, str(folder), str(os.getpid())],
        stdin=subprocess.PIPE,
        env=watchdog_env,
        start_new_session=True,
        close_fds=True,
    )
    return PrivateRuntime(folder, token_path, ray_temp_dir, watchdog, saved_env, saved_flag)
