"""The bearer token: making one, judging how easy it is to guess, and the gate that checks it on every route."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import math
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass

from engine.errors import InvalidRequest

TOKEN_BYTES = 32
MIN_TOKEN_CHARS = 43  # len(secrets.token_urlsafe(32)): 32 random bytes in URL-safe base64
MIN_TOKEN_BITS = 128  # estimated guessing entropy a token must have (a new token has ~256)


def new_token() -> str:
    """A bearer token of 32 random bytes (43 URL-safe characters), never starting with ``-``.

    A token that starts with ``-`` would be taken for an option by ``--token X``; drawing again keeps
    the token uniform over the other 63 first characters (log2(64/63): 0.02 bits fewer of ~256).
    """
    while True:
        token = secrets.token_urlsafe(TOKEN_BYTES)
        if not token.startswith("-"):
            return token


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


@dataclass(frozen=True)
class AuthRefusal:
    """What the gate answers a request it does not let in (sent before its body is read)."""

    status: int
    message: str
    error_class: str = "BackendUnavailable"
    headers: tuple[tuple[str, str], ...] = ()


def address_key(host: str) -> str:
    """Whose failures a request counts against: its IPv4 address, or its IPv6 /64 (one host's share)."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(address)


def bearer_credentials(value: bytes | None) -> bytes | None:
    """The token of an ``Authorization: Bearer <token>`` value (scheme in any case, RFC 7235), else None."""
    if not value:
        return None
    scheme, _, credentials = value.strip().partition(b" ")
    credentials = credentials.strip()
    if scheme.lower() != b"bearer" or not credentials or b" " in credentials:
        return None
    return credentials


class TokenGate:
    """Checks the bearer token on a request's headers, before its body is read or any queue is entered.

    ``tokens`` is one token, or client names -> tokens (each client's jobs are its own); with none, every
    request is let in and its client is its address. A request with a right token is let in at once,
    whatever wrong guesses its address sent before (so a token holder behind the same NAT or proxy as a
    guesser is never locked out). A request with no ``Authorization`` header, or one that is not
    ``Bearer <token>``, is answered 401 at once and not counted: it guesses nothing.

    Wrong tokens are guesses. The first ``free_failures`` of an address (its IPv6 /64) are answered at
    once, then each waits twice as long as the one before (from ``base_delay_s``) up to ``max_delay_s``;
    an address's count is forgotten ``forget_s`` after its last wrong guess. Guesses of one address wait
    *in turn* (an ``asyncio.Lock`` per address), so parallel guesses get no more answers per second than
    sequential ones. While ``max_waiting`` guesses of one address, or ``max_waiting_total`` of all
    addresses, are waiting, a further wrong guess is answered 429 at once. The waits are
    ``asyncio.sleep`` outside the in-flight request count: waiting guesses hold no thread and no slot a
    token holder needs.

    Comparing first means a flood learns "wrong" from a quick 429: a right token must never wait behind
    wrong ones, so a verdict cannot be withheld. The back-off bounds what guessing costs the server, not
    how fast a flood guesses; against guessing the defence is the token's >= 128 bits (``check_token``):
    at a million guesses a second, 2**127 guesses take about 5e24 years.
    """

    MAX_CLIENTS = 4096  # failure counts kept (oldest dropped first)

    def __init__(
        self,
        tokens: str | Mapping[str, str] | None,
        free_failures: int = 3,
        base_delay_s: float = 0.25,
        max_delay_s: float = 10.0,
        max_waiting: int = 16,
        max_waiting_total: int = 64,
        forget_s: float = 600.0,
    ) -> None:
        if isinstance(tokens, str):
            tokens = {"client": tokens} if tokens else {}
        self.tokens = dict(tokens or {})
        # Compared as SHA-256 digests: every comparison is of 32 bytes, whatever a request sends.
        self._digests = [(name, hashlib.sha256(t.encode()).digest()) for name, t in self.tokens.items()]
        self.free_failures = free_failures
        self.base_delay_s = base_delay_s
        self.max_delay_s = max_delay_s
        self.max_waiting = max_waiting
        self.max_waiting_total = max_waiting_total
        self.forget_s = forget_s
        self.failures: OrderedDict[str, tuple[int, float]] = OrderedDict()  # key -> (count, last failure)
        self.total_failures = 0
        self.not_bearer = 0  # requests with no or a malformed Authorization (not counted as guesses)
        self.delays: deque[float] = deque(maxlen=64)  # the waits imposed, newest last
        self.answered: deque[tuple[float, float]] = deque(maxlen=256)  # (wait start, answer) per wrong guess
        self.refused_busy = 0
        self.abandoned = 0  # wrong guesses whose client left while they waited
        self.waiting_total = 0
        self.peak_waiting_total = 0
        self._turns: dict[str, asyncio.Lock] = {}
        self._waiting: dict[str, int] = {}

    @property
    def token(self) -> str | None:
        """The token of a one-token server (None without tokens or with several)."""
        return next(iter(self.tokens.values())) if len(self.tokens) == 1 else None

    def delay_for(self, failures: int) -> float:
        over = failures - self.free_failures
        return 0.0 if over <= 0 else min(self.max_delay_s, self.base_delay_s * 2 ** min(over - 1, 16))

    def client_of(self, credentials: bytes) -> str | None:
        """The name of the client whose token this is, compared in constant time against every token."""
        digest = hashlib.sha256(credentials).digest()
        found = None
        for name, expected in self._digests:  # no early exit: the time does not say which token matched
            if hmac.compare_digest(digest, expected):
                found = name
        return found

    async def admit(self, host: str, authorization: bytes | None, gone=None) -> str | AuthRefusal | None:
        """The client a request comes from (its token's name, or its address without tokens), or why not.

        ``gone`` (makes an awaitable that ends when the client disconnects) cuts a wrong guess's wait short:
        a guess nobody waits for frees its place at once; the answer is then None (nothing to send).
        """
        if not self.tokens:
            return host
        credentials = bearer_credentials(authorization)
        if credentials is None:
            self.not_bearer += 1
            return AuthRefusal(
                401,
                "missing token; send the server's token as 'Authorization: Bearer <token>' (--token)",
                headers=(("WWW-Authenticate", "Bearer"),),
            )
        client = self.client_of(credentials)
        if client is not None:
            return client
        if gone is None:
            return await self._wrong_guess(address_key(host))
        waiting = asyncio.ensure_future(self._wrong_guess(address_key(host)))
        watching = asyncio.ensure_future(gone())
        try:
            await asyncio.wait({waiting, watching}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (waiting, watching):
                if not task.done():
                    task.cancel()  # the wait's own clean-up frees its place in the counts
        if waiting.done() and not waiting.cancelled():
            return waiting.result()
        self.abandoned += 1
        return None

    async def _wrong_guess(self, key: str) -> AuthRefusal:
        if self._waiting.get(key, 0) >= self.max_waiting or self.waiting_total >= self.max_waiting_total:
            self.refused_busy += 1
            where = "this address" if self._waiting.get(key, 0) >= self.max_waiting else "all addresses"
            return AuthRefusal(
                429,
                f"too many wrong tokens from {where} are waiting to be answered; try again later",
                headers=(("Retry-After", str(max(1, math.ceil(self.max_delay_s)))),),
            )
        self._waiting[key] = self._waiting.get(key, 0) + 1
        self.waiting_total += 1
        self.peak_waiting_total = max(self.peak_waiting_total, self.waiting_total)
        turn = self._turns.setdefault(key, asyncio.Lock())
        try:
            async with turn:  # one wrong guess of this address at a time: its wait counts from its turn
                now = time.monotonic()
                count, last = self.failures.pop(key, (0, now))
                count = 1 if now - last > self.forget_s else count + 1
                self.failures[key] = (count, now)
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
            self.waiting_total -= 1
            self._waiting[key] -= 1
            if not self._waiting[key]:
                del self._waiting[key]
                self._turns.pop(key, None)
        return AuthRefusal(
            401, "wrong token; pass the server's token (--token)", headers=(("WWW-Authenticate", "Bearer"),)
        )
