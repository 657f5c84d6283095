"""The endpoint picker's reading of a replica's `/metrics`, and its LoRA scoring, in Python.

A test harness, not a router: it mirrors what llm-d Router v0.10.0 (the Gateway API Inference
Extension's endpoint picker) does with our front's `/metrics`, so the conformance test and the
routing study (`lora_tools.bench.routing`) see what the real picker would see.

Reading (`core-metrics-extractor`, engine config "vllm";
pkg/epp/framework/plugins/datalayer/extractor/metrics/{extractor,spec,loraspec}.go):
- queue, running, KV usage: the family's first series (none of ours carries a timestamp); its
  gauge or counter value, else 0; queue and running as Go's `int(float64)` (truncation);
  a missing family is an error.
- LoRA: the `vllm:lora_requests_info` series with the largest value; `running_lora_adapters` and
  `waiting_lora_adapters` split on "," with spaces trimmed and empty names dropped; `max_lora`
  parsed as an int. A missing family leaves the LoRA fields empty, not an error.

Scoring (pkg/epp/framework/plugins/scheduling/scorer/...):
- `queue-scorer`: (max queue - queue) / (max - min) over the candidates; 1 for all if equal.
- `running-requests-size-scorer`: the same over running requests (not in our profile; the
  routing study tries it).
- `kv-cache-utilization-scorer`: 1 - KV usage.
- `lora-affinity-scorer`: 1.0 target active; 0.8 else if active + waiting < max_lora; 0.6
  else if target waiting; 0.0 otherwise.
- profile: sum of weight x score (weight 1 unless configured); `max-score-picker`: the highest
  total, ties broken at random.
"""

import random
from collections.abc import Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

QUEUE = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
KV_USAGE = "vllm:kv_cache_usage_perc"
LORA_INFO = "vllm:lora_requests_info"
# k8s/inference-pool.yaml's scheduling profile: the weights the study routes with.
WEIGHTS = {"queue-scorer": 1.0, "kv-cache-utilization-scorer": 1.0, "lora-affinity-scorer": 1.0}


class MetricMissing(ValueError):
    """A metric the picker requires is not on the endpoint's /metrics."""


@dataclass(frozen=True)
class EndpointMetrics:
    """The fields of the picker's per-endpoint Metrics that these scorers read."""

    waiting_queue_size: int
    running_requests_size: int
    kv_cache_usage_percent: float
    active_models: frozenset[str] = field(default_factory=frozenset)
    waiting_models: frozenset[str] = field(default_factory=frozenset)
    max_active_models: int = 0


def _value(sample_type: str, value: float) -> float:
    return float(value) if sample_type in ("gauge", "counter") else 0.0


def _adapters(csv: str) -> frozenset[str]:
    return frozenset(name.strip() for name in csv.split(",") if name.strip())


def read_endpoint_metrics(text: str) -> EndpointMetrics:
    """A replica's /metrics text, read as the picker reads it."""
    families = {family.name: family for family in text_string_to_metric_families(text)}

    def first_value(name: str) -> float:
        family = families.get(name)
        if family is None or not family.samples:
            raise MetricMissing(f"metric family {name!r} not found")
        return _value(family.type, family.samples[0].value)

    active, waiting, max_lora = frozenset(), frozenset(), 0
    lora = families.get(LORA_INFO)
    if lora is not None and lora.samples:
        latest, recent = None, -1.0
        for sample in lora.samples:
            value = _value(lora.type, sample.value)
            if value > recent:
                latest, recent = sample, value
        labels = latest.labels
        active = _adapters(labels.get("running_lora_adapters", ""))
        waiting = _adapters(labels.get("waiting_lora_adapters", ""))
        if labels.get("max_lora", ""):
            max_lora = int(labels["max_lora"])  # strconv.Atoi: "8.0" is an error too
    return EndpointMetrics(
        waiting_queue_size=int(first_value(QUEUE)),
        running_requests_size=int(first_value(RUNNING)),
        kv_cache_usage_percent=first_value(KV_USAGE),
        active_models=active,
        waiting_models=waiting,
        max_active_models=max_lora,
    )


def _fewer_scores_higher(sizes: dict[str, int]) -> dict[str, float]:
    """Min-max normalised, the smallest size 1 and the largest 0; all 1 when they are equal
    (the queue and running-requests scorers' rule)."""
    low, high = min(sizes.values()), max(sizes.values())
    if low == high:
        return dict.fromkeys(sizes, 1.0)
    return {name: (high - size) / (high - low) for name, size in sizes.items()}


def queue_scores(endpoints: Mapping[str, EndpointMetrics]) -> dict[str, float]:
    return _fewer_scores_higher({name: m.waiting_queue_size for name, m in endpoints.items()})


def running_scores(endpoints: Mapping[str, EndpointMetrics]) -> dict[str, float]:
    return _fewer_scores_higher({name: m.running_requests_size for name, m in endpoints.items()})


def kv_cache_scores(endpoints: Mapping[str, EndpointMetrics]) -> dict[str, float]:
    return {name: 1 - m.kv_cache_usage_percent for name, m in endpoints.items()}


def lora_affinity_score(target_model: str, m: EndpointMetrics) -> float:
    if target_model in m.active_models:
        return 1.0
    if len(m.active_models) + len(m.waiting_models) < m.max_active_models:
        return 0.8
    if target_model in m.waiting_models:
        return 0.6
    return 0.0


def scores(
    target_model: str,
    endpoints: Mapping[str, EndpointMetrics],
    weights: Mapping[str, float] = WEIGHTS,
) -> dict[str, float]:
    """Each endpoint's weighted total over the profile's scorers."""
    parts = {
        "queue-scorer": queue_scores(endpoints),
        "running-requests-size-scorer": running_scores(endpoints),
        "kv-cache-utilization-scorer": kv_cache_scores(endpoints),
        "lora-affinity-scorer": {
            name: lora_affinity_score(target_model, m) for name, m in endpoints.items()
        },
    }
    return {
        name: sum(weight * parts[scorer][name] for scorer, weight in weights.items())
        for name in endpoints
    }


def pick(
    target_model: str,
    endpoints: Mapping[str, EndpointMetrics],
    weights: Mapping[str, float] = WEIGHTS,
    rng: random.Random | None = None,
) -> str:
    """max-score-picker: the best total; a tie goes to a random one of the best."""
    totals = scores(target_model, endpoints, weights)
    best = max(totals.values())
    tied = sorted(name for name, total in totals.items() if total == best)
    return (rng or random).choice(tied)
