"""vLLM scheduler statistics -> per-adapter running / waiting counts for our metrics.

vLLM calls `record` on the engine loop after every step; this keeps it to a comparison and,
when the counts changed, one non-blocking `MetricsSink.record`.
"""

from vllm.v1.metrics.loggers import StatLoggerBase

from lora_serving.metrics import MetricsSink, SchedulerLoad, scheduler_load


class SchedulerLoadLogger(StatLoggerBase):
    def __init__(self, vllm_config, engine_index: int = 0, *, sink: MetricsSink):
        self._sink = sink
        self._last: SchedulerLoad | None = None

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
        if scheduler_stats is None:
            return
        load = scheduler_load(
            scheduler_stats.num_running_reqs,
            scheduler_stats.num_waiting_reqs,
            scheduler_stats.running_lora_adapters,
            scheduler_stats.waiting_lora_adapters,
        )
        if load != self._last:
            self._last = load
            self._sink.record(load)

    def log_engine_initialized(self) -> None:
        pass


def scheduler_load_logger(sink: MetricsSink):
    """A per-engine stat logger factory for AsyncLLM(stat_loggers=[...])."""

    def factory(vllm_config, engine_index: int = 0) -> SchedulerLoadLogger:
        return SchedulerLoadLogger(vllm_config, engine_index, sink=sink)

    return factory
