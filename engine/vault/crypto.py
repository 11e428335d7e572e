"""Key derivation, key wrapping and streaming authenticated encryption for the vault.

The key hierarchy, top to bottom:

1. passphrase --Argon2id (parameters and salt stored in the vault header)--> key-encryption key (KEK)
2. KEK --AES-256-GCM wrap--> a random 256-bit master key. Changing the passphrase re-wraps only this.
3. master key --HKDF-SHA256 (salt = vault id, info = purpose [+ item id])--> one key per purpose: the
   index, the audit trail's encryption and MAC, and one key per item.

Payloads (volumes, DICOM files, the index) are encrypted with ``cryptography.cobblestone`` Cobblestone-256:
the C2SP chunked-encryption scheme (HKDF-SHA-512 + AES-256-GCM in 16 KiB chunks). It commits to the key,
authenticates every chunk, detects reordering, and detects truncation at ``finalize()``. We use the
256-bit variant because "AES-256 at rest" is what hospital security reviews ask for; the 128-bit variant
would be just as sound. Every message also binds a *context* (vault id, item id, part name) so that a file
moved to another item, part or vault fails authentication instead of decrypting as the wrong data.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import unicodedata
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass

from cryptography.cobblestone import Cobblestone256Decryptor, Cobblestone256Encryptor
from cryptography.exceptions import AlreadyFinalized, InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.argon2 import Argon2id
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from engine.errors import InvalidRequest

#: Every encrypted file starts with this, so a stray or foreign file is told apart from a damaged one.
MAGIC = b"VSENC1\n\x00"
KEY_BYTES = 32
SALT_BYTES = 16
#: Read/write granularity for streams. Cobblestone buffers into 16 KiB chunks internally; 1 MiB calls
#: keep Python overhead negligible while bounding memory.
IO_CHUNK = 1 << 20
MIN_PASSPHRASE_CHARS = 8

# RFC 9106 section 4, second recommended option ("if much less memory is available"): Argon2id with
# t=3 passes, p=4 lanes and 64 MiB of memory. It is the floor for every vault made without an override.
RFC9106_MEMORY_KIB = 64 * 1024
RFC9106_ITERATIONS = 3
RFC9106_LANES = 4

# Bounds on what a vault header may ask of unlock. The header is read before the passphrase is checked
# and the folder may have been edited, so every parameter is bounded before Argon2id runs: memory at 4 GiB,
# passes at 64, and the work (memory x passes) at 4 GiB-passes, which covers RFC 9106's first option
# (2 GiB, t=1) and its second at 20x the passes, and is about 10 s on a 2-core laptop CPU. A header above
# these is refused as edited instead of running for minutes (an iteration count of 10^9 would never end).
MAX_MEMORY_KIB = 4 * 1024 * 1024
MAX_ITERATIONS = 64
MAX_WORK_KIB_PASSES = 4 * 1024 * 1024


class DecryptionFailed(Exception):
    """Internal: authentication failed. Callers turn it into :class:`engine.errors.VaultCorrupted`
    with the name of what was being read."""


@dataclass(frozen=True)
class KdfParams:
    """Argon2id cost parameters.

    The defaults are RFC 9106's second recommended option (64 MiB, t=3, p=4). Smaller values exist only
    so that tests can create vaults quickly; pass them explicitly to :meth:`Vault.create`.

    Attributes:
        memory_kib: Memory cost in KiB.
        iterations: Number of passes (t).
        lanes: Degree of parallelism (p).
    """

    memory_kib: int = RFC9106_MEMORY_KIB
    iterations: int = RFC9106_ITERATIONS
    lanes: int = RFC9106_LANES

    def __post_init__(self) -> None:
        if not 1 <= self.lanes <= 255:
            raise InvalidRequest(f"Argon2 lanes must be between 1 and 255, got {self.lanes}")
        if self.iterations < 1:
            raise InvalidRequest(f"Argon2 iterations must be at least 1, got {self.iterations}")
        if self.memory_kib < 8 * self.lanes:
            raise InvalidRequest(
                f"Argon2 memory must be at least 8 KiB per lane ({8 * self.lanes} KiB), got {self.memory_kib}"
            )
        if self.iterations > MAX_ITERATIONS:
            raise InvalidRequest(
                f"Argon2 iterations above {MAX_ITERATIONS} are not supported, got {self.iterations}"
            )
        if self.memory_kib > MAX_MEMORY_KIB:
            raise InvalidRequest(f"Argon2 memory above 4 GiB is not supported, got {self.memory_kib} KiB")
        if self.memory_kib * self.iterations > MAX_WORK_KIB_PASSES:
            raise InvalidRequest(
                f"Argon2 memory x iterations above 4 GiB-passes is not supported, got "
                f"{self.memory_kib // 1024} MiB x {self.iterations}"
            )

    @property
    def meets_rfc9106(self) -> bool:
        """True when every parameter is at or above RFC 9106's 64 MiB / t=3 / p=4."""
        return (
            self.memory_kib >= RFC9106_MEMORY_KIB
            and self.iterations >= RFC9106_ITERATIONS
            and self.lanes >= RFC9106_LANES
        )

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> KdfParams:
        """Parameters read from a header; only plain JSON integers pass (not ``true``, ``3.0`` or text)."""
        values = {name: data[name] for name in ("memory_kib", "iterations", "lanes")}
        for name, value in values.items():
            if type(value) is not int:
                raise InvalidRequest(f"Argon2 {name} must be an integer, got {value!r:.40}")
        return cls(**values)


