"""Per-request timings -> throughput, latency percentiles, time to first token; medians, ratios.

Both sides of a comparison (perf_analyzer through Triton, the in-process AsyncLLM driver, the
Hugging Face pipeline) are reduced by the same functions, so a ratio compares like with like.
"""

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class RequestRecord:
    """One request: when it was sent, its first and last response (seconds, one clock)."""

    start: float
    first: float
    end: float
    responses: int = 1

    @property
    def latency(self) -> float:
        return self.end - self.start

    @property
    def ttft(self) -> float:
        return self.first - self.start


@dataclass(frozen=True)
class Summary:
    """One measurement: `requests` requests at `concurrency`, closed loop."""

    requests: int
    concurrency: int
    wall_s: float
    throughput: float  # requests per second: requests / (last end - first start)
    latency_s: dict[int, float]  # percentile -> seconds (send -> last response)
    ttft_s: dict[int, float]  # percentile -> seconds (send -> first response)

    def to_dict(self) -> dict:
        data = asdict(self)
        data["latency_s"] = {str(k): v for k, v in self.latency_s.items()}
        data["ttft_s"] = {str(k): v for k, v in self.ttft_s.items()}
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "Summary":
        return cls(
            requests=int(data["requests"]),
            concurrency=int(data["concurrency"]),
            wall_s=float(data["wall_s"]),
            throughput=float(data["throughput"]),
            latency_s={int(k): float(v) for k, v in data["latency_s"].items()},
            ttft_s={int(k): float(v) for k, v in data["ttft_s"].items()},
        )


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default method)."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} outside 0..100")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarize(records: Sequence[RequestRecord], concurrency: int) -> Summary:
    if not records:
        raise ValueError("no completed requests to summarize")
    wall = max(r.end for r in records) - min(r.start for r in records)
    if wall <= 0:
        raise ValueError("requests took no time: timestamps are wrong")
    latencies = [r.latency for r in records]
    ttfts = [r.ttft for r in records]
    return Summary(
        requests=len(records),
        concurrency=concurrency,
        wall_s=wall,
        throughput=len(records) / wall,
        latency_s={p: percentile(latencies, p) for p in PERCENTILES},
        ttft_s={p: percentile(ttfts, p) for p in PERCENTILES},
    )


def median(values: Iterable[float]) -> float:
    values = list(values)
    if not values:
        return math.nan
    return statistics.median(values)


@dataclass(frozen=True)
class Ratio:
    """numerator / denominator, paired by repetition (both measured in the same round)."""

    name: str
    per_repeat: tuple[float, ...]
    goal: float
    higher_is_better: bool = True

    @property
    def value(self) -> float:
        return median(self.per_repeat)

    @property
    def met(self) -> bool | None:
        if math.isnan(self.value):
            return None
        return self.value >= self.goal if self.higher_is_better else self.value <= self.goal

    @property
    def spread(self) -> tuple[float, float]:
        if not self.per_repeat:
            return (math.nan, math.nan)
        return (min(self.per_repeat), max(self.per_repeat))


def paired_ratios(numerators: Sequence[float], denominators: Sequence[float]) -> tuple[float, ...]:
    """Round-by-round ratios; a round missing either side (or a zero denominator) is skipped."""
    return tuple(
        n / d
        for n, d in zip(numerators, denominators, strict=False)
        if d and not math.isnan(n) and not math.isnan(d)
    )
