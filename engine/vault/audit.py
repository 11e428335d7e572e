"""The vault's tamper-evident audit trail.

Layout (inside the vault folder):

- ``audit.log``: one line per entry, ``<seq> <base64(nonce + AES-GCM ciphertext)> <hex MAC>``. The entry
  itself (time, event, item id, details such as an export path) is encrypted, so the file holds no PHI in
  plaintext. The MAC is HMAC-SHA256 over (previous entry's MAC, seq, ciphertext): a hash chain, so editing,
  reordering or removing any entry breaks every MAC after it, and nobody without the master key can
  recompute them.
- ``audit.head``: the last entry's seq and MAC, itself MAC'ed (two identical slots, rewritten in place after
  each append). Without it, cutting entries off the end of the log would leave a valid shorter chain; with
  it, verify sees that the log ends before the head.
- ``unlock-failures.log``: failed unlock attempts (time and pid only). They happen without a key, so they
  cannot be MAC'ed when they occur; the next successful unlock moves them into the chain as
  ``unlock_failed`` entries with their original times.

Appends are serialised across processes by a short-lived lock on ``.audit.lock`` (separate from the
vault's write lock, so viewing an item is never blocked by another process's long import).

Crash safety: an append writes the line and fsyncs it, then updates the head (no fsync, see
``_write_head``). After a power cut the head may lag behind the log; entries beyond the head are accepted
when their MACs chain from it, since only a key holder can write such entries. A crash in the middle of a
line leaves an unterminated line, which the next append cuts off.

Entries are written *before* the change they describe is committed (write-ahead), so an interrupted
import may leave an ``import`` entry for an item that never appeared; the reverse (a change without an
entry) cannot happen.
"""

from __future__ import annotations

import base64
import contextlib
import getpass
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from engine.errors import VaultCorrupted
from engine.vault import crypto
from engine.vault.fsio import (
    TMP_AUDIT_PREFIX,
    FileLock,
    fsync_dir,
    fsync_file,
    io_error,
    remove_leftovers,
    write_atomic,
)

LOG_NAME = "audit.log"
HEAD_NAME = "audit.head"
FAILED_NAME = "unlock-failures.log"
LOCK_NAME = ".audit.lock"
#: Entries are small; an upper bound lets the tail be found by reading only the end of the log.
MAX_LINE = 16 * 1024
_HEAD_SLOT = 256
_DETAIL_STR_MAX = 1024

EVENTS = (
    "create",
    "unlock",
    "unlock_failed",
    "lock",
    "import",
    "view",
    "export",
    "delete",
    "passphrase_changed",
    "verify",
    "edit",
    "repair",
    "rekey",
    "copy_out",  # the app wrote a copy of an item outside the vault, asked and confirmed (exporting.py)
    "screenshot",  # a picture of an item shown in the app, marked as patient data
)


@dataclass(frozen=True)
class AuditEntry:
    """One decrypted audit entry.

    Attributes:
        seq: Position in the chain, from 1.
        time: UTC time, ISO 8601.
        event: One of ``create, unlock, unlock_failed, lock, import, view, export, delete,
            passphrase_changed, verify, edit, repair``.
        item_id: The item concerned, if any.
        detail: Event details (for example the export folder and whether it was de-identified).
        pid: Process that wrote the entry.
        user: Operating-system account that wrote the entry.
    """

    seq: int
    time: str
    event: str
    item_id: str | None = None
    detail: dict = field(default_factory=dict)
    pid: int = 0
    user: str = ""


@dataclass
class ChainScan:
    """A quick look at the chain (see :meth:`AuditLog.scan`): every entry's MAC by seq, and the entries
    after a given seq decrypted. Malformed lines are skipped here; :meth:`AuditLog.check` reports them."""

    macs: dict[int, bytes]
    last_seq: int
    after: list[AuditEntry]


@dataclass
class AuditCheck:
    """Result of checking the whole chain (see :meth:`AuditLog.check`)."""

    entries: list[AuditEntry]
    problems: list[str]
    head_seq: int


def _now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no login name in some containers/services
        return ""


def _clip(detail: dict) -> dict:
    out = {}
    for k, v in detail.items():
        if isinstance(v, str) and len(v) > _DETAIL_STR_MAX:
            v = v[:_DETAIL_STR_MAX] + "..."
        out[k] = v
    return out


