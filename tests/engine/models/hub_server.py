"""A small model hub on 127.0.0.1 that speaks what huggingface_hub's file download uses.

``HEAD``/``GET /{repo_id}/resolve/{revision}/{path}`` answer as the Hugging Face hub does for an LFS file
(huggingface_hub/file_download.py, ``get_hf_file_metadata`` and ``http_get``): ``X-Repo-Commit`` (the
commit), ``X-Linked-Etag`` (the LFS file's SHA-256; ``ETag`` the same), ``X-Linked-Size``, ``Content-Length``,
``Accept-Ranges: bytes`` and ``206 Partial Content`` for ``Range: bytes=N-``. No Xet headers: the plain
HTTP path. It counts requests and bytes of file data served, can throttle (for a kill mid-file) and can
serve a file with one byte flipped while announcing the true SHA-256.
"""

from __future__ import annotations

import hashlib
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


class HubState:
    def __init__(self) -> None:
        self.files: dict[tuple[str, str, str], bytes] = {}  # (repo, revision, path) -> content
        self.commits: dict[str, str] = {}
        self.flipped: set[str] = set()  # paths served with one byte changed (the announced SHA unchanged)
        self.delay_per_chunk_s = 0.0
        self.drop_after: dict[str, int] = {}  # path -> bytes sent before the connection is cut (once)
        self.stall_after: dict[str, int] = {}  # path -> bytes sent before the answer waits for `release`
        self.release = threading.Event()  # set when the server stops: a stalled answer then ends
        self.chunk = 64 << 10
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Range header)
        self.bytes_served = 0
        self.served: list[int] = []  # bytes of file data sent for each request, in the order of requests
        self.lock = threading.Lock()
        # hostile hubs (issue 50): a CDN the file requests are redirected to, more bytes than announced
        # (plain or gzip), and a drip of one byte at a time
        self.redirect_to: str | None = None  # base URL: HEAD/GET of a file answer 302 to it, as the hub does
        self.authorizations: list[tuple[str, str, str | None]] = []  # (server, method, Authorization)
        self.oversend: dict[str, int] = {}  # path -> extra bytes sent after the file (announced in the GET)
        self.gzip_oversend: dict[str, int] = {}  # path -> the GET body is gzip of the file + this many zeros
        self.drip_s: dict[str, float] = {}  # path -> one byte every this many seconds

    def add(self, repo: str, revision: str, path: str, content: bytes) -> None:
        self.files[(repo, revision, path)] = content
        self.commits.setdefault(repo, hashlib.sha1(repo.encode()).hexdigest())

    def add_folder(self, repo: str, revision: str, folder: Path, paths: list[str]) -> None:
        for path in paths:
            self.add(repo, revision, path, (Path(folder) / path).read_bytes())


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    state: HubState

    def log_message(self, *args) -> None:  # quiet: tests read the counters instead
        pass

    def _lookup(self):
        match = re.match(
            r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$", self.path.split("?")[0]
        )
        if not match:
            return None
        key = (match["repo"], match["rev"], match["path"])
        return key, self.state.files.get(key)

    name = "hub"

    def _answer(self, send_body: bool) -> None:
        state = self.state
        with state.lock:
            state.requests.append((self.command, self.path, self.headers.get("Range")))
            state.authorizations.append((self.name, self.command, self.headers.get("Authorization")))
            state.served.append(0)
            number = len(state.served) - 1
        found = self._lookup()
        if found is not None and found[1] is not None and state.redirect_to and self.name == "hub":
            (repo, _rev, path), content = found
            sha = hashlib.sha256(content).hexdigest()
            self.send_response(302)  # as huggingface.co answers for an LFS file: metadata, then the CDN
            self.send_header("Location", state.redirect_to + self.path)
            self.send_header("X-Repo-Commit", state.commits[repo])
            self.send_header("X-Linked-Etag", f'"{sha}"')
            self.send_header("X-Linked-Size", str(len(content)))
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if found is None or found[1] is None:
            body = b'{"error":"Entry not found"}'
            self.send_response(404)
            self.send_header("X-Error-Code", "EntryNotFound")
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if send_body:
                self.wfile.write(body)
            return
        (repo, _rev, path), content = found
        sha = hashlib.sha256(content).hexdigest()
        if path in state.flipped:
            content = bytes([content[0] ^ 0xFF]) + content[1:]
        start, status = 0, 200
        wanted = self.headers.get("Range")
        if wanted and (match := _RANGE.match(wanted)):
            start, status = int(match[1]), 206
        if start > len(content):
            self.send_response(416)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        part = content[start:]
        if send_body and path in state.oversend:
            part += b"\0" * state.oversend[path]
        encoding = None
        if send_body and path in state.gzip_oversend:
            import gzip

            part = gzip.compress(part + b"\0" * state.gzip_oversend[path], compresslevel=1)
            encoding = "gzip"
        if send_body and path in state.drip_s:
            self._drip(part, state.drip_s[path])
            return
        cut = state.drop_after.pop(path, None) if send_body else None
        stall = state.stall_after.pop(path, None) if send_body else None
        self.send_response(status)
        self.send_header("X-Repo-Commit", state.commits[repo])
        self.send_header("ETag", f'"{sha}"')
        self.send_header("X-Linked-Etag", f'"{sha}"')
        self.send_header("X-Linked-Size", str(len(content)))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(part)))
        if encoding:
            self.send_header("Content-Encoding", encoding)
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{len(content) - 1}/{len(content)}")
        self.end_headers()
        if not send_body:
            return
        for offset in range(0, len(part), state.chunk):
            block = part[offset : offset + state.chunk]
            if cut is not None and offset + len(block) > cut:  # a lost connection: part of it, then gone
                self.wfile.write(block[: max(0, cut - offset)])
                self.wfile.flush()
                with state.lock:
                    state.bytes_served += max(0, cut - offset)
                    state.served[number] += max(0, cut - offset)
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            if stall is not None and offset >= stall:
                state.release.wait()  # a client that is killed meanwhile never gets the rest
                stall = None
            try:
                self.wfile.write(block)
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                return
            with state.lock:
                state.bytes_served += len(block)
                state.served[number] += len(block)
            if state.delay_per_chunk_s:
                time.sleep(state.delay_per_chunk_s)

    def _drip(self, part: bytes, every_s: float) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(part)))
        self.end_headers()
        for offset in range(len(part)):
            if self.state.release.wait(every_s):
                return
            try:
                self.wfile.write(part[offset : offset + 1])
                self.wfile.flush()
            except OSError:
                return

    def do_HEAD(self) -> None:  # noqa: N802 - http.server's naming
        self._answer(send_body=False)

    def do_GET(self) -> None:  # noqa: N802
        self._answer(send_body=True)


class HubServer:
    """``with HubServer() as hub: hub.state.add(...); hub.url``: serves in a thread until the block ends."""

    def __init__(self, state: HubState | None = None, port: int = 0, name: str = "hub") -> None:
        self.state = state or HubState()
        handler = type("Handler", (_Handler,), {"state": self.state, "name": name})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), handler)
        self.httpd.daemon_threads = True
        self.httpd.handle_error = lambda request, address: None  # a client that hangs up is no test failure
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> HubServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.state.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()
