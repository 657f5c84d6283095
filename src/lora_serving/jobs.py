"""What crosses from request decoding to the engine and back: jobs in, chunks out."""

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lora_serving.adapters.catalog import Adapter


@dataclass
class GenerationJob:
    """One prompt for the engine: one batch row of one Triton request."""

    prompt: Any  # a vLLM prompt (dict form)
    sampling: dict[str, Any]  # SamplingParams keyword arguments
    adapter: Adapter | None
    # Runs on the engine loop before generation and may rewrite `prompt` / `context`
    # (Whisper: detect the language with a one-token generation, then build the real prompt).
    prepare: Callable[["GenerationJob", "Generate"], Awaitable[None]] | None = None
    # Replaces the job's single engine request when one row needs several (Whisper: one per
    # 30 s window): given the engine's stream function, it yields the row's stitched chunks.
    decode: Callable[["GenerationJob", "Stream"], AsyncIterator["GenerationChunk"]] | None = None
    context: dict[str, Any] = field(default_factory=dict)  # task data used to render outputs


@dataclass
class RequestPlan:
    """All jobs of one Triton request and how to answer it."""

    jobs: list[GenerationJob]
    stream: bool


@dataclass
class GenerationChunk:
    """Engine progress for one job: the text so far, plus the newly decoded part."""

    text: str
    delta: str
    token_ids: list[int]
    logprobs: list[float]
    num_prompt_tokens: int
    finish_reason: str | None = None  # set on the last chunk
    # When the request asked for logprobs: their sum, and per generated token vLLM's
    # {token id: Logprob(logprob, rank, decoded_token)} of the top tokens (plus the chosen one).
    cumulative_logprob: float | None = None
    top_logprobs: Sequence[Mapping[int, Any]] | None = None
    # A request flagged for Whisper's alignment heads (vllm_plugin.whisper_alignment): what the
    # engine captured, on the last chunk.
    alignment: dict[str, Any] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids)


# A one-shot generation used by `GenerationJob.prepare`: (prompt, sampling kwargs) -> final chunk.
Generate = Callable[[Any, dict[str, Any]], Awaitable[GenerationChunk]]
# A key of a Stream call's sampling dict, not a SamplingParams field: true asks for the final
# chunk only, even when the job streams (Whisper's sampled retries: nothing of them is sent live).
FINAL_ONLY = "final_only"
# The engine's stream for `GenerationJob.decode`: (prompt, sampling kwargs) -> chunks of one
# engine request, with the job's adapter, streaming mode and cancellation already bound.
Stream = Callable[[Any, dict[str, Any]], AsyncIterator[GenerationChunk]]
