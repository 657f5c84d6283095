"""vLLM scheduler statistics -> per-adapter running / waiting counts, KV cache usage and the
engine's LoRA slots for our metrics.

vLLM calls `record` on the engine loop after every step; this keeps it to a comparison and,
when the load changed, one non-blocking `MetricsSink.record`. Waiting counts as vLLM's own
`vllm:num_requests_waiting` does: queued plus deferred (skipped) requests.
"""

from collections.abc import Mapping

from vllm.v1.metrics.loggers import StatLoggerBase

from lora_serving.adapters.catalog import name_from_engine_name
from lora_serving.metrics import BASE_LABEL, MetricsSink, SchedulerLoad

KV_USAGE_STEP = 0.001  # KV cache usage is reported in steps of 0.1 %


def scheduler_load(
    num_running: int,
    num_waiting: int,
    running_by_engine_name: Mapping[str, int],
    waiting_by_engine_name: Mapping[str, int],
    *,
    kv_cache_usage: float = 0.0,
    max_loras: int = 0,
) -> SchedulerLoad:
    """vLLM counts per engine name (`name@id`); base-model requests are the remainder.

    The KV cache usage is rounded to KV_USAGE_STEP: it moves with every block allocated, and
    each change is a metrics update in the Triton process."""

    def by_label(total: int, per_engine_name: Mapping[str, int]) -> dict[str, int]:
        labels: dict[str, int] = {}
        for engine_name, count in per_engine_name.items():
            label = name_from_engine_name(engine_name)
            labels[label] = labels.get(label, 0) + count
        labels[BASE_LABEL] = max(0, total - sum(labels.values()))
        return labels

    kv = min(1.0, max(0.0, round(kv_cache_usage / KV_USAGE_STEP) * KV_USAGE_STEP))
    return SchedulerLoad(
        by_label(num_running, running_by_engine_name),
        by_label(num_waiting, waiting_by_engine_name),
        kv_cache_usage=round(kv, 6),
        max_loras=max_loras,
    )


class SchedulerLoadLogger(StatLoggerBase):
    def __init__(self, vllm_config, engine_index: int = 0, *, sink: MetricsSink):
        self._sink = sink
        self._last: SchedulerLoad | None = None
        lora_config = getattr(vllm_config, "lora_config", None)
        self._max_loras = int(lora_config.max_loras) if lora_config is not None else 0

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
        if scheduler_stats is None:
            return
        load = scheduler_load(
            scheduler_stats.num_running_reqs,
            scheduler_stats.num_waiting_reqs + scheduler_stats.num_skipped_waiting_reqs,
            scheduler_stats.running_lora_adapters,
            scheduler_stats.waiting_lora_adapters,
            kv_cache_usage=scheduler_stats.kv_cache_usage,
            max_loras=self._max_loras,
        )
        if load != self._last:
            self._last = load
            self._sink.record(load)

    def log_engine_initialized(self) -> None:
        """An idle engine's load, so its LoRA slots are known before its first request."""
        self._last = scheduler_load(0, 0, {}, {}, max_loras=self._max_loras)
        self._sink.record(self._last)


def scheduler_load_logger(sink: MetricsSink):
    """A per-engine stat logger factory for AsyncLLM(stat_loggers=[...])."""

    def factory(vllm_config, engine_index: int = 0) -> SchedulerLoadLogger:
        return SchedulerLoadLogger(vllm_config, engine_index, sink=sink)

    return factory