def encode_passphrase(passphrase: str | bytes, *, new: bool = False) -> bytes:
    """UTF-8 bytes of a passphrase, NFC-normalised.

    Normalisation makes "é" typed as one code point or as e + combining accent the same passphrase, which
    matters when the same vault is unlocked from different keyboards or operating systems.

    Args:
        passphrase: As typed.
        new: Apply the length rule for a passphrase being set (not one being checked).
    """
    if isinstance(passphrase, bytes):
        try:
            passphrase = passphrase.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidRequest("the passphrase is not valid UTF-8 text") from exc
    text = unicodedata.normalize("NFC", passphrase)
    if not text:
        raise InvalidRequest("the passphrase is empty")
    if new and len(text) < MIN_PASSPHRASE_CHARS:
        raise InvalidRequest(
            f"the passphrase is too short: use at least {MIN_PASSPHRASE_CHARS} characters "
            "(a few unrelated words are easy to remember and hard to guess)"
        )
    return text.encode("utf-8")


def derive_kek(passphrase: bytes, salt: bytes, params: KdfParams) -> bytes:
    """Argon2id(passphrase, salt) -> 32-byte key-encryption key."""
    kdf = Argon2id(
        salt=salt,
        length=KEY_BYTES,
        iterations=params.iterations,
        lanes=params.lanes,
        memory_cost=params.memory_kib,
    )
    return kdf.derive(passphrase)


def wrap_key(kek: bytes, key: bytes, aad: bytes) -> tuple[bytes, bytes]:
    """Encrypt ``key`` under ``kek``; ``aad`` binds the header fields it must not be separated from.

    Returns:
        (nonce, ciphertext). A fresh random nonce is safe: each KEK wraps exactly one key, once.
    """
    nonce = os.urandom(12)
    return nonce, AESGCM(kek).encrypt(nonce, key, aad)


def unwrap_key(kek: bytes, nonce: bytes, wrapped: bytes, aad: bytes) -> bytes:
    """Inverse of :func:`wrap_key`. Raises :class:`DecryptionFailed` on a wrong KEK or edited header."""
    try:
        return AESGCM(kek).decrypt(nonce, wrapped, aad)
    except InvalidTag as exc:
        raise DecryptionFailed("key unwrap failed") from exc


def subkey(master: bytes | bytearray, vault_id: bytes, purpose: str, item_id: str = "") -> bytes:
    """Derive an independent 32-byte key for one purpose (and one item) from the master key."""
    info = b"volsynth-vault v1|" + purpose.encode("ascii") + b"|" + item_id.encode("ascii")
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=vault_id, info=info).derive(bytes(master))


def context(vault_id: bytes, *parts: str) -> bytes:
    """Cobblestone context: binds a ciphertext to its vault and to its role (e.g. item id + part name)."""
    return b"volsynth-vault v1\x00" + vault_id + b"\x00" + "\x00".join(parts).encode("utf-8")


