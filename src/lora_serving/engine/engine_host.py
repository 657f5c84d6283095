"""EngineHost owns one vLLM AsyncLLM and the asyncio loop thread it runs on.

Triton calls `execute` on its own thread; everything touching the engine runs on the loop thread
via `submit`. Start-up errors surface in `start()` (the model then fails to load with the real
error), and `close()` stops the engine processes so no EngineCore outlives the model.

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
import time
from collections.abc import AsyncIterator, Coroutine
from typing import Any

from lora_serving.adapters.catalog import Adapter
from lora_serving.engine.job_guard import JobGuard
from lora_serving.engine.lora_slots import (
    ADAPTER_LOADS_METHOD,
    ALIGNMENT_METHOD,
    ENCODER_COUNTS_METHOD,
    EXTENSION,
    PIN_METHOD,
    SLOT_IDS_METHOD,
)
from lora_serving.errors import EngineUnavailable, RequestCancelled, ServingError, UnknownAdapter
from lora_serving.jobs import FINAL_ONLY, GenerationChunk, GenerationJob
from lora_serving.metrics import (
    BASE_LABEL,
    CANCELLED,
    ERROR,
    REFUSED,
    SUCCESS,
    AdapterLoads,
    EncoderWork,
    JobMeter,
    MetricsSink,
)
from lora_serving.settings import EngineSettings
from lora_serving.vllm_plugin.whisper_alignment import EXTRA_ARG as ALIGNMENT_EXTRA_ARG

# Bounds on engine utility calls: loading one adapter from a local disk takes far less.
LOAD_TIMEOUT_S = 120.0
QUERY_TIMEOUT_S = 15.0


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
        leases=None,
        metrics: MetricsSink | None = None,
    ):
        self.settings = settings
        self._log = log
        # `is None`: an adapter fleet with no adapters yet is falsy (it has a length).
        self._leases = _FixedAdapters() if leases is None else leases
        self._metrics = metrics
        self._slot_ids_available = True
        # Whisper's encoder work (vllm_plugin.whisper_encoder_memo), read after each job.
        ours = settings.engine_args.get("worker_extension_cls") in (None, EXTENSION)
        self._encoder_counts_wanted = ours
        # Adapter loads (vllm activate_adapter / _load_adapter, counted by our extension).
        self._adapter_loads_wanted = ours and settings.lora_enabled
        self._engine_counts_task: asyncio.Task | None = None
        self._engine_counts_again = False
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
            self._loop.call_soon_threadsafe(self._refresh_engine_counts)

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

    # ---- adapters (loop thread) --------------------------------------------------------------
    async def add_lora(self, adapter: Adapter) -> None:
        """Load an adapter version into the engine's cache; raises the engine's error if it
        refuses it (its checks run here, where a failure does not stop the engine)."""
        call = self.engine.add_lora(adapter.to_lora_request())
        await self._ask_engine("add_lora", call, LOAD_TIMEOUT_S)

    async def remove_lora(self, int_id: int) -> None:
        await self._ask_engine("remove_lora", self.engine.remove_lora(int_id), QUERY_TIMEOUT_S)

    async def pin_lora(self, int_id: int) -> None:
        """Keep an added adapter in the engine's adapter cache (adapters.pinning)."""
        call = self.engine.collective_rpc(PIN_METHOD, args=(int_id,))
        await self._ask_engine("pin", call, QUERY_TIMEOUT_S)

    async def lora_state(self) -> tuple[set[int], set[int]]:
        """(ids in the engine's LoRA slots, ids in its adapter cache)."""
        call = self.engine.list_loras()
        cached = set(await self._ask_engine("list_loras", call, QUERY_TIMEOUT_S))
        slots: set[int] = set()
        if self._slot_ids_available:
            try:
                call = self.engine.collective_rpc(SLOT_IDS_METHOD)
                for worker_ids in await self._ask_engine("slot listing", call, QUERY_TIMEOUT_S):
                    slots.update(worker_ids)
            except EngineUnavailable:
                raise
            except Exception as err:  # another worker extension in model.json: cache only
                self._slot_ids_available = False
                self._log(f"adapter slots cannot be listed ({err!r}); listing the cache only")
        return slots & cached, cached

    def _refresh_engine_counts(self) -> None:
        """Read the engine's encoder counts and adapter loads in the background (one read at a
        time; asked during a read, one more read follows it, so the last job is counted)."""
        if self._engine is None or not (self._encoder_counts_wanted or self._adapter_loads_wanted):
            return
        if self._engine_counts_task is not None and not self._engine_counts_task.done():
            self._engine_counts_again = True
            return
        self._engine_counts_again = False

        async def ask(method: str, what: str) -> dict | None:
            try:
                call = self.engine.collective_rpc(method)
                return (await self._ask_engine(what, call, QUERY_TIMEOUT_S))[0]
            except Exception:  # no extension, or the engine is going: stop asking
                return None

        async def read() -> None:
            if self._adapter_loads_wanted:
                loads = await ask(ADAPTER_LOADS_METHOD, "adapter loads")
                if not loads:
                    self._adapter_loads_wanted = False
                else:
                    self._metrics.record(AdapterLoads(loads["slot_loads"], loads["cache_loads"]))
            if self._encoder_counts_wanted:
                counts = await ask(ENCODER_COUNTS_METHOD, "encoder counts")
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

        def again(_task) -> None:
            if self._engine_counts_again and not self._closing:
                self._refresh_engine_counts()

        self._engine_counts_task = asyncio.ensure_future(read())
        self._engine_counts_task.add_done_callback(again)

    async def _ask_engine(self, what: str, call: Coroutine, timeout_s: float):
        """An engine utility call, bounded: one sent as the engine dies is never answered."""
        try:
            return await asyncio.wait_for(call, timeout_s)
        except TimeoutError:
            raise EngineUnavailable(
                f"the engine did not answer {what} within {timeout_s:g} s"
            ) from None

    async def _take_alignment(self, key: str) -> dict:
        """What the engine captured for the request flagged `key` (the worker extension's
        ALIGNMENT_METHOD; an error entry when it has none)."""
        call = self.engine.collective_rpc(ALIGNMENT_METHOD, args=(key,))
        try:
            return (await self._ask_engine("the word alignment", call, QUERY_TIMEOUT_S))[0]
        except EngineUnavailable:
            raise
        except Exception as err:  # no worker extension (model.json names another one)
            return {"error": f"the engine cannot hand back word alignments ({err})"}

    # ---- generation (loop thread) ------------------------------------------------------------
    async def generate(
        self,
        job: GenerationJob,
        *,
        stream: bool,
        is_cancelled=lambda: False,
        timeout_s: float | None = None,
    ) -> AsyncIterator[GenerationChunk]:
        """Yield chunks for one job; the last one has finish_reason set.

        The job ends with RequestCancelled once `is_cancelled()` says so, and with
        RequestTimedOut after `timeout_s` (at most serving.request_timeout_s): all of its
        engine requests are aborted then."""
        meter = JobMeter(adapter=BASE_LABEL if job.adapter is None else job.adapter.name)
        outcome = ERROR
        limit = self.settings.serving.request_timeout_s
        timeout_s = min(timeout_s, limit) if timeout_s else limit
        with self._inflight_lock:
            self._inflight += 1
        try:
            async with JobGuard(timeout_s, is_cancelled, self.settings.serving.cancel_poll_s):
                with self._leases.lease(job.adapter) as adapter:
                    job.adapter = adapter  # the version it runs on (a replaced one gives way)
                    async for chunk in self._run(job, stream, meter):
                        yield chunk
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
                self._refresh_engine_counts()

    async def _run(
        self, job: GenerationJob, stream: bool, meter: JobMeter
    ) -> AsyncIterator[GenerationChunk]:
        if job.prepare is not None:
            await job.prepare(
                job,
                lambda prompt, sampling: self._generate_once(prompt, sampling, job.adapter, meter),
            )

        def stream_one(prompt, sampling):
            return self._stream(
                prompt,
                sampling,
                job.adapter,
                stream=stream,
                meter=meter,
            )

        if job.decode is not None:
            chunks = job.decode(job, stream_one)
        else:
            chunks = stream_one(job.prompt, job.sampling)
        async for chunk in chunks:
            yield chunk

    async def _generate_once(
        self, prompt: Any, sampling: dict[str, Any], adapter=None, meter: JobMeter | None = None
    ) -> GenerationChunk:
        """A preparing request (Whisper's language detection): counted, but not as the job's
        first token."""
        last = None
        async for chunk in self._stream(
            prompt, sampling, adapter, stream=False, meter=meter, first_token=False
        ):
            last = chunk
        assert last is not None
        return last

    async def _stream(
        self,
        prompt,
        sampling,
        adapter,
        *,
        stream: bool,
        meter: JobMeter | None = None,
        first_token: bool = True,
    ) -> AsyncIterator[GenerationChunk]:
        from vllm import SamplingParams
        from vllm.exceptions import VLLMClientError
        from vllm.sampling_params import RequestOutputKind

        engine = self.engine
        request_id = f"req-{next(self._request_ids)}"
        lora_request = adapter.to_lora_request() if adapter is not None else None
        sent_chars = 0
        finished = False
        submitted = time.monotonic()
        first_token_s = None
        counts = (0, 0)  # prompt, generated tokens so far
        try:
            sampling = dict(sampling)
            final_only = sampling.pop(FINAL_ONLY, False)  # popped whatever `stream` says
            alignment_key = _alignment_key(sampling)
            live = stream and not final_only
            params = SamplingParams(
                **_with_structured_outputs(sampling),
                output_kind=RequestOutputKind.CUMULATIVE if live else RequestOutputKind.FINAL_ONLY,
            )
            async for output in engine.generate(
                prompt, params, request_id, lora_request=lora_request
            ):
                completion = output.outputs[0]
                text = completion.text
                chunk = GenerationChunk(
                    text=text,
                    delta=text[sent_chars:],
                    token_ids=list(completion.token_ids),
                    logprobs=_chosen_logprobs(completion),
                    num_prompt_tokens=len(output.prompt_token_ids or []),
                    finish_reason=(completion.finish_reason or "stop") if output.finished else None,
                    cumulative_logprob=completion.cumulative_logprob,
                    top_logprobs=completion.logprobs,
                )
                sent_chars = len(text)
                finished = output.finished
                counts = (chunk.num_prompt_tokens, chunk.num_output_tokens)
                if finished and alignment_key is not None:
                    chunk.alignment = await self._take_alignment(alignment_key)
                if first_token_s is None and chunk.token_ids:
                    first_token_s = _first_token_latency(output, submitted)
                yield chunk
        except ServingError:
            raise
        except asyncio.CancelledError:
            raise
        except (ValueError, VLLMClientError) as err:  # vLLM's input checks (prompt too long, ...)
            raise _invalid(err) from None
        except Exception as err:
            if self._engine is not None and self._engine.errored:
                # vLLM raises one error object in every request: keep no frames of ours on it.
                err.with_traceback(None)
                raise EngineUnavailable(f"the engine has failed: {err}") from None
            raise
        finally:
            if meter is not None:
                meter.engine_request_done(
                    submitted=submitted,
                    prompt_tokens=counts[0],
                    generation_tokens=counts[1],
                    first_token_s=first_token_s if first_token else None,
                )
            if not finished:
                await engine.abort(request_id)


