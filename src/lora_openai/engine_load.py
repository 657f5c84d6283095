"""The engines' load as Triton's metrics endpoint shows it, read by the front for `/metrics`.

Our models publish vLLM's scheduler statistics on Triton's Prometheus endpoint (port 8002,
`lora_serving.triton.metrics`), per model and per adapter, one set of series per model stub
(`stub_pid`; sum over it):

  lora_requests_running{model, adapter}   engine requests running ("(base)": no adapter)
  lora_requests_waiting{model, adapter}   engine requests waiting to be scheduled
  lora_kv_cache_usage_perc{model}         fraction of the engine's KV cache in use, 0..1
  lora_max_loras{model}                   the engine's LoRA slots (0: LoRA off, or unloaded)

`parse_triton_metrics(text)` turns that text into a `ServerLoad`, with prometheus_client's own
parser. Nothing here counts requests itself: every number is the engines'.
"""

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

from lora_openai.errors import OpenAIError
from lora_openai.models import ModelId

RUNNING, WAITING = "lora_requests_running", "lora_requests_waiting"
KV_USAGE, MAX_LORAS = "lora_kv_cache_usage_perc", "lora_max_loras"


def is_adapter_label(label: str) -> bool:
    """ "(base)" (no adapter) and "(unknown)" are not adapters: names hold no parentheses."""
    return bool(label) and not label.startswith("(")


@dataclass
class ModelLoad:
    """One Triton model's engine: requests per adapter label, KV cache usage, LoRA slots."""

    running: dict[str, int] = field(default_factory=dict)
    waiting: dict[str, int] = field(default_factory=dict)
    kv_cache_usage: float = 0.0
    max_loras: int = 0


@dataclass
class ServerLoad:
    """Both models of one tritonserver; the picker's view of a replica is derived from it."""

    models: dict[str, ModelLoad] = field(default_factory=dict)

    @property
    def num_running(self) -> int:
        return sum(sum(m.running.values()) for m in self.models.values())

    @property
    def num_waiting(self) -> int:
        return sum(sum(m.waiting.values()) for m in self.models.values())

    @property
    def kv_cache_usage(self) -> float:
        """The fuller engine's: a request for either model may have to wait for its cache."""
        return max((m.kv_cache_usage for m in self.models.values()), default=0.0)

    @property
    def max_lora(self) -> int:
        """LoRA slots per engine; the smaller if the engines differ (0: no LoRA engine)."""
        return min((m.max_loras for m in self.models.values() if m.max_loras > 0), default=0)

    def adapters(self, state: str) -> list[str]:
        """Ids (`<model>/<adapter>`, as requests name them) with requests `state`
        ("running" or "waiting") now, sorted."""
        return sorted(
            ModelId(model, label).id
            for model, load in self.models.items()
            for label, count in getattr(load, state).items()
            if count > 0 and is_adapter_label(label)
        )


_FAMILIES = (RUNNING, WAITING, KV_USAGE, MAX_LORAS)
_PREFIXES = tuple(f"{kind}{name}" for name in _FAMILIES for kind in ("", "# HELP ", "# TYPE "))


def parse_triton_metrics(text: str) -> ServerLoad:
    """Triton's Prometheus text -> ServerLoad (series summed over stub_pid). Only our four
    families are parsed: the rest of Triton's text (latency histograms per model, ...) is
    skipped, since the picker asks for this every 50 ms."""
    load = ServerLoad()
    ours = "\n".join(line for line in text.splitlines() if line.startswith(_PREFIXES))
    for family in text_string_to_metric_families(ours + "\n"):
        if family.name not in _FAMILIES:
            continue
        for sample in family.samples:
            model = sample.labels.get("model")
            if not model:
                continue
            engine = load.models.setdefault(model, ModelLoad())
            if family.name == KV_USAGE:
                engine.kv_cache_usage = max(engine.kv_cache_usage, float(sample.value))
            elif family.name == MAX_LORAS:
                # While a model reloads, the old stub's series reads 0 once it has closed.
                slots = int(sample.value)
                if slots > 0:
                    engine.max_loras = min(engine.max_loras or slots, slots)
            else:
                counts = engine.running if family.name == RUNNING else engine.waiting
                label = sample.labels.get("adapter", "")
                counts[label] = counts.get(label, 0) + int(sample.value)
    return load


@dataclass(frozen=True)
class LoadSnapshot:
    load: ServerLoad
    read_at: float  # Unix time the values were read from Triton


class TritonLoadReader:
    """Reads Triton's metrics endpoint for the front's `/metrics`.

    The endpoint picker scrapes every replica often (every 50 ms by default), so a read younger
    than `max_age_s` is reused, and scrapes that arrive together share one read. `close()`
    when the app stops."""

    def __init__(
        self,
        metrics_url: str,
        *,
        max_age_s: float = 0.05,
        timeout_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        transport: httpx.AsyncBaseTransport | None = None,
    ):
        self.metrics_url = metrics_url
        self.max_age_s = max_age_s
        self._clock, self._wall_clock = clock, wall_clock
        self._client = httpx.AsyncClient(timeout=timeout_s, transport=transport)
        self._lock = asyncio.Lock()
        self._last: tuple[float, LoadSnapshot] | None = None

    async def close(self) -> None:
        await self._client.aclose()

    async def read(self) -> LoadSnapshot:
        async with self._lock:
            if self._last is not None and self._clock() - self._last[0] < self.max_age_s:
                return self._last[1]
            try:
                response = await self._client.get(self.metrics_url)
                response.raise_for_status()
            except httpx.HTTPError as err:
                raise OpenAIError(
                    503,
                    f"Triton's metrics at {self.metrics_url} cannot be read: {err}",
                    code="triton_unavailable",
                ) from None
            snapshot = LoadSnapshot(parse_triton_metrics(response.text), self._wall_clock())
            self._last = (self._clock(), snapshot)
            return snapshot
