"""The vault header (``vault.json``: Argon2id parameters and the wrapped master key) and the unlocked keys."""

from __future__ import annotations

import base64
import hashlib
import json
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from engine.errors import InvalidRequest, VaultCorrupted, VaultError
from engine.vault import crypto
from engine.vault.crypto import KdfParams
from engine.vault.layout import FORMAT, HEADER_NAME, VERSION

#: A real header is under 1 KiB; anything far larger was not written by VolSynth and is not read whole.
MAX_HEADER_BYTES = 64 * 1024


def now_iso() -> str:
    """Now, as the ISO 8601 UTC time stamps items and headers carry."""
    # Microseconds: items are listed in creation order, and imports are serialised by the write lock.
    return datetime.now(UTC).isoformat(timespec="microseconds")


def b64(data: bytes) -> str:
    """Base64 text, as the header stores bytes."""
    return base64.b64encode(data).decode("ascii")


def sha256(data: bytes) -> str:
    """Hex SHA-256 (the index records the header's)."""
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Header:
    """The parsed ``vault.json``: its bytes are exactly :meth:`to_bytes` (``read`` checks that)."""

    vault_id: bytes
    created: str
    kdf: KdfParams
    salt: bytes
    wrap_nonce: bytes
    wrapped_key: bytes

    def _bound(self) -> dict:
        return {
            "format": FORMAT,
            "version": VERSION,
            "vault_id": self.vault_id.hex(),
            "created": self.created,
            "kdf": {"alg": "argon2id", "salt": b64(self.salt), **self.kdf.to_dict()},
            "cipher": "cobblestone-256",
        }

    @classmethod
    def wrapping(cls, vault_id: bytes, created: str, kdf: KdfParams, pw: bytes, master: bytes) -> Header:
        """A header that wraps ``master`` under the passphrase ``pw`` with a new random salt."""
        salt = os.urandom(crypto.SALT_BYTES)
        draft = cls(vault_id, created, kdf, salt, b"", b"")
        nonce, wrapped = crypto.wrap_key(crypto.derive_kek(pw, salt, kdf), master, draft.aad())
        return cls(vault_id, created, kdf, salt, nonce, wrapped)

    def unwrap(self, pw: bytes) -> bytes:
        """The master key this header wraps under the passphrase ``pw`` (Argon2id, then AES-GCM).

        Raises:
            DecryptionFailed: ``pw`` is not this vault's passphrase (or the header was edited).
        """
        kek = crypto.derive_kek(pw, self.salt, self.kdf)
        return crypto.unwrap_key(kek, self.wrap_nonce, self.wrapped_key, self.aad())

    def aad(self) -> bytes:
        """Everything but the wrapped key: editing any of it makes the unwrap fail."""
        return json.dumps(self._bound(), sort_keys=True, separators=(",", ":")).encode()

    def to_bytes(self) -> bytes:
        body = {
            **self._bound(),
            "wrap": {"alg": "aes-256-gcm", "nonce": b64(self.wrap_nonce), "key": b64(self.wrapped_key)},
        }
        text = (json.dumps(body, sort_keys=True, indent=1) + "\n").encode()
        return text + b"sha256 " + hashlib.sha256(text).hexdigest().encode() + b"\n"

    @classmethod
    def read(cls, folder: Path) -> Header:
        path = folder / HEADER_NAME
        try:
            with path.open("rb") as f:
                data = f.read(MAX_HEADER_BYTES + 1)
        except FileNotFoundError as exc:
            raise VaultError(
                f"there is no vault at {folder}; create one first (volsynth vault init)"
            ) from exc
        except OSError as exc:
            raise VaultError(f"cannot read the vault header {path}: {exc.strerror}") from exc
        bad = VaultCorrupted(
            f"the vault header ({path}) is corrupted or was edited; restore the vault folder from a backup"
        )
        if len(data) > MAX_HEADER_BYTES:
            raise bad
        cut = data.rfind(b"sha256 ")
        if cut <= 0 or data[cut:] != b"sha256 " + hashlib.sha256(data[:cut]).hexdigest().encode() + b"\n":
            raise bad
        try:
            body = json.loads(data[:cut])
            if body["format"] != FORMAT:
                raise bad
            if body["version"] != VERSION:
                raise VaultError(
                    f"the vault at {folder} has format version {body['version']}; this VolSynth reads "
                    f"version {VERSION} (update VolSynth)"
                )
            kdf = body["kdf"]
            if kdf["alg"] != "argon2id" or body["cipher"] != "cobblestone-256":
                raise bad
            try:
                # Bounded before anything is derived: unlock must not run for minutes on an edited header.
                params = KdfParams.from_dict(kdf)
            except InvalidRequest as exc:
                raise VaultCorrupted(
                    f"the vault header ({path}) asks for key derivation VolSynth does not run ({exc}); it "
                    "was edited: restore the vault folder from a backup"
                ) from exc
            header = cls(
                vault_id=bytes.fromhex(body["vault_id"]),
                created=str(body["created"]),
                kdf=params,
                salt=base64.b64decode(kdf["salt"], validate=True),
                wrap_nonce=base64.b64decode(body["wrap"]["nonce"], validate=True),
                wrapped_key=base64.b64decode(body["wrap"]["key"], validate=True),
            )
            if not (
                8 <= len(header.salt) <= 64 and len(header.wrap_nonce) == 12 and len(header.wrapped_key) <= 64
            ):
                raise bad
        except (ValueError, KeyError, TypeError, RecursionError, InvalidRequest) as exc:
            raise bad from exc
        if header.to_bytes() != data:  # also rejects fields we do not know
            raise bad
        return header


class Keys:
    """The unlocked key material. ``wipe()`` overwrites the master key (derived keys are short-lived
    ``bytes`` that Python cannot reliably zero; they are dropped with this object)."""

    def __init__(self, master: bytes, vault_id: bytes) -> None:
        self.master = bytearray(master)
        self.vault_id = vault_id
        self.index = crypto.subkey(self.master, vault_id, "index")
        self.audit_enc = crypto.subkey(self.master, vault_id, "audit-enc")
        self.audit_mac = crypto.subkey(self.master, vault_id, "audit-mac")
        self.record = crypto.subkey(self.master, vault_id, "record")

    def item(self, item_id: str) -> bytes:
        return crypto.subkey(self.master, self.vault_id, "item", item_id)

    def wipe(self) -> None:
        for n in range(len(self.master)):
            self.master[n] = 0
        self.index = self.audit_enc = self.audit_mac = self.record = b""
