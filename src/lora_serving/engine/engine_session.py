"""One job's narrow view of the engine (jobs.EngineSession): the only caller of AsyncLLM.generate.

EngineHost.session() opens a JobSession for a job: bound to the adapter version the job runs on,
to whether it streams, and to the job's meter. Each `stream` / `generate` call is one engine
request: sampling kwargs -> vLLM SamplingParams, vLLM's outputs -> GenerationChunk, aborted in
the engine when the job is cancelled or fails; vLLM's input checks become InvalidRequest and a
dead engine EngineUnavailable.
"""

import asyncio
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from lora_serving.adapters.catalog import Adapter
from lora_serving.engine.engine_calls import QUERY_TIMEOUT_S, ask_engine
from lora_serving.engine.lora_slots import ALIGNMENT_METHOD
from lora_serving.errors import EngineUnavailable, InvalidRequest, ServingError
from lora_serving.jobs import GenerationChunk
from lora_serving.metrics import JobMeter
from lora_serving.vllm_plugin.whisper_alignment import EXTRA_ARG as ALIGNMENT_EXTRA_ARG

if TYPE_CHECKING:
    from lora_serving.engine.engine_host import EngineHost


class JobSession:
    """jobs.EngineSession for one job on one EngineHost."""

    def __init__(self, host: "EngineHost", adapter: Adapter | None, *, live: bool, meter: JobMeter):
        self._host = host
        self.adapter = adapter  # the version the job runs on
        self._live = live
        self._meter = meter

    def stream(
        self, prompt: Any, sampling: dict[str, Any], *, final_only: bool = False
    ) -> AsyncIterator[GenerationChunk]:
        return self._request(prompt, sampling, live=self._live and not final_only)

    async def generate(self, prompt: Any, sampling: dict[str, Any]) -> GenerationChunk:
        last = None
        async for chunk in self._request(prompt, sampling, live=False, first_token=False):
            last = chunk
        assert last is not None
        return last

    async def _request(
        self, prompt, sampling: dict[str, Any], *, live: bool, first_token: bool = True
    ) -> AsyncIterator[GenerationChunk]:
        from vllm import SamplingParams
        from vllm.exceptions import VLLMClientError
        from vllm.sampling_params import RequestOutputKind

        engine = self._host.engine
        request_id = self._host.new_request_id()
        lora_request = self.adapter.to_lora_request() if self.adapter is not None else None
        sent_chars = 0
        finished = False
        submitted = time.monotonic()
        first_token_s = None
        counts = (0, 0)  # prompt, generated tokens so far
        try:
            alignment_key = _alignment_key(sampling)
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
            raise InvalidRequest(str(err)) from None
        except Exception as err:
            if self._host.engine_failed():
                # vLLM raises one error object in every request: keep no frames of ours on it.
                err.with_traceback(None)
                raise EngineUnavailable(f"the engine has failed: {err}") from None
            raise
        finally:
            self._meter.engine_request_done(
                submitted=submitted,
                prompt_tokens=counts[0],
                generation_tokens=counts[1],
                first_token_s=first_token_s if first_token else None,
            )
            if not finished:
                await engine.abort(request_id)

    async def _take_alignment(self, key: str) -> dict:
        """What the engine captured for the request flagged `key` (the worker extension's
        ALIGNMENT_METHOD; an error entry when it has none)."""
        call = self._host.engine.collective_rpc(ALIGNMENT_METHOD, args=(key,))
        try:
            return (await ask_engine("the word alignment", call, QUERY_TIMEOUT_S))[0]
        except EngineUnavailable:
            raise
        except Exception as err:  # no worker extension (model.json names another one)
            return {"error": f"the engine cannot hand back word alignments ({err})"}


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