class AuditLog:
    """Append-only, hash-chained, encrypted audit trail of one vault.

    Args:
        folder: The vault folder.
        vault_id: The vault's id (binds the chain to this vault).
    """

    def __init__(self, folder: Path, vault_id: bytes) -> None:
        self.folder = folder
        self.vault_id = vault_id
        self._lock = FileLock(
            folder / LOCK_NAME,
            "the vault's audit trail is being written by another VolSynth process (pid {pid}); try again",
        )
        self._enc: AESGCM | None = None
        self._mac_key: bytes | None = None
        #: (seq, MAC) of the last entry this object appended; the index records it at each commit.
        self.last_appended: tuple[int, bytes] | None = None
        #: Called with (seq, MAC) after every append, under the audit lock (the vault updates its anchor).
        self.on_append: Callable[[int, bytes], None] | None = None
        #: What appends repaired on the way (a damaged audit.head slot rewritten), for the vault's notices.
        self.repairs: list[str] = []

    def held(self, wait_s: float = 10.0):
        """Hold the audit trail's inter-process lock (a context manager): no other process can append to it
        meanwhile (re-key copies the chain under it)."""
        return self._lock.hold(wait_s=wait_s)

    # -- keys -------------------------------------------------------------------------------------------
    def attach_keys(self, enc_key: bytes, mac_key: bytes) -> None:
        self._enc = AESGCM(enc_key)
        self._mac_key = mac_key

    def detach_keys(self) -> None:
        self._enc = None
        self._mac_key = None

    @property
    def _genesis(self) -> bytes:
        return crypto.mac(self._require_mac(), b"audit-genesis", self.vault_id)

    def _require_mac(self) -> bytes:
        if self._mac_key is None:
            raise RuntimeError("audit keys not attached")  # programming error, not a user error
        return self._mac_key

    # -- encoding ---------------------------------------------------------------------------------------
    def _aad(self, seq: int) -> bytes:
        return b"volsynth-audit v1\x00" + self.vault_id + seq.to_bytes(8, "big")

    def _entry_mac(self, prev_mac: bytes, seq: int, payload: bytes) -> bytes:
        return crypto.mac(self._require_mac(), b"audit-entry", prev_mac, seq.to_bytes(8, "big"), payload)

    def _head_tag(self, seq: int, last_mac: bytes) -> str:
        return crypto.mac(self._require_mac(), b"audit-head", seq.to_bytes(8, "big"), last_mac).hex()

    def _encode(self, seq: int, prev_mac: bytes, entry: dict) -> tuple[bytes, bytes]:
        assert self._enc is not None
        nonce = os.urandom(12)
        body = json.dumps(entry, sort_keys=True, separators=(",", ":")).encode()
        payload = nonce + self._enc.encrypt(nonce, body, self._aad(seq))
        entry_mac = self._entry_mac(prev_mac, seq, payload)
        line = f"{seq} {base64.b64encode(payload).decode()} {entry_mac.hex()}\n".encode()
        return line, entry_mac

    @staticmethod
    def _parse_line(line: bytes) -> tuple[int, bytes, bytes]:
        parts = line.decode("ascii").split(" ")
        if len(parts) != 3:
            raise ValueError("wrong number of fields")
        seq = int(parts[0])
        payload = base64.b64decode(parts[1], validate=True)
        entry_mac = bytes.fromhex(parts[2])
        if seq < 1 or len(entry_mac) != 32 or len(payload) < 12 + 16:
            raise ValueError("bad field")
        return seq, payload, entry_mac

    def _decrypt(self, seq: int, payload: bytes) -> AuditEntry:
        assert self._enc is not None
        body = json.loads(self._enc.decrypt(payload[:12], payload[12:], self._aad(seq)))
        return AuditEntry(
            seq=seq,
            time=body["time"],
            event=body["event"],
            item_id=body.get("item"),
            detail=body.get("detail") or {},
            pid=int(body.get("pid", 0)),
            user=body.get("user", ""),
        )

    # -- head -------------------------------------------------------------------------------------------
    # The head is two identical fixed-size MAC'ed slots written in place, without fsync. Why no fsync: an
    # fsync costs ~5 ms here and every view is audited; the log line itself is fsync'ed first, so after a
    # power cut the head can only lag behind the log, and entries beyond the head are accepted when they
    # chain from it (only a key holder can make such entries). Why two slots: a write torn by a crash
    # damages at most one, the other still holds a valid head, and the next append rewrites both.
    def _encode_head(self, seq: int, last_mac: bytes) -> bytes:
        data = {"seq": seq, "mac": last_mac.hex(), "tag": self._head_tag(seq, last_mac)}
        text = json.dumps(data).encode()
        assert len(text) < _HEAD_SLOT
        return text.ljust(_HEAD_SLOT - 1) + b"\n"

    def _read_head(self) -> tuple[tuple[int, bytes] | None, bool]:
        """Returns ((seq, mac) or None if there is no head file, whether a slot is damaged)."""
        try:
            raw = (self.folder / HEAD_NAME).read_bytes()
        except FileNotFoundError:
            return None, False
        valid = []
        for start in (0, _HEAD_SLOT):
            try:
                data = json.loads(raw[start : start + _HEAD_SLOT])
                seq, last_mac = int(data["seq"]), bytes.fromhex(data["mac"])
                if data["tag"] == self._head_tag(seq, last_mac):
                    valid.append((seq, last_mac))
            except (ValueError, KeyError, TypeError):
                pass
        if not valid:
            raise VaultCorrupted(
                "the audit trail's head (audit.head) is unreadable: it was edited or damaged"
            )
        damaged = len(valid) < 2 or valid[0] != valid[1] or len(raw) != 2 * _HEAD_SLOT
        return max(valid), damaged

    def _write_head(self, seq: int, last_mac: bytes, *, durable: bool = False) -> None:
        record = self._encode_head(seq, last_mac)
        try:
            fd = os.open(self.folder / HEAD_NAME, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                for start in (0, _HEAD_SLOT):
                    os.lseek(fd, start, os.SEEK_SET)  # (os.pwrite does not exist on Windows)
                    os.write(fd, record)
                if durable:
                    fsync_file(fd, "the audit trail's head")
            finally:
                os.close(fd)
        except OSError as exc:
            raise io_error(exc, "the audit trail's head") from exc

    # -- append -----------------------------------------------------------------------------------------
    def start(self) -> None:
        """Create an empty chain (new vault). Requires keys."""
        with self._lock.hold(wait_s=10.0):
            write_atomic(self.folder / LOG_NAME, b"", prefix=TMP_AUDIT_PREFIX)
            self._write_head(0, self._genesis, durable=True)

    def append(self, event: str, item_id: str | None = None, detail: dict | None = None) -> AuditEntry:
        """Append one entry durably. Raises :class:`VaultCorrupted` if the chain's end was tampered with."""
        return self.append_many([(event, item_id, detail or {}, None)])[-1]

    def append_many(self, records: Sequence[tuple[str, str | None, dict, str | None]]) -> list[AuditEntry]:
        """Append several entries (event, item id, detail, time or None for now) in one locked step."""
        with self._lock.hold(wait_s=10.0):
            return self._append_locked(records)

    def record_unlock(self) -> list[AuditEntry]:
        """Log a successful unlock, first moving pending failed attempts into the chain."""
        with self._lock.hold(wait_s=10.0):
            grabbed = self._grab_failed_unlocks()
            records: list[tuple[str, str | None, dict, str | None]] = []
            for path in grabbed:
                for raw in path.read_text("utf-8", "replace").splitlines():
                    try:
                        rec = json.loads(raw)
                        records.append(
                            ("unlock_failed", None, {"pid": int(rec.get("pid", 0))}, str(rec["time"]))
                        )
                    except (ValueError, KeyError, TypeError):
                        records.append(
                            ("unlock_failed", None, {"note": "unreadable failed-unlock record"}, None)
                        )
            records.append(("unlock", None, {}, None))
            # If this raises (a damaged chain), the grabbed files stay and are folded in next time.
            entries = self._append_locked(records)
            for path in grabbed:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            if grabbed:
                fsync_dir(self.folder)
            return entries

    def _grab_failed_unlocks(self) -> list[Path]:
        # Renaming first means attempts made while we fold go to a fresh file instead of being lost.
        with contextlib.suppress(FileNotFoundError):
            os.replace(
                self.folder / FAILED_NAME, self.folder / f"{FAILED_NAME}.{os.getpid()}.{time.time_ns()}"
            )
        return sorted(self.folder.glob(f"{FAILED_NAME}.*"))

    def _append_locked(self, records: Sequence[tuple[str, str | None, dict, str | None]]) -> list[AuditEntry]:
        if event_bad := [r[0] for r in records if r[0] not in EVENTS]:
            raise ValueError(f"unknown audit events {event_bad}")  # programming error
        remove_leftovers(self.folder, TMP_AUDIT_PREFIX)
        seq, prev_mac = self._recover_tail()
        out = []
        lines = []
        for event, item_id, detail, when in records:
            seq += 1
            body: dict[str, Any] = {
                "time": when or _now_iso(),
                "event": event,
                "item": item_id,
                "detail": _clip(detail),
                "pid": os.getpid(),
                "user": _user(),
            }
            line, prev_mac = self._encode(seq, prev_mac, body)
            lines.append(line)
            out.append(
                AuditEntry(seq, body["time"], event, item_id, body["detail"], body["pid"], body["user"])
            )
        fd = os.open(self.folder / LOG_NAME, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            data = memoryview(b"".join(lines))
            while data:  # a regular-file write is normally whole, but a short write must not be lost
                try:
                    data = data[os.write(fd, data) :]
                except OSError as exc:
                    raise io_error(exc, "the audit trail") from exc
            fsync_file(fd, "the audit trail")
        finally:
            os.close(fd)
        self._write_head(seq, prev_mac)
        self.last_appended = (seq, prev_mac)
        if self.on_append is not None:
            self.on_append(seq, prev_mac)
        return out

    def _recover_tail(self) -> tuple[int, bytes]:
        """Return (seq, mac) of the last entry, after checking the log's end against the head and repairing
        what a crash can leave behind (an unterminated last line)."""
        head, damaged = self._read_head()
        if damaged and head is not None:  # the append below rewrites both slots from the intact one
            self.repairs.append(
                "one of the two slots of the audit trail's head (audit.head) was damaged; it was rewritten "
                "from the intact one (if nothing here crashed, something else wrote into the vault folder)"
            )
        log = self.folder / LOG_NAME
        if head is None:
            raise VaultCorrupted("the audit trail's head (audit.head) is missing")
        head_seq, head_mac = head
        try:
            size = log.stat().st_size
        except FileNotFoundError as exc:
            raise VaultCorrupted("the audit trail (audit.log) is missing") from exc
        with open(log, "rb+") as fh:
            start = max(0, size - 4 * MAX_LINE)
            fh.seek(start)
            tail = fh.read()
            complete_end = tail.rfind(b"\n") + 1  # 0 if there is no complete line in the window
            if complete_end < len(tail):
                # An unterminated last line is an append cut short by a crash: the entry never counted
                # (an operation proceeds only after its line is durable). Cut it off.
                fh.truncate(start + complete_end)
                fh.flush()
                fsync_file(fh.fileno(), "the audit trail")
                self.repairs.append(
                    f"the audit trail (audit.log) ended with {len(tail) - complete_end} byte(s) of an incomplete "
                    "entry (an interrupted write, or bytes added to the file); they were cut off"
                )
                tail = tail[:complete_end]
        lines = tail.splitlines()
        if start > 0:
            lines = lines[1:]  # the first line of the window may be partial
        if not lines:
            if head_seq == 0:
                return 0, self._genesis
            raise VaultCorrupted(
                f"the audit trail was truncated: it should end at entry {head_seq} but holds none"
            )
        try:
            parsed = [self._parse_line(line) for line in lines]
        except ValueError as exc:
            raise VaultCorrupted("the end of the audit trail is malformed: it was edited") from exc
        last_seq, _, last_mac = parsed[-1]
        if last_seq < head_seq:
            raise VaultCorrupted(
                f"the audit trail was truncated: it ends at entry {last_seq} but its head says {head_seq}"
            )
        mismatch = VaultCorrupted(
            "the end of the audit trail does not match its head: entries were edited, added or removed; "
            "run `volsynth vault verify` for details"
        )
        if last_seq == head_seq:
            if last_mac != head_mac:
                raise mismatch
            return head_seq, head_mac
        # Entries beyond the head (the head lagged at a power cut): they must chain from the head.
        seqs = [entry[0] for entry in parsed]
        if head_seq + 1 not in seqs:
            if start == 0:
                raise mismatch
            parsed = [self._parse_line(line) for line in log.read_bytes().splitlines()]
            seqs = [entry[0] for entry in parsed]
            if head_seq + 1 not in seqs:
                raise mismatch
        first = seqs.index(head_seq + 1)
        if first > 0 and parsed[first - 1][2] != head_mac:
            raise mismatch
        prev = head_mac
        for expected, (seq, payload, entry_mac) in enumerate(parsed[first:], start=head_seq + 1):
            if seq != expected or self._entry_mac(prev, seq, payload) != entry_mac:
                raise mismatch
            prev = entry_mac
        return last_seq, last_mac

    # -- failed unlocks ---------------------------------------------------------------------------------
    @staticmethod
    def record_failed_unlock(folder: Path) -> None:
        """Note a failed unlock (no key available, so no MAC yet). Holds no PHI: time and pid only."""
        line = json.dumps({"time": _now_iso(), "pid": os.getpid(), "user": _user()}) + "\n"
        with contextlib.suppress(OSError):  # never turn a wrong passphrase into a different error
            fd = os.open(folder / FAILED_NAME, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, line.encode())
                os.fsync(fd)
            finally:
                os.close(fd)

    def head_seq(self) -> int | None:
        """The seq the head names (None if the head is missing or unreadable)."""
        try:
            head, _ = self._read_head()
        except VaultCorrupted:
            return None
        return head[0] if head is not None else None

    # -- quick scan -------------------------------------------------------------------------------------
    def scan(self, after_seq: int | None = None) -> ChainScan:
        """Every entry's MAC by seq, and the entries after ``after_seq`` decrypted (those that decrypt: an
        entry that decrypts was written by a key holder, whatever happened around it). Raises
        :class:`VaultCorrupted` only if the log is missing."""
        try:
            raw = (self.folder / LOG_NAME).read_bytes()
        except FileNotFoundError as exc:
            raise VaultCorrupted("the audit trail (audit.log) is missing") from exc
        macs: dict[int, bytes] = {0: self._genesis}
        after: list[AuditEntry] = []
        last = 0
        for line in raw.split(b"\n"):
            if not line:
                continue
            try:
                seq, payload, entry_mac = self._parse_line(line)
            except (ValueError, UnicodeDecodeError):
                continue
            macs[seq] = entry_mac
            last = max(last, seq)
            if after_seq is not None and seq > after_seq:
                with contextlib.suppress(InvalidTag, ValueError, KeyError):
                    after.append(self._decrypt(seq, payload))
        return ChainScan(macs=macs, last_seq=last, after=after)

    # -- full check -------------------------------------------------------------------------------------
    def check(self) -> AuditCheck:
        """Verify the whole chain; never raises for tampering, returns the problems found instead."""
        problems: list[str] = []
        try:
            head, damaged = self._read_head()
            if head is None:
                problems.append("the audit trail's head (audit.head) is missing")
            elif damaged:
                problems.append("the audit trail's head (audit.head) was edited or damaged")
        except VaultCorrupted as exc:
            problems.append(str(exc))
            head = None
        try:
            raw = (self.folder / LOG_NAME).read_bytes()
        except FileNotFoundError:
            return AuditCheck(
                [], [*problems, "the audit trail (audit.log) is missing"], head[0] if head else 0
            )
        lines = raw.split(b"\n")
        trailing = lines.pop()  # b"" when the file ends with a newline
        entries: list[AuditEntry] = []
        prev_mac = self._genesis
        expected = 1
        macs: dict[int, bytes] = {0: prev_mac}
        for lineno, line in enumerate(lines, start=1):
            try:
                seq, payload, entry_mac = self._parse_line(line)
            except (ValueError, UnicodeDecodeError):
                problems.append(f"audit line {lineno} is malformed (edited or damaged)")
                expected += 1
                prev_mac = b""
                continue
            if seq > expected:
                problems.append(
                    f"audit entries {expected}..{seq - 1} were removed"
                    if seq - 1 > expected
                    else f"audit entry {expected} was removed"
                )
            elif seq < expected:
                problems.append(f"audit entry {seq} appears out of order (entries were moved or duplicated)")
            mac_ok = self._entry_mac(prev_mac, seq, payload) == entry_mac
            if not mac_ok and seq == expected and prev_mac:
                # (When the chain already broke just before this entry, that break was reported.)
                problems.append(f"audit entry {seq} was edited")
            try:
                entries.append(self._decrypt(seq, payload))
            except (InvalidTag, ValueError, KeyError):
                if mac_ok:  # pragma: no cover - a valid MAC over an undecryptable entry means a bug
                    problems.append(f"audit entry {seq} cannot be decrypted")
            prev_mac = entry_mac
            macs[seq] = entry_mac
            expected = seq + 1
        if trailing:
            problems.append("the audit trail ends with an incomplete entry (interrupted write or damage)")
        head_seq = 0
        if head is not None:
            head_seq, head_mac = head
            last = expected - 1
            if last < head_seq:
                problems.append(
                    f"the audit trail was truncated: it ends at entry {last} but its head says {head_seq}"
                )
            elif macs.get(head_seq) != head_mac:
                problems.append("the audit trail's head does not match the chain (entries were replaced)")
        return AuditCheck(entries, problems, head_seq)
