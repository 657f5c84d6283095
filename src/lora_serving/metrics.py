"""What the serving core reports for metrics: plain events, labelled by adapter name.

The core records events (`MetricsSink.record`, which must never block); the Triton layer
(`lora_serving.triton.metrics`) turns them into Prometheus series on its own thread, so the
engine loop never waits on the metrics endpoint (as vllm_backend's metrics thread).
"""

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

BASE_LABEL = "(base)"  # no adapter; parentheses cannot occur in adapter names
UNKNOWN_LABEL = "(unknown)"  # refused before its adapter was known (bad input, unknown name)
SUCCESS, ERROR, CANCELLED, REFUSED = "success", "error", "cancelled", "refused"


@dataclass(frozen=True)
class JobFinished:
    """One generation job (a batch row) ended; tokens over all its engine requests."""

    adapter: str
    outcome: str  # success | error | cancelled
    prompt_tokens: int
    generation_tokens: int
    time_to_first_token_s: float | None  # None: no token was generated
    latency_s: float


@dataclass(frozen=True)
class RequestRefused:
    """A Triton request refused before it reached the engine (one per request)."""

    adapter: str = UNKNOWN_LABEL


@dataclass(frozen=True)
class SchedulerLoad:
    """One engine's scheduler statistics: requests running / waiting per adapter label, the
    fraction of its KV cache in use (0..1) and its LoRA slots (max_loras; 0: LoRA off)."""

    running: Mapping[str, int]
    waiting: Mapping[str, int]
    kv_cache_usage: float = 0.0
    max_loras: int = 0


@dataclass(frozen=True)
class EncoderWork:
    """Whisper encoder inputs computed / reused so far (totals since the engine started), and
    the cross-attention K/V likewise (per request window and decoder layer)."""

    runs: int
    reuses: int
    cross_kv_runs: int = 0
    cross_kv_reuses: int = 0


@dataclass(frozen=True)
class AdapterLoads:
    """Adapters loaded so far (totals since counting started): into a LoRA slot, and from
    their folder into the engine's adapter cache."""

    slot_loads: int
    cache_loads: int


@dataclass(frozen=True)
class AdapterStates:
    """How many served adapters are loaded in engine slots, cached, or only registered."""

    counts: Mapping[str, int]


@dataclass(frozen=True)
class AdapterRootErrors:
    """Per configured adapter root: the Unix time its current error began (it could not be
    read: a folder unmounted, an object store down), or 0 while it reads fine."""

    since: Mapping[str, float]


class MetricsSink(Protocol):
    def record(self, event) -> None: ...


class NoMetrics:
    def record(self, event) -> None:
        pass


@dataclass
class JobMeter:
    """Measures one job on the engine loop: token counts and the time to its first token."""

    adapter: str = BASE_LABEL
    started: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None
    prompt_tokens: int = 0
    generation_tokens: int = 0

    def engine_request_done(
        self, *, submitted: float, prompt_tokens: int, generation_tokens: int, first_token_s
    ) -> None:
        """One engine request ended; `first_token_s` is vLLM's time from its arrival to its
        first token (None for a request that only prepares the job, e.g. language detection)."""
        self.prompt_tokens += prompt_tokens
        self.generation_tokens += generation_tokens
        if first_token_s is not None and generation_tokens and self.first_token_at is None:
            self.first_token_at = submitted + first_token_s

    def finished(self, outcome: str) -> JobFinished:
        now = time.monotonic()
        first = None if self.first_token_at is None else self.first_token_at - self.started
        return JobFinished(
            self.adapter,
            outcome,
            self.prompt_tokens,
            self.generation_tokens,
            first,
            now - self.started,
        )
