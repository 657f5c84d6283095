"""What crosses between a task and the engine: the task's jobs drive the engine, chunks come back.

A task turns a request into a RequestPlan: one job per batch row. A job holds its own typed state
and runs itself against an EngineSession, the narrow engine interface (stream or generate one
engine request), which the engine host binds to the job's adapter, streaming mode, cancellation
and metering. The engine never calls into a task.
"""

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from lora_serving.adapters.catalog import Adapter


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


class EngineSession(Protocol):
    """One job's view of the engine (engine/engine_session.py): each call is one engine request
    with the job's adapter; cancelling the job aborts it."""

    def stream(
        self, prompt: Any, sampling: dict[str, Any], *, final_only: bool = False
    ) -> AsyncIterator[GenerationChunk]:
        """The request's chunks, live when the job streams; `final_only`: the last chunk only
        whatever the job does (Whisper's sampled retries: nothing of them is sent live)."""
        ...

    async def generate(self, prompt: Any, sampling: dict[str, Any]) -> GenerationChunk:
        """A request that prepares the job's output (Whisper's language detection): its last
        chunk; not counted as the job's first token."""
        ...


class Job(Protocol):
    """One batch row: the adapter it asked for, and how it runs."""

    adapter: Adapter | None

    def run(self, engine: EngineSession) -> AsyncIterator[GenerationChunk]:
        """The row's chunks; the last one has finish_reason set."""
        ...


@dataclass
class RequestPlan:
    """All jobs of one Triton request and how to answer it."""

    jobs: list[Job]
    stream: bool


@dataclass
class SentTokens:
    """How many generated tokens earlier streamed responses of a job carried."""

    count: int = 0
