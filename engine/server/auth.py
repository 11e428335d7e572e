"""The bearer token: making one, judging how easy it is to guess, and the gate that checks it on every route."""

from __future__ import annotations

import asyncio
import hmac
import math
import secrets
import time
from collections import OrderedDict, deque

from fastapi import Request

from engine.errors import InvalidRequest
from engine.server.schemas import Refused

TOKEN_BYTES = 32
MIN_TOKEN_CHARS = 43  # len(secrets.token_urlsafe(32)): 32 random bytes in URL-safe base64
MIN_TOKEN_BITS = 128  # estimated guessing entropy a token must have (a new token has ~256)


def new_token() -> str:
    """A bearer token of 32 random bytes (43 URL-safe characters)."""
    return secrets.token_urlsafe(TOKEN_BYTES)


def token_strength_bits(token: str) -> float:
    """A conservative estimate of a token's guessing entropy, in bits.

    Each character counts ``log2`` of the size of the character classes the token uses (lower case,
    upper case, digits, other printable: 26/26/10/33), except characters that only continue a pattern:
    a step of a run with a constant stride of at most 3 code points ("abcd", "aaaa", "0246", "zyx"), a
    step of a walk along a QWERTY row ("qwer", "lkjh"), or the end of a 3-character piece seen earlier in
    the token ("abcabc"), count 1 bit. So the alphabet,
    repeated characters and repeated chunks are weak however long; random characters are not. Words are
    not recognised (no dictionary): that is why a token should come from ``volsynth serve --new-token``.
    """
    classes = 0
    classes += 26 if any(c.islower() for c in token) else 0
    classes += 26 if any(c.isupper() for c in token) else 0
    classes += 10 if any(c.isdigit() for c in token) else 0
    classes += 33 if any(not c.isalnum() for c in token) else 0
    per_char = math.log2(max(classes, 2))
    bits = 0.0
    for i, c in enumerate(token):
        stride = ord(c) - ord(token[i - 1]) if i >= 1 else None
        if i >= 2 and stride == ord(token[i - 1]) - ord(token[i - 2]) and abs(stride) <= 3:
            bits += 1.0  # continues a run
        elif i >= 2 and _keyboard_step(token[i - 2], token[i - 1]) == _keyboard_step(token[i - 1], c) != 0:
            bits += 1.0  # continues a walk along a keyboard row ("qwerty", "lkjh")
        elif i >= 3 and token[i - 2 : i + 1] in token[: i - 1]:
            bits += 1.0  # repeats an earlier piece
        else:
            bits += per_char
    return bits


_KEYBOARD_ROWS = ("1234567890", "qwertyuiop", "asdfghjkl", "zxcvbnm")


def _keyboard_step(a: str, b: str) -> int:
    """+1 or -1 when ``b`` is next to ``a`` on a QWERTY row (either case), else 0."""
    a, b = a.lower(), b.lower()
    for row in _KEYBOARD_ROWS:
        if a in row and b in row:
            step = row.index(b) - row.index(a)
            return step if abs(step) == 1 else 0
    return 0


def check_token(token: str) -> None:
    """Refuse a weak token, on any address (on this machine it keeps other local users out)."""
    bits = token_strength_bits(token)
    if bits < MIN_TOKEN_BITS:
        raise InvalidRequest(
            f"the token is too easy to guess (about {bits:.0f} bits; at least {MIN_TOKEN_BITS} needed, "
            f"e.g. {TOKEN_BYTES} random bytes); make one with `volsynth serve --new-token`"
        )


class TokenGate:
    """Checks the bearer token; wrong tokens from one client are answered ever more slowly, one at a time.

    The first ``free_failures`` failures of a client (by address) are answered at once, then each waits
    twice as long as the one before (from ``base_delay_s``) up to ``max_delay_s``; a right token resets the
    count. Wrong guesses of one client wait *in turn* (an ``asyncio.Lock`` per address), so guesses sent in
    parallel get no more answers per second than guesses sent one after another. While ``max_waiting``
    wrong guesses of a client are waiting, its further requests are answered 429 before their token is
    looked at (a verdict given at once would undo the waiting; a queue without bound would hold a
    connection per guess). The waits are ``asyncio.sleep``: waiting clients hold no threads.
    """

    MAX_CLIENTS = 4096  # failure counts kept (oldest dropped first)

    def __init__(
        self,
        token: str | None,
        free_failures: int = 3,
        base_delay_s: float = 0.25,
        max_delay_s: float = 10.0,
        max_waiting: int = 16,
    ) -> None:
        self.token = token
        self.free_failures = free_failures
        self.base_delay_s = base_delay_s
        self.max_delay_s = max_delay_s
        self.max_waiting = max_waiting
        self.failures: OrderedDict[str, int] = OrderedDict()
        self.total_failures = 0
        self.delays: deque[float] = deque(maxlen=64)  # the waits imposed, newest last
        self.answered: deque[tuple[float, float]] = deque(maxlen=256)  # (wait start, answer) per wrong guess
        self.refused_busy = 0
        self._turns: dict[str, asyncio.Lock] = {}
        self._waiting: dict[str, int] = {}

    def delay_for(self, failures: int) -> float:
        over = failures - self.free_failures
        return 0.0 if over <= 0 else min(self.max_delay_s, self.base_delay_s * 2 ** min(over - 1, 16))

    async def __call__(self, request: Request) -> None:
        if not self.token:
            return
        client = request.client.host if request.client else "?"
        if self._waiting.get(client, 0) >= self.max_waiting:
            self.refused_busy += 1
            raise Refused(
                429,
                "too many wrong tokens from this address are waiting to be answered; try again later",
                "BackendUnavailable",
                headers={"Retry-After": str(max(1, math.ceil(self.max_delay_s)))},
            )
        given = request.headers.get("authorization", "")
        if hmac.compare_digest(given.encode("utf-8", "replace"), f"Bearer {self.token}".encode()):
            self.failures.pop(client, None)
            return
        self._waiting[client] = self._waiting.get(client, 0) + 1
        turn = self._turns.setdefault(client, asyncio.Lock())
        try:
            async with turn:  # one wrong guess of this client at a time: its wait counts from its turn
                count = self.failures.pop(client, 0) + 1
                self.failures[client] = count
                while len(self.failures) > self.MAX_CLIENTS:
                    self.failures.popitem(last=False)
                self.total_failures += 1
                delay = self.delay_for(count)
                self.delays.append(delay)
                started = time.monotonic()
                if delay:
                    await asyncio.sleep(delay)
                self.answered.append((started, time.monotonic()))
        finally:
            self._waiting[client] -= 1
            if not self._waiting[client]:
                del self._waiting[client]
                self._turns.pop(client, None)
        raise Refused(
            401,
            "missing or wrong token; pass the server's token (--token)",
            "BackendUnavailable",
            headers={"WWW-Authenticate": "Bearer"},
        )
