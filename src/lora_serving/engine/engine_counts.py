"""Counts only the engine's worker extension keeps, read after each job for the metrics:
adapter loads (vLLM activate_adapter / _load_adapter) and Whisper's encoder work
(vllm_plugin.whisper_encoder_memo)."""

import asyncio
from collections.abc import Callable

from lora_serving.engine.engine_calls import QUERY_TIMEOUT_S, ask_engine
from lora_serving.engine.lora_slots import ADAPTER_LOADS_METHOD, ENCODER_COUNTS_METHOD, EXTENSION
from lora_serving.metrics import AdapterLoads, EncoderWork, MetricsSink
from lora_serving.settings import EngineSettings


class EngineCounts:
    """Reads the counts in the background, on the engine loop: one read at a time; asked during
    a read, one more read follows it, so the last job is counted."""

    def __init__(self, settings: EngineSettings, metrics: MetricsSink, engine: Callable):
        self._metrics = metrics
        self._engine = engine  # () -> the running AsyncLLM (raises once it is gone)
        ours = settings.engine_args.get("worker_extension_cls") in (None, EXTENSION)
        self._encoder_counts_wanted = ours
        self._adapter_loads_wanted = ours and settings.lora_enabled
        self._task: asyncio.Task | None = None
        self._again = False
        self.stopped = False

    def refresh(self) -> None:
        if self.stopped or not (self._encoder_counts_wanted or self._adapter_loads_wanted):
            return
        if self._task is not None and not self._task.done():
            self._again = True
            return
        self._again = False
        self._task = asyncio.ensure_future(self._read())
        self._task.add_done_callback(self._read_again)

    def _read_again(self, _task) -> None:
        if self._again and not self.stopped:
            self.refresh()

    async def _ask(self, method: str, what: str) -> dict | None:
        try:
            call = self._engine().collective_rpc(method)
            return (await ask_engine(what, call, QUERY_TIMEOUT_S))[0]
        except Exception:  # no extension, or the engine is going: stop asking
            return None

    async def _read(self) -> None:
        if self._adapter_loads_wanted:
            loads = await self._ask(ADAPTER_LOADS_METHOD, "adapter loads")
            if not loads:
                self._adapter_loads_wanted = False
            else:
                self._metrics.record(AdapterLoads(loads["slot_loads"], loads["cache_loads"]))
        if self._encoder_counts_wanted:
            counts = await self._ask(ENCODER_COUNTS_METHOD, "encoder counts")
            if counts is None or counts["encoder_runs"] < 0:  # not a Whisper engine
                self._encoder_counts_wanted = False
            else:
                self._metrics.record(
                    EncoderWork(
                        counts["encoder_runs"],
                        counts["encoder_reuses"],
                        counts["cross_kv_runs"],
                        counts["cross_kv_reuses"],
                    )
                )
