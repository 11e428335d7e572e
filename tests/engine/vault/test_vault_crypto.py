"""Key derivation, key wrapping and the chunked stream format (below the Vault API)."""

from __future__ import annotations

import os
import random
import unicodedata

import pytest

from engine.errors import InvalidRequest
from engine.vault import KdfParams, crypto

CHUNK_CT = 16384 + 16  # Cobblestone: 16 KiB of plaintext + a 16-byte GCM tag per chunk
HEADER = len(crypto.MAGIC) + 56  # our magic + Cobblestone's header (nonce/salt and key commitment)


def test_default_kdf_is_at_least_rfc9106_second_recommendation():
    params = KdfParams()
    assert (params.memory_kib, params.iterations, params.lanes) == (64 * 1024, 3, 4)
    assert params.meets_rfc9106
    assert not KdfParams(memory_kib=1024, iterations=1, lanes=1).meets_rfc9106


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"lanes": 0}, "lanes"),
        ({"iterations": 0}, "iterations"),
        ({"memory_kib": 16, "lanes": 4}, "8 KiB per lane"),
    ],
)
def test_kdf_params_are_validated(kwargs, message):
    with pytest.raises(InvalidRequest, match=message):
        KdfParams(**kwargs)


def test_kdf_params_round_trip_through_dict():
    params = KdfParams(memory_kib=2048, iterations=2, lanes=2)
    assert KdfParams.from_dict(params.to_dict()) == params


def test_passphrase_is_nfc_normalised_and_new_ones_need_length():
    composed = "caf\u00e9 au lait"
    decomposed = unicodedata.normalize("NFD", composed)
    assert composed != decomposed
    assert crypto.encode_passphrase(composed) == crypto.encode_passphrase(decomposed)
    with pytest.raises(InvalidRequest, match="too short"):
        crypto.encode_passphrase("short", new=True)
    with pytest.raises(InvalidRequest, match="empty"):
        crypto.encode_passphrase("")


def test_wrap_unwrap_binds_key_and_header():
    kek = os.urandom(32)
    key = os.urandom(32)
    nonce, wrapped = crypto.wrap_key(kek, key, b"header-a")
    assert crypto.unwrap_key(kek, nonce, wrapped, b"header-a") == key
    with pytest.raises(crypto.DecryptionFailed):
        crypto.unwrap_key(os.urandom(32), nonce, wrapped, b"header-a")
    with pytest.raises(crypto.DecryptionFailed):
        crypto.unwrap_key(kek, nonce, wrapped, b"header-b")


def test_subkeys_are_distinct_per_purpose_item_and_vault():
    master = os.urandom(32)
    vid = os.urandom(16)
    keys = {
        crypto.subkey(master, vid, "index"),
        crypto.subkey(master, vid, "audit-mac"),
        crypto.subkey(master, vid, "item", "a" * 32),
        crypto.subkey(master, vid, "item", "b" * 32),
        crypto.subkey(master, os.urandom(16), "index"),
    }
    assert len(keys) == 5
    assert crypto.subkey(master, vid, "index") == crypto.subkey(bytearray(master), vid, "index")


@pytest.mark.parametrize("size", [0, 1, 16383, 16384, 16385, 3 * 16384 + 7])
def test_stream_round_trip_with_arbitrary_piece_sizes(size):
    key = os.urandom(32)
    ctx = crypto.context(b"v" * 16, "item", "volume")
    plain = os.urandom(size)
    rng = random.Random(size)
    enc = crypto.StreamEncryptor(key, ctx)
    ct = bytearray()
    pos = 0
    while pos < size:
        step = rng.randint(1, 40000)
        ct += enc.update(plain[pos : pos + step])
        pos += step
    ct += enc.finalize()
    assert ct.startswith(crypto.MAGIC)
    assert len(ct) == HEADER + size + 16 * (size // 16384 + 1)
    pieces = [bytes(ct[i : i + 5000]) for i in range(0, len(ct), 5000)]
    assert b"".join(crypto.decrypt_chunks(key, ctx, pieces)) == plain


def _message(n_chunks: float = 4.5):
    key = os.urandom(32)
    ctx = crypto.context(b"v" * 16, "x")
    plain = os.urandom(int(16384 * n_chunks))
    return key, ctx, plain, crypto.encrypt_bytes(key, ctx, plain)


def _decrypt_or_none(key, ctx, blob):
    try:
        return crypto.decrypt_bytes(key, ctx, blob)
    except crypto.DecryptionFailed:
        return None


def test_truncation_at_and_between_chunk_boundaries_is_detected():
    key, ctx, plain, ct = _message()
    boundaries = [0, len(crypto.MAGIC), HEADER] + [HEADER + k * CHUNK_CT for k in range(1, 6)]
    cuts = set()
    for b in boundaries:
        cuts.update({b - 1, b, b + 1, b + CHUNK_CT // 2})
    cuts = sorted(c for c in cuts if 0 <= c < len(ct))
    assert len(cuts) >= 20
    for cut in cuts:
        assert _decrypt_or_none(key, ctx, ct[:cut]) is None, f"truncation at {cut} not detected"


def test_truncated_stream_raises_only_at_the_end_after_authenticated_pieces():
    key, ctx, plain, ct = _message()
    cut = HEADER + 2 * CHUNK_CT  # exactly after two whole chunks
    got = bytearray()
    with pytest.raises(crypto.DecryptionFailed):
        for piece in crypto.decrypt_chunks(key, ctx, [ct[:cut]]):
            got += piece
    assert plain.startswith(bytes(got))  # what came out was genuine, but the caller got an error


# Seeded bytes: the test ids stay the same from one collection to the next (parallel workers compare them).
@pytest.mark.parametrize(
    "extra",
    [b"\x00", random.Random(16).randbytes(16), random.Random(CHUNK_CT).randbytes(CHUNK_CT)],
    ids=["one-byte", "sixteen-bytes", "one-chunk"],
)
def test_appended_bytes_are_detected(extra):
    key, ctx, _, ct = _message()
    assert _decrypt_or_none(key, ctx, ct + extra) is None


def test_reordered_chunks_wrong_key_and_wrong_context_are_detected():
    key, ctx, _, ct = _message()
    first, second = HEADER, HEADER + CHUNK_CT
    swapped = ct[:first] + ct[second : second + CHUNK_CT] + ct[first:second] + ct[second + CHUNK_CT :]
    assert _decrypt_or_none(key, ctx, swapped) is None
    assert _decrypt_or_none(os.urandom(32), ctx, ct) is None
    assert _decrypt_or_none(key, crypto.context(b"v" * 16, "y"), ct) is None


def test_every_byte_flip_of_a_short_message_is_detected():
    key, ctx, _, ct = _message(0.1)
    for pos in range(len(ct)):
        damaged = bytearray(ct)
        damaged[pos] ^= 0x01
        assert _decrypt_or_none(key, ctx, bytes(damaged)) is None, f"flip at {pos} not detected"
