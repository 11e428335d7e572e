"""The local Ray runtime a cohort starts: private files, loopback listeners, nothing left after the driver
is killed (issue 24, point 3). Before: ~/.ray/auth_token 0644, session folders 0777, Ray's processes on all
interfaces (one agent on the external address), agents listening for a minute after the driver died."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

psutil = pytest.importorskip("psutil")

LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}


def _runtime_processes(token: str) -> list:
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("RAY_AUTH_TOKEN_PATH") == token:
                found.append(proc)
        except (psutil.Error, OSError):
            pass
    return found


@pytest.mark.slow
def test_a_killed_driver_leaves_no_ray_process_and_its_files_were_private(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "HOME": str(home), "PYTHONPATH": os.pathsep.join(sys.path)}
    for key in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH"):
        env.pop(key, None)
    driver = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("child_ray_driver.py"))],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        line = driver.stdout.readline()
        assert line, "the driver did not start Ray"
        info = json.loads(line)
        token = Path(info["token"])
        folder = token.parent

        # files: the token 0600 in a 0700 folder that holds Ray's temp folder; ~/.ray untouched
        assert stat.S_IMODE(token.stat().st_mode) == 0o600
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        assert list(folder.glob("r/session_*")), "Ray's sessions are not inside the private folder"
        assert not (home / ".ray").exists()

        # listeners: every socket any of the runtime's processes listens on is on loopback
        procs = _runtime_processes(str(token))
        names = {p.name() for p in procs}
        assert info["worker"] in {p.pid for p in procs} and {"raylet", "gcs_server"} <= names, names
        listening = [
            (p.name(), c.laddr)
            for p in procs
            for c in p.net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN
        ]
        assert listening and all(addr.ip in LOOPBACK for _name, addr in listening), listening

        # the driver killed: every runtime process ends, the private folder goes
        watchdogs = [p for p in psutil.process_iter(["cmdline"]) if str(folder) in (p.info["cmdline"] or [])]
        assert len(watchdogs) == 1
        driver.send_signal(signal.SIGKILL)
        driver.wait(30)
        _gone, alive = psutil.wait_procs(procs, timeout=30)
        assert not alive, [(p.pid, p.name()) for p in alive]
        assert not _runtime_processes(str(token))
        _gone, alive = psutil.wait_procs(watchdogs, timeout=30)  # it deletes the folder, then exits
        assert not alive and not folder.exists()
    finally:
        if driver.poll() is None:
            driver.kill()
