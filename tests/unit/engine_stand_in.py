"""A stand-in for the narrow engine interface (jobs.EngineSession), answered by test functions.

It tests our own job logic only (prompts, window order, stitching, VAD); outputs against the real
engine are the engine and e2e tests' part.
"""

import asyncio

from lora_serving.jobs import GenerationChunk


class StandInEngine:
    """`stream(prompt, sampling)` is an async generator function, `generate(prompt, sampling)`
    a coroutine function; a call the test did not expect fails it."""

    def __init__(self, stream=None, generate=None):
        self._stream = stream
        self._generate = generate
        self.final_only: list[bool] = []  # per stream call, in order

    def stream(self, prompt, sampling, *, final_only: bool = False):
        assert self._stream is not None, "the job streamed an engine request"
        self.final_only.append(final_only)
        return self._stream(prompt, sampling)

    async def generate(self, prompt, sampling) -> GenerationChunk:
        assert self._generate is not None, "the job made a preparing engine request"
        return await self._generate(prompt, sampling)


def run_job(job, stream=None, generate=None) -> list[GenerationChunk]:
    """All chunks of `job.run` against a StandInEngine."""

    async def collect():
        return [chunk async for chunk in job.run(StandInEngine(stream, generate))]

    return asyncio.run(collect())
