"""vLLM scheduler statistics -> per-adapter running / waiting counts, KV cache usage and the
engine's LoRA slots for our metrics.

vLLM calls `record` on the engine loop after every step; this keeps it to a comparison and,
when the load changed, one non-blocking `MetricsSink.record`. Waiting counts as vLLM's own
`vllm:num_requests_waiting` does: queued plus deferred (skipped) requests.
"""

from vllm.v1.metrics.loggers import StatLoggerBase

from lora_serving.metrics import MetricsSink, SchedulerLoad, scheduler_load


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