def _alignment_key(sampling: dict[str, Any]) -> str | None:
    flag = (sampling.get("extra_args") or {}).get(ALIGNMENT_EXTRA_ARG)
    return None if not flag else str(flag["key"])


def _first_token_latency(output, submitted: float) -> float:
    """vLLM's own time from arrival to first token when it kept statistics (a non-streamed
    request's first output is its last), else the time this output reached us."""
    latency = getattr(getattr(output, "metrics", None), "first_token_latency", 0.0)
    return latency if latency and latency > 0 else time.monotonic() - submitted


def _with_structured_outputs(sampling: dict[str, Any]) -> dict[str, Any]:
    """sampling.py checks `structured_outputs` as a plain dict; vLLM takes its own type."""
    constraint = sampling.get("structured_outputs")
    if not isinstance(constraint, dict):
        return sampling
    from vllm.sampling_params import StructuredOutputsParams

    return {**sampling, "structured_outputs": StructuredOutputsParams(**constraint)}


def _chosen_logprobs(completion) -> list[float]:
    if not completion.logprobs:
        return []
    return [
        step[token].logprob
        for step, token in zip(completion.logprobs, completion.token_ids, strict=False)
    ]


def _invalid(err: Exception) -> ServingError:
    from lora_serving.errors import InvalidRequest

    return InvalidRequest(str(err))
