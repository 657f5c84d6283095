"""EngineHost owns one vLLM AsyncLLM and the asyncio loop thread it runs on.

Triton calls `execute` on its own thread; everything touching the engine runs on the loop thread
via `submit`. Start-up errors surface in `start()` (the model then fails to load with the real
error), and `close()` stops the engine processes so no EngineCore outlives the model.

A job gets the engine through `session()`: a JobSession (engine/engine_session.py) bound to its
adapter, streaming mode, cancellation and timeout, which the job's own `run` drives.

Two optional hooks: `leases` (the adapter fleet) holds the adapter version a job runs on for as
long as it runs, and `metrics` receives one event per job and vLLM's per-step scheduler counts.
The LoRA methods (`add_lora`, `remove_lora`, `pin_lora`, `lora_state`) are what the fleet drives.
"""

import asyncio
import concurrent.futures
import contextlib
import itertools
import os
import threading
from collections.abc import AsyncIterator, Coroutine

from lora_serving.adapter_access import AdapterLeases
from lora_serving.adapters.catalog import Adapter
from lora_serving.engine.engine_calls import LOAD_TIMEOUT_S, QUERY_TIMEOUT_S, ask_engine
from lora_serving.engine.engine_counts import EngineCounts
from lora_serving.engine.engine_session import JobSession
from lora_serving.engine.job_guard import JobGuard
from lora_serving.engine.lora_slots import PIN_METHOD, SLOT_IDS_METHOD
from lora_serving.errors import EngineUnavailable, RequestCancelled, UnknownAdapter
from lora_serving.metrics import (
    BASE_LABEL,
    CANCELLED,
    ERROR,
    REFUSED,
    SUCCESS,
    JobMeter,
    MetricsSink,
)
from lora_serving.settings import EngineSettings


class _FixedAdapters:
    """Leases for a fixed adapter set (no fleet): every job runs on the adapter it names."""

    @contextlib.contextmanager
    def lease(self, adapter: Adapter | None):
        yield adapter