def mac(key: bytes, *fields: bytes) -> bytes:
    """HMAC-SHA256 over length-prefixed fields (length prefixes make the encoding unambiguous)."""
    h = hmac.new(key, digestmod=hashlib.sha256)
    for field in fields:
        h.update(len(field).to_bytes(8, "big"))
        h.update(field)
    return h.digest()


class StreamEncryptor:
    """Encrypts one message as MAGIC + Cobblestone-256 ciphertext, in pieces.

    Call :meth:`update` with plaintext pieces, then :meth:`finalize` exactly once; write every returned
    piece in order.
    """

    def __init__(self, key: bytes, ctx: bytes) -> None:
        self._enc = Cobblestone256Encryptor(key, ctx)
        self._started = False

    def update(self, data: bytes | bytearray | memoryview) -> bytes:
        out = self._enc.update(data)
        if not self._started:
            self._started = True
            return MAGIC + out
        return out

    def finalize(self) -> bytes:
        out = self._enc.finalize()
        if not self._started:
            self._started = True
            return MAGIC + out
        return out


class StreamDecryptor:
    """Decrypts MAGIC + Cobblestone-256 ciphertext fed in arbitrary pieces.

    Every piece of plaintext returned by :meth:`update` has been authenticated, but the message as a whole
    is only known to be complete (not truncated) once :meth:`finalize` returns. Callers must not act on
    the plaintext (return it, rename a file into place) before then.
    """

    def __init__(self, key: bytes, ctx: bytes) -> None:
        self._dec = Cobblestone256Decryptor(key, ctx)
        self._magic = bytearray()

    #: Spare room :meth:`update_into` needs in ``buf`` beyond ``len(data)`` (per cryptography's docs).
    INTO_SLACK = 16400

    def _strip_magic(self, data: bytes | bytearray | memoryview) -> memoryview:
        data = memoryview(data)
        if len(self._magic) < len(MAGIC):
            need = len(MAGIC) - len(self._magic)
            self._magic += data[:need]
            data = data[need:]
            if not MAGIC.startswith(bytes(self._magic)):
                raise DecryptionFailed("not a VolSynth vault file (bad magic)")
        return data

    def update(self, data: bytes | bytearray | memoryview) -> bytes:
        data = self._strip_magic(data)
        if not data:
            return b""
        try:
            return self._dec.update(data)
        except (InvalidTag, AlreadyFinalized) as exc:
            raise DecryptionFailed("authentication failed") from exc

    def update_into(self, data: bytes | bytearray | memoryview, buf) -> int:
        """Like :meth:`update` but writes into ``buf`` (at least ``len(data) + INTO_SLACK`` bytes) and
        returns the count. After a :class:`DecryptionFailed`, ``buf`` may hold unauthenticated bytes and
        must be discarded."""
        data = self._strip_magic(data)
        if not data:
            return 0
        try:
            return self._dec.update_into(data, buf)
        except (InvalidTag, AlreadyFinalized) as exc:
            raise DecryptionFailed("authentication failed") from exc

    def finalize(self) -> bytes:
        if bytes(self._magic) != MAGIC:
            raise DecryptionFailed("file is truncated inside its magic number")
        try:
            return self._dec.finalize()
        except (InvalidTag, AlreadyFinalized) as exc:
            raise DecryptionFailed("authentication failed (truncated or modified)") from exc


def encrypt_bytes(key: bytes, ctx: bytes, plaintext: bytes) -> bytes:
    """One-shot encryption of a small message (the index)."""
    enc = StreamEncryptor(key, ctx)
    return enc.update(plaintext) + enc.finalize()


def decrypt_bytes(key: bytes, ctx: bytes, blob: bytes) -> bytes:
    """One-shot decryption of a small message; raises :class:`DecryptionFailed`."""
    dec = StreamDecryptor(key, ctx)
    out = dec.update(blob)
    return out + dec.finalize()


def decrypt_chunks(key: bytes, ctx: bytes, chunks: Iterable[bytes]) -> Iterator[bytes]:
    """Decrypt a stream of ciphertext pieces, yielding authenticated plaintext pieces.

    The generator raises :class:`DecryptionFailed` at the point of damage, and at the end if the stream
    is truncated, so a consumer must treat its output as provisional until the generator is exhausted.
    """
    dec = StreamDecryptor(key, ctx)
    for chunk in chunks:
        out = dec.update(chunk)
        if out:
            yield out
    tail = dec.finalize()
    if tail:
        yield tail
