"""EngineHost owns one vLLM AsyncLLM and the asyncio loop thread it runs on.

Triton calls `execute` on its own thread; everything touching the engine runs on the loop thread
via `submit`. Start-up errors surface in `start()` (the model then fails to load with the real
error), and `close()` stops the engine processes so no EngineCore outlives the model.
"""

import asyncio
import concurrent.futures
import itertools
import os
import threading
from collections.abc import AsyncIterator, Coroutine
from typing import Any

from lora_serving.errors import EngineUnavailable, RequestCancelled, ServingError
from lora_serving.jobs import GenerationChunk, GenerationJob
from lora_serving.settings import EngineSettings


class EngineHost:
    def __init__(self, settings: EngineSettings, *, log=print):
        self.settings = settings
        self._log = log
        self._loop = asyncio.new_event_loop()
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

    async def _create_engine(self):
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        args = AsyncEngineArgs(**self.settings.engine_args)
        return AsyncLLM.from_engine_args(args)

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

    def tokenizer(self):
        return self.engine.get_tokenizer()

    def submit(self, coroutine: Coroutine) -> concurrent.futures.Future:
        """Run a coroutine on the engine loop (callable from any thread)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

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
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)

    # ---- generation (loop thread) ------------------------------------------------------------
    async def generate(
        self, job: GenerationJob, *, stream: bool, is_cancelled=lambda: False
    ) -> AsyncIterator[GenerationChunk]:
        """Yield chunks for one job; the last one has finish_reason set."""
        with self._inflight_lock:
            self._inflight += 1
        try:
            if job.prepare is not None:
                await job.prepare(
                    job, lambda prompt, sampling: self._generate_once(prompt, sampling, job.adapter)
                )
            if job.decode is not None:
                chunks = job.decode(
                    job,
                    lambda prompt, sampling: self._stream(
                        prompt, sampling, job.adapter, stream=stream, is_cancelled=is_cancelled
                    ),
                )
            else:
                chunks = self._stream(
                    job.prompt, job.sampling, job.adapter, stream=stream, is_cancelled=is_cancelled
                )
            async for chunk in chunks:
                yield chunk
        finally:
            with self._inflight_lock:
                self._inflight -= 1

    async def _generate_once(
        self, prompt: Any, sampling: dict[str, Any], adapter=None
    ) -> GenerationChunk:
        last = None
        async for chunk in self._stream(prompt, sampling, adapter, stream=False):
            last = chunk
        assert last is not None
        return last

    async def _stream(
        self, prompt, sampling, adapter, *, stream: bool, is_cancelled=lambda: False
    ) -> AsyncIterator[GenerationChunk]:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        engine = self.engine
        params = SamplingParams(
            **sampling,
            output_kind=RequestOutputKind.CUMULATIVE if stream else RequestOutputKind.FINAL_ONLY,
        )
        request_id = f"req-{next(self._request_ids)}"
        lora_request = adapter.to_lora_request() if adapter is not None else None
        sent_chars = 0
        finished = False
        try:
            async with asyncio.timeout(self.settings.serving.request_timeout_s):
                async for output in engine.generate(
                    prompt, params, request_id, lora_request=lora_request
                ):
                    if is_cancelled():
                        raise RequestCancelled("request cancelled by the client")
                    completion = output.outputs[0]
                    text = completion.text
                    chunk = GenerationChunk(
                        text=text,
                        delta=text[sent_chars:],
                        token_ids=list(completion.token_ids),
                        logprobs=_chosen_logprobs(completion),
                        num_prompt_tokens=len(output.prompt_token_ids or []),
                        finish_reason=(completion.finish_reason or "stop")
                        if output.finished
                        else None,
                    )
                    sent_chars = len(text)
                    finished = output.finished
                    yield chunk
        except TimeoutError:
            raise EngineUnavailable(
                f"request exceeded the {self.settings.serving.request_timeout_s:g} s timeout"
            ) from None
        except ServingError:
            raise
        except asyncio.CancelledError:
            raise
        except ValueError as err:  # vLLM's input validation (prompt too long, ...)
            raise _invalid(err) from None
        except Exception as err:
            if self._engine is not None and self._engine.errored:
                raise EngineUnavailable(f"the engine has failed: {err}") from err
            raise
        finally:
            if not finished:
                await engine.abort(request_id)


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