class EngineHost:
    def __init__(
        self,
        settings: EngineSettings,
        *,
        log=print,
        leases: AdapterLeases | None = None,
        metrics: MetricsSink | None = None,
    ):
        self.settings = settings
        self._log = log
        # `is None`: an adapter fleet with no adapters yet is falsy (it has a length).
        self._leases = _FixedAdapters() if leases is None else leases
        self._metrics = metrics
        self._slot_ids_available = True
        # Adapter loads and Whisper's encoder work, read after each job.
        self._counts: EngineCounts | None = None
        self._loop = asyncio.new_event_loop()
        self._tasks: set[asyncio.Task] = set()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="engine-loop", daemon=True
        )
        self._engine = None
        self._closing = False
        self._request_ids = itertools.count()
        self._inflight = 0
        self._inflight_lock = threading.Lock()

    # ---- lifecycle -------------------------------------------------------------------------
    def start(self, timeout_s: float = 900.0) -> None:
        """Start the engine; raises the engine's own error if it cannot start."""
        os.environ.update(self.settings.environment)
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._create_engine(), self._loop)
        self._engine = future.result(timeout=timeout_s)
        self._log(f"engine ready: {self.settings.engine_args.get('model')}")
        if self._metrics is not None:  # adapter loads are counted from here on
            self._counts = EngineCounts(self.settings, self._metrics, lambda: self.engine)
            self._loop.call_soon_threadsafe(self._counts.refresh)

    async def _create_engine(self):
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        args = AsyncEngineArgs(**self.settings.engine_args)
        stat_loggers = None
        if self._metrics is not None:
            from lora_serving.engine.stat_logger import scheduler_load_logger

            stat_loggers = [scheduler_load_logger(self._metrics)]
        return AsyncLLM.from_engine_args(args, stat_loggers=stat_loggers)

    @property
    def engine(self):
        if self._engine is None or self._closing:
            raise EngineUnavailable("the engine is not running (starting up or shutting down)")
        if self._engine.errored:
            raise EngineUnavailable(f"the engine has failed: {self._engine.dead_error}")
        return self._engine

    def check_available(self) -> None:
        """Raise EngineUnavailable if requests cannot be served now."""
        self.engine  # noqa: B018 - the property raises

    def is_healthy(self) -> bool:
        return self._engine is not None and not self._closing and not self._engine.errored

    def watch(self, on_failure, interval_s: float = 1.0) -> None:
        """Call `on_failure(error)` once, on the loop thread, if the engine dies while serving
        (its EngineCore process killed or crashed); not when it is closed on purpose."""

        async def watch_loop():
            while not self._closing:
                await asyncio.sleep(interval_s)
                if self._engine is not None and self._engine.errored and not self._closing:
                    on_failure(self._engine.dead_error)
                    return

        self.submit(watch_loop())

    def tokenizer(self):
        return self.engine.get_tokenizer()

    def submit(self, coroutine: Coroutine) -> concurrent.futures.Future:
        """Run a coroutine on the engine loop (callable from any thread)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    def submit_all(self, coroutines: list[Coroutine]) -> None:
        """Start coroutines on the engine loop with one wake-up of the loop for all of them.

        Waking the loop is a write to its self-pipe, and the calling thread (Triton's execute())
        then waits for the GIL, which the loop thread holds while it processes outputs: py-spy
        put 48 % of qwen_vl_lora's stub samples there at 8 requests in flight, with the engine
        idle 90 % of the time. One wake-up per execute() call instead of one per request."""
        if not coroutines:
            return

        def start_all():
            for coroutine in coroutines:
                task = self._loop.create_task(coroutine)
                self._tasks.add(task)  # the loop keeps only a weak reference
                task.add_done_callback(self._tasks.discard)

        self._loop.call_soon_threadsafe(start_all)

    @property
    def inflight(self) -> int:
        with self._inflight_lock:
            return self._inflight

    def close(self, drain_timeout_s: float = 30.0) -> None:
        """Let running requests finish (bounded), then stop the engine and the loop."""
        self._closing = True
        if self._counts is not None:
            self._counts.stopped = True
        deadline = self._loop.time() + drain_timeout_s if self._thread.is_alive() else 0
        while self._thread.is_alive() and self.inflight and self._loop.time() < deadline:
            threading.Event().wait(0.1)
        if self._engine is not None:
            try:
                self._engine.shutdown()
            except Exception as err:  # shutting down anyway; report, don't mask the close
                self._log(f"engine shutdown raised: {err!r}")
            # A dead engine keeps its error, whose traceback holds our request frames (and
            # Triton's response senders): let them go now, not at interpreter exit.
            self._engine = None
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)

    # ---- adapters (loop thread; what the adapter fleet drives) ---------------------------------
    async def add_lora(self, adapter: Adapter) -> None:
        """Load an adapter version into the engine's cache; raises the engine's error if it
        refuses it (its checks run here, where a failure does not stop the engine)."""
        call = self.engine.add_lora(adapter.to_lora_request())
        await ask_engine("add_lora", call, LOAD_TIMEOUT_S)

    async def remove_lora(self, int_id: int) -> None:
        await ask_engine("remove_lora", self.engine.remove_lora(int_id), QUERY_TIMEOUT_S)

    async def pin_lora(self, int_id: int) -> None:
        """Keep an added adapter in the engine's adapter cache (adapters.pinning)."""
        call = self.engine.collective_rpc(PIN_METHOD, args=(int_id,))
        await ask_engine("pin", call, QUERY_TIMEOUT_S)

    async def lora_state(self) -> tuple[set[int], set[int]]:
        """(ids in the engine's LoRA slots, ids in its adapter cache)."""
        call = self.engine.list_loras()
        cached = set(await ask_engine("list_loras", call, QUERY_TIMEOUT_S))
        slots: set[int] = set()
        if self._slot_ids_available:
            try:
                call = self.engine.collective_rpc(SLOT_IDS_METHOD)
                for worker_ids in await ask_engine("slot listing", call, QUERY_TIMEOUT_S):
                    slots.update(worker_ids)
            except EngineUnavailable:
                raise
            except Exception as err:  # another worker extension in model.json: cache only
                self._slot_ids_available = False
                self._log(f"adapter slots cannot be listed ({err!r}); listing the cache only")
        return slots & cached, cached

    # ---- jobs (loop thread) ------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def session(
        self,
        adapter: Adapter | None,
        *,
        stream: bool,
        is_cancelled=lambda: False,
        timeout_s: float | None = None,
    ) -> AsyncIterator[JobSession]:
        """Open the engine for one job: `async with host.session(job.adapter, ...) as engine:`
        then `job.run(engine)`. The session runs on the adapter version leased for the job.

        The job ends with RequestCancelled once `is_cancelled()` says so, and with
        RequestTimedOut after `timeout_s` (at most serving.request_timeout_s): all of its
        engine requests are aborted then. One metrics event per job, on exit."""
        meter = JobMeter(adapter=BASE_LABEL if adapter is None else adapter.name)
        outcome = ERROR
        limit = self.settings.serving.request_timeout_s
        timeout_s = min(timeout_s, limit) if timeout_s else limit
        with self._inflight_lock:
            self._inflight += 1
        try:
            async with JobGuard(timeout_s, is_cancelled, self.settings.serving.cancel_poll_s):
                with self._leases.lease(adapter) as leased:  # a replaced version gives way
                    yield JobSession(self, leased, live=stream, meter=meter)
            outcome = SUCCESS
        except UnknownAdapter:  # removed since the request was decoded
            outcome = REFUSED
            raise
        except (RequestCancelled, asyncio.CancelledError, GeneratorExit):
            outcome = CANCELLED
            raise
        finally:
            with self._inflight_lock:
                self._inflight -= 1
            if self._metrics is not None:
                self._metrics.record(meter.finished(outcome))
            if self._counts is not None:
                self._counts.refresh()

    def new_request_id(self) -> str:
        return f"req-{next(self._request_ids)}"

    def engine_failed(self) -> bool:
        """Whether the engine has died (its EngineCore gone), as opposed to one request failing."""
        return self._engine is not None and self._engine.errored
