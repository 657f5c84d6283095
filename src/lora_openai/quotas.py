"""Per-key limits: requests, audio seconds and tokens per minute, and concurrent requests.

The per-minute arithmetic is the `limits` library's moving window (one window per key name and
kind) in this process's memory: each front replica counts its own callers. Refusals are
`OpenAIError(429)` with the seconds until the window has room, sent as `Retry-After`.
A request is counted before it is served; its audio seconds when its file has been probed;
its tokens once Triton has answered (a key over its token budget is refused from then on until
the window has room again). Nothing here waits: a key over its limit is answered at once and
never holds another key's requests back.
"""

import math
import threading
import time
from contextlib import contextmanager

from limits import RateLimitItemPerMinute, storage, strategies

from lora_openai.errors import OpenAIError
from lora_openai.keys import KeyEntry


class LimitExceeded(OpenAIError):
    def __init__(self, message: str, retry_after_s: int):
        super().__init__(429, message, code="rate_limit_exceeded")
        self.retry_after_s = retry_after_s

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after_s)}


class TenantLimits:
    def __init__(self, *, clock=time.time):
        self._window = strategies.MovingWindowRateLimiter(storage.MemoryStorage())
        self._clock = clock
        self._running: dict[str, int] = {}
        self._lock = threading.Lock()

    def _retry_after(self, item, *identifiers: str) -> int:
        reset = self._window.get_window_stats(item, *identifiers).reset_time
        return max(1, math.ceil(reset - self._clock()))

    def _hit(self, key: KeyEntry, kind: str, per_minute: int | None, cost: int, unit: str):
        if per_minute is None or cost <= 0:
            return
        item = RateLimitItemPerMinute(per_minute)
        if not self._window.hit(item, key.name, kind, cost=cost):
            raise LimitExceeded(
                f"this key's limit of {per_minute} {unit} per minute is reached; retry later",
                self._retry_after(item, key.name, kind),
            )

    @contextmanager
    def request(self, key: KeyEntry):
        """Admit one request of `key` (requests per minute, concurrency, a token budget that is
        not spent yet) and hold its concurrency slot while the block runs."""
        limits = key.limits
        if limits.tokens_per_minute is not None:
            item = RateLimitItemPerMinute(limits.tokens_per_minute)
            if not self._window.test(item, key.name, "tokens"):
                raise LimitExceeded(
                    f"this key's limit of {limits.tokens_per_minute} tokens per minute is "
                    "reached; retry later",
                    self._retry_after(item, key.name, "tokens"),
                )
        with self._lock:
            running = self._running.get(key.name, 0)
            if limits.concurrent_requests is not None and running >= limits.concurrent_requests:
                raise LimitExceeded(
                    f"this key's limit of {limits.concurrent_requests} concurrent requests is "
                    "reached; retry when one has finished",
                    1,
                )
            self._hit(key, "requests", limits.requests_per_minute, 1, "requests")
            self._running[key.name] = running + 1
        try:
            yield
        finally:
            with self._lock:
                self._running[key.name] -= 1
                if not self._running[key.name]:
                    del self._running[key.name]

    def audio(self, key: KeyEntry, seconds: float) -> None:
        """Count `seconds` of audio about to be transcribed; 429 when over the minute's budget,
        400 for one file longer than the whole budget (it could never pass)."""
        per_minute = key.limits.audio_seconds_per_minute
        cost = math.ceil(seconds)
        if per_minute is not None and cost > per_minute:
            raise OpenAIError(
                400,
                f"the audio is {seconds:.0f} s long; this key may send at most {per_minute} "
                "audio seconds per minute",
                param="file",
                code="audio_too_long",
            )
        self._hit(key, "audio", per_minute, cost, "audio seconds")

    def tokens(self, key: KeyEntry, count: int) -> None:
        """Charge tokens already served: as many as the window still holds (the next request
        is refused once it is full)."""
        per_minute = key.limits.tokens_per_minute
        if per_minute is None or count <= 0:
            return
        item = RateLimitItemPerMinute(per_minute)
        room = self._window.get_window_stats(item, key.name, "tokens").remaining
        if room > 0:
            self._window.hit(item, key.name, "tokens", cost=min(count, room))

    def running(self, name: str) -> int:
        with self._lock:
            return self._running.get(name, 0)
